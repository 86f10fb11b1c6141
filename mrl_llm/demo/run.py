"""``python -m mrl_llm demo``: the whole demo, from nothing to a table and a plot, on a CPU.

For each seed: train the two tokenizers (:mod:`mrl_llm.demo.tokenizers`, seed-independent, once),
SFT the two policies on complementary families (:mod:`mrl_llm.demo.sft`), then mutual RL under every
regime from the same SFT'd weights (:func:`mrl_llm.trainer.train`), each run evaluated (greedy + samples)
on its RL pool and the held-out prompts of each family at every evaluation. Layout of ``DIR``::

    tokenizers/{bytebpe,spbpe}/            the two tokenizers
    seed<S>/sft/<policy>/                  SFT'd policies (HF model dirs) + sft.json (their accuracy)
    seed<S>/<regime>/                      one trainer run directory per regime (+ done.json)
    results.json, demo.md, demo.png        per-run numbers, the table, the plot
    report.png, report.md                  learning curves of every run (mrl_llm.report)

The SFTs and runs are independent processes (one torch thread each) on a pool of ``jobs`` workers;
``jobs = 0`` runs everything in this process (tests). A finished step whose recorded settings equal the
requested ones is reused, so ``--seeds 5`` after ``--seeds 3`` in the same ``DIR`` runs two more
seeds; a directory that holds something else is an error. Nothing is read from ``../shared``.

``DIR`` follows ``train --out``'s rules (:func:`check_out_dir`, before any work): a new or empty directory,
or a demo's own — marked by ``mrl-demo.json`` (``{"kind": "demo" | "study"}``, written before anything else;
a directory from before the marker counts by its ``results.json`` / ``study.json``). A file, or a non-empty
directory that is not a demo's (of this kind), is refused: nothing of a user's there is overwritten.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import asdict
from pathlib import Path
from typing import Any

from mrl_llm.demo.progress import progress_line
from mrl_llm.demo.results import (
    aggregate,
    change_from_start,
    change_markdown,
    paired_markdown,
    paired_vs,
    plot,
    run_result,
    table_markdown,
)
from mrl_llm.demo.setup import DemoConfig, DemoPolicy, eval_set, heldout_set, rl_pool, run_config

log = logging.getLogger("mrl_llm.demo")


def _quiet(threads: int = 1) -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    torch.set_num_threads(threads)
    logging.getLogger("mrl_llm").setLevel(logging.WARNING)


#: The file that marks a directory as a demo's or a study's (:func:`check_out_dir`).
DIR_MARKER = "mrl-demo.json"
#: What marks a demo's / a study's directory made before :data:`DIR_MARKER` existed.
_OLD_MARKERS = {"demo": "results.json", "study": "study.json"}


def check_out_dir(out: str | Path, kind: str = "demo") -> Path:
    """``out`` as a demo's (``kind``: ``demo`` or ``study``) directory, checked before any work (module docstring);
    a :class:`~shared_interfaces.config_io.ConfigError` saying what to give otherwise."""
    from shared_interfaces.config_io import ConfigError
    from shared_interfaces.out_paths import check_creatable

    if not str(out).strip():
        raise ConfigError(f"--out is empty; give a directory for the {kind}")
    d = Path(out)
    if d.exists() and not d.is_dir():
        raise ConfigError(f"--out {d} is a file, not a directory; choose a new --out directory for the {kind}")
    if d.is_dir() and any(d.iterdir()):
        marker = d / DIR_MARKER
        if marker.is_file():
            try:
                theirs = json.loads(marker.read_text(encoding="utf-8")).get("kind")
            except (OSError, ValueError, AttributeError):
                theirs = None
            if theirs == kind:
                return d
            raise ConfigError(f"--out {d} is {'a ' + theirs if isinstance(theirs, str) else 'an unreadable'} "
                              f"directory ({marker}), not a {kind}'s; choose a new --out directory")
        if (d / _OLD_MARKERS[kind]).is_file():
            return d
        some = sorted(p.name for p in d.iterdir())[:3]
        raise ConfigError(f"--out {d} is not empty (it holds {', '.join(some)}, ...) and is not a {kind} directory "
                          f"(no {DIR_MARKER}); a {kind} needs a new or empty directory or its own earlier one, so "
                          "nothing there is overwritten")
    check_creatable(d, flag="--out", dest=d)
    return d


def _claim(out: Path, kind: str) -> None:
    """Make ``out`` (checked by :func:`check_out_dir`) and mark it as a ``kind``'s directory."""
    out.mkdir(parents=True, exist_ok=True)
    marker = out / DIR_MARKER
    if not marker.is_file():
        marker.write_text(json.dumps({"kind": kind}) + "\n", encoding="utf-8")


def _same(path: Path, settings: dict[str, Any]) -> bool:
    return path.is_file() and json.loads(path.read_text()).get("settings") == json.loads(json.dumps(settings))


def portable_run(mapping: dict[str, Any], out_dir: str | Path) -> dict[str, Any]:
    """``mapping`` as a run's ``done`` file records it: each policy's start (``model_dir``) relative to the run's
    own directory, so that a moved or copied output directory (or another spelling of ``--out``) is reused."""
    d = Path(out_dir).resolve()
    pols = [{**p, "model_dir": os.path.relpath(Path(p["model_dir"]).resolve(), d)} for p in mapping["policies"]]
    return {**mapping, "policies": pols}


def _fresh(d: Path, done: Path) -> None:
    """Make ``d`` empty for a new step: an unfinished one of ours (no ``done`` file) is removed."""
    if d.exists():
        if done.exists():
            raise FileExistsError(f"{d} holds a finished demo step with other settings; use a new --out directory")
        shutil.rmtree(d)


def sft_settings(cfg: DemoConfig, pol: DemoPolicy, seed: int) -> dict[str, Any]:
    """What determines a policy's SFT (recorded with it; a run records those of its start too)."""
    return {"policy": asdict(pol), "sft": asdict(cfg.sft_config(seed, pol)), "max_new_tokens": cfg.max_new_tokens,
            "families": [f if isinstance(f, str) else asdict(f) for f in cfg.families], "eval_max": cfg.sft_eval_max}


# -- the jobs (top-level functions: they run in worker processes) ---------------------------------
def sft_job(cfg: DemoConfig, pol: DemoPolicy, seed: int, tok_dir: str, out_dir: str) -> dict[str, Any]:
    """SFT one policy of one seed into ``out_dir`` (reused when done with the same settings)."""
    from mrl_llm.demo.setup import TEMPLATE
    from mrl_llm.demo.sft import sft_policy
    from mrl_llm.models import load_tokenizer_dir
    from mrl_llm.templates import TemplateConfig

    d = Path(out_dir)
    done = d / "sft.json"
    settings = sft_settings(cfg, pol, seed)
    if _same(done, settings):
        return {**json.loads(done.read_text())["report"], "reused": True}
    _fresh(d, done)
    _quiet()
    rep = sft_policy(name=pol.name, arch=pol.arch, tokenizer=load_tokenizer_dir(tok_dir), task=cfg.task(),
                     families=[pol.family], out_dir=d, size=pol.size, sft=cfg.sft_config(seed, pol),
                     template=TemplateConfig(**TEMPLATE), max_new_tokens=cfg.max_new_tokens,
                     eval_max=cfg.sft_eval_max)
    done.write_text(json.dumps({"settings": settings, "report": rep}, indent=1))
    return rep


def run_job(cfg: DemoConfig, regime: str, seed: int, policy_dirs: dict[str, str], out_dir: str) -> dict[str, Any]:
    """Train one regime of one seed into ``out_dir``, evaluated at every evaluation on the RL pool and the
    held-out prompts (:func:`~mrl_llm.demo.setup.eval_set`); ``done.json`` records its settings, and a run
    done with the same settings is reused."""
    from mrl_llm.config import config_from_mapping
    from mrl_llm.trainer import train

    d = Path(out_dir)
    done = d / "done.json"
    mapping = run_config(cfg, regime, seed, policy_dirs)
    settings = {"run": portable_run(mapping, d), "sft": [sft_settings(cfg, p, seed) for p in cfg.policies],
                "eval": "pool+heldout", "heldout_per_family": cfg.heldout_per_family}
    if _same(done, settings):
        return {"regime": regime, "seed": seed, "reused": True}
    _fresh(d, done)
    _quiet()
    pool = rl_pool(cfg.task(), cfg.pool_per_family, cfg.pool_seed_of(seed))
    t0 = time.perf_counter()
    cpu0 = time.process_time()
    train(config_from_mapping(mapping), d, problems=pool, eval_problems=eval_set(cfg, seed))
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    done.write_text(json.dumps({"settings": settings, "wall_s": wall, "cpu_s": cpu}, indent=1))
    return {"regime": regime, "seed": seed, "wall_s": wall, "cpu_s": cpu}


# -- the driver -----------------------------------------------------------------------------------
class _Inline:
    """A stand-in executor that runs each job at submission (``jobs = 0``)."""

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        f: Future = Future()
        f.set_result(fn(*args))
        return f

    def shutdown(self) -> None:
        pass


def run_demo(cfg: DemoConfig, out: str | Path, *, jobs: int = 5, say: Callable[[str], None] = print,
             progress_every: float = 30.0, run_fn: Callable[..., dict[str, Any]] | None = None,
             finish_fn: Callable[..., dict[str, Any]] | None = None, kind: str = "demo") -> dict[str, Any]:
    """Run the demo into ``out`` (module docstring) and return ``results.json``'s content. While runs are in
    flight, one progress line (steps logged per run, :mod:`mrl_llm.demo.progress`) every ``progress_every`` s.
    ``run_fn`` / ``finish_fn`` replace :func:`run_job` / :func:`finish` (the study's, :mod:`mrl_llm.demo.study`:
    same driver, SFTs and reuse rules; ``run_fn`` must be a top-level function, it runs in worker processes).
    ``out`` is checked first (:func:`check_out_dir`, for ``kind``), before any tokenizer or SFT."""
    run_fn = run_fn or run_job
    finish_fn = finish_fn or finish
    from mrl_llm.demo.tokenizers import save_demo_tokenizers

    out = check_out_dir(out, kind)
    _claim(out, kind)
    t0 = time.perf_counter()
    load0 = os.getloadavg()
    tok_dirs = save_demo_tokenizers(out / "tokenizers", cfg.task(), kinds=tuple(dict.fromkeys(p.tokenizer for p in cfg.policies)))
    say(f"tokenizers: {', '.join(str(d) for d in tok_dirs.values())} ({time.perf_counter() - t0:.1f} s)")
    ex: Any = _Inline() if jobs == 0 else _pool(jobs)
    # one SFT per SFT seed (cfg.sft_seed_of): the runs of every seed that shares it start when it is done
    sft_seeds = list(dict.fromkeys(cfg.sft_seed_of(s) for s in cfg.seed_list))
    sft_dirs = {k: {p.name: out / f"seed{k}" / "sft" / p.name for p in cfg.policies} for k in sft_seeds}
    pending: dict[Future, tuple[str, int, str]] = {}
    reused = 0
    sft_left = {k: len(cfg.policies) for k in sft_seeds}
    sft_reports: dict[int, dict[str, Any]] = {k: {} for k in sft_seeds}
    try:
        for k in sft_seeds:
            for p in cfg.policies:
                f = ex.submit(sft_job, cfg, p, k, str(tok_dirs[p.tokenizer]), str(sft_dirs[k][p.name]))
                pending[f] = ("sft", k, p.name)
        while pending:
            finished, _ = wait(list(pending), timeout=progress_every, return_when=FIRST_COMPLETED)
            if not finished:
                runs = {f"seed{s}/{name}": out / f"seed{s}" / name for kind, s, name in pending.values() if kind == "run"}
                sfts = [f"seed{s}/{name}" for kind, s, name in pending.values() if kind == "sft"]
                say(progress_line(runs, cfg.steps, time.perf_counter() - t0, sfts=sfts))
            for f in finished:
                kind, s, name = pending.pop(f)
                res = f.result()
                reused += bool(res.get("reused"))
                if kind == "sft":
                    sft_reports[s][name] = res
                    acc = " ".join(f"{fam} {a['train']:.2f}/{a['eval']:.2f}" for fam, a in res["accuracy"].items())
                    say(f"[seed {s}] SFT {name}: greedy accuracy train/held-out {acc}"
                        + (" (reused)" if res.get("reused") else f" ({res['train_s']:.0f} s)"))
                    sft_left[s] -= 1
                    if sft_left[s] == 0:
                        dirs = {n: str(d) for n, d in sft_dirs[s].items()}
                        for rs in (x for x in cfg.seed_list if cfg.sft_seed_of(x) == s):
                            for reg in _longest_first(cfg.regimes):
                                g = ex.submit(run_fn, cfg, reg, rs, dirs, str(out / f"seed{rs}" / reg))
                                pending[g] = ("run", rs, reg)
                else:
                    say(f"[seed {s}] {name}: done" + (" (reused)" if res.get("reused") else f" in {res['wall_s']:.0f} s"
                                                       + (f", {res['cpu_s']:.0f} CPU-s" if "cpu_s" in res else "")))
    finally:
        ex.shutdown()
    return finish_fn(cfg, out, wall_s=time.perf_counter() - t0, load=(load0, os.getloadavg()), sft=sft_reports, say=say,
                  reused=reused)


def _pool(jobs: int) -> ProcessPoolExecutor:
    import multiprocessing as mp

    return ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("spawn"))


def _longest_first(regimes: tuple[str, ...]) -> list[str]:
    """PRP runs train on twice the rows: start them first so the pool ends together."""
    from shared_interfaces.regimes import parse_regime

    return sorted(regimes, key=lambda r: 0 if parse_regime(r).uses_peer_samples else 1)


def finish(cfg: DemoConfig, out: Path, *, wall_s: float, load: tuple, sft: dict, say: Callable[[str], None],
           reused: int = 0) -> dict:
    """Read every run back, write ``results.json``, ``demo.md``, ``demo.png`` (and the learning-curve report)."""
    from mrl_llm.report import make_report

    families = {p.name: p.family for p in cfg.policies}
    heldout_ids = {str(p.prompt_id) for p in heldout_set(cfg.task(), None)}
    results = [run_result(out / f"seed{s}" / reg, families, heldout_ids) for s in cfg.seed_list for reg in cfg.regimes]
    pols = [p.name for p in cfg.policies]
    agg = aggregate(results)
    md = table_markdown(agg, cfg.regimes, pols, cfg.seeds)
    md += "\n\n" + change_markdown(change_from_start(results), cfg.regimes)
    if "grpo" in cfg.regimes and len(cfg.regimes) > 1:
        md += "\n\n" + paired_markdown(paired_vs(results), cfg.regimes)
    plot(results, agg, cfg.regimes, pols, out / "demo.png")
    make_report(out)
    header = (f"# mutual-RL demo\n\n{cfg.seeds} seed(s) {cfg.seed_list}, {cfg.steps} RL steps x "
              f"{cfg.prompts_per_step} prompts x G={cfg.group_size}, lr {cfg.lr}, norm layers' lr {cfg.norm_lr}, "
              f"SGT λ {cfg.sgt_weight} (final norm {'in' if cfg.final_norm_sgt else 'out of'} SGT's term); "
              f"this invocation: wall {wall_s:.0f} s on {os.cpu_count()} CPU(s), load average {load[0][0]:.2f} at "
              f"start, {load[1][0]:.2f} at the end; {reused} SFT/run step(s) reused from an earlier invocation.\n\n")
    (out / "demo.md").write_text(header + md + "\n")
    doc = {"config": asdict(cfg), "wall_s": wall_s, "cpus": os.cpu_count(), "reused_steps": reused,
           "loadavg_start": list(load[0]), "loadavg_end": list(load[1]), "sft": {str(k): v for k, v in sft.items()},
           "runs": results}
    (out / "results.json").write_text(json.dumps(doc, indent=1, default=str))
    say(md)
    say(f"table: {out / 'demo.md'}  plot: {out / 'demo.png'}  learning curves: {out / 'report.png'}")
    say(f"wall {wall_s:.0f} s ({reused} step(s) reused); load average {load[0][0]:.2f} -> {load[1][0]:.2f} on "
        f"{os.cpu_count()} CPU(s)")
    return doc
