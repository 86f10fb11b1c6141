"""A run directory's per-prompt dynamics (:mod:`shared_interfaces.dynamics`): written at the end of every run as
``DIR/dynamics.json``, and extracted from an existing run directory by
``python -m mrl_llm dynamics --run DIR [--out FILE]``.

From the run's ``config.json``, ``eval.jsonl`` and ``metrics.jsonl``: per (policy, evaluation step, prompt) the
sampled ``samples`` / ``successes`` and ``greedy_correct`` of every evaluated prompt; per policy and training
step the sampling ``entropy`` (the train rows; rows the Ray runtime marked rolled back are left out, as every
reader of ``metrics.jsonl`` does); ``run``, the run's identity and settings.

**Skipped evaluation rows** (a prompt the policy could not be scored on) are counted per (policy, step) in
``skipped`` (their cells hold samples 0 and greedy null), logged at a run's end and printed by the command.

**Damage**: ``eval.jsonl`` is read as the success matrix reads it (:func:`mrl_llm.success_matrix.read_run_eval`):
a torn or corrupt line, a missing key, a policy the config does not have, or a second row for one (step, policy,
prompt) is an error naming the file and line. So is a corrupt ``metrics.jsonl`` line, or a second train row for
one (step, policy) (a resumed run cuts ``metrics.jsonl`` back, so a repeat is damage, not data).

**The split** (which evaluated prompts are the RL training pool, ``"train"``; every other one is
``"heldout"``), recorded in ``run.split_from``:

1. at a run's end the runner passes the training problems it resolved (exact);
2. from a run directory: the pool the trainer recorded at the run's start (``problems.json``,
   :mod:`mrl_llm.run_problems`, the success matrix's source of its split too); a run older than that file:
   where the run's problems came from is read from ``summary.json``'s ``data`` (every finished run writes
   it), else ``config.json`` (a run stopped before its end, started from its config):

   a. the evaluation set was taken from the training problems (no ``eval.data``): every prompt is "train";
   b. else the pool is the prompts the run trained on (``exchange.jsonl``), when they are as many as the
      training problems ``summary.json`` counts (the run drew every one: ``steps x prompts_per_step`` covered
      the pool at least once — the demo's and the study's runs do);
   c. else the prompt ids of the training data file (``config.json``'s ``data``, read with its field mapping
      and ``limit``), when the problems came from it and the file is still there.

   Otherwise the run directory does not say which prompts were trained on: an error says why (re-run the run
   to its end, or keep its data file at ``data.path``).

``--out`` may be a directory: the file is written into it as ``dynamics.json``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from mrl_llm.runstate import read_json_object
from mrl_llm.success_matrix import read_run_config, read_run_eval
from shared_interfaces.dynamics import Dynamics, DynamicsError, write_dynamics
from shared_interfaces.success_matrix import SuccessMatrixError

log = logging.getLogger(__name__)

FILE_NAME = "dynamics.json"


def _is_int(v: Any, lo: int = 0) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= lo


def _config(path: Path) -> dict[str, Any]:
    """``config.json`` of a run, checked for what the dynamics read (:func:`mrl_llm.success_matrix.read_run_config`)."""
    return read_run_config(path, DynamicsError)


def run_settings(cfg: dict[str, Any], split_from: str) -> dict[str, Any]:
    """The dynamics' ``run`` (:mod:`shared_interfaces.dynamics`) from a checked ``config.json``."""
    ev = cfg.get("eval") or {}
    return {"name": cfg.get("name"), "seed": int(cfg.get("seed", 0)), "regime": cfg["regime"],
            "steps": int(cfg["steps"]), "prompts_per_step": int(cfg["prompts_per_step"]),
            "group_size": max(int(p.get("group_size", 8)) for p in cfg["policies"]), "eval_k": int(ev.get("k", 4)),
            "loss": cfg.get("loss") or {}, "split_from": split_from}


def _entropy(path: Path, pols: list[str], config: Path) -> tuple[list[int], np.ndarray]:
    """Training steps and ``[P, U]`` entropy (NaN: none) from ``metrics.jsonl``'s train rows (module docstring)."""
    from mrl_llm.metrics import read_metrics

    if not path.is_file():
        raise DynamicsError(f"{path} does not exist; a run with an evaluation writes it beside eval.jsonl (restore "
                            "it, or the run directory is not a complete run)")
    try:
        rows = read_metrics(path)
    except ValueError as err:
        raise DynamicsError(f"{err} (a stopped run's torn last line: train --resume drops it)") from None
    seen: set[tuple[int, str]] = set()
    train = []
    for r in rows:
        if r.get("kind") != "train":
            continue
        step, pol, ent = r.get("step"), r.get("policy"), r.get("entropy")
        where = f"{path}: the train row of step {step!r}, policy {pol!r}"
        if not _is_int(step) or pol not in pols:
            raise DynamicsError(f"{where} is not a step number and one of {config}'s policies ({', '.join(pols)}); "
                                "repair or remove the line")
        if ent is not None and (isinstance(ent, bool) or not isinstance(ent, int | float) or ent < 0):
            raise DynamicsError(f"{where} has entropy {ent!r}, not a number >= 0 or null; repair or remove the line")
        if (step, pol) in seen:
            raise DynamicsError(f"{where} appears twice; a run writes one per step and policy — remove the repeat")
        seen.add((step, pol))
        train.append((step, pol, ent))
    steps = sorted({s for s, _, _ in train})
    col, row = {s: u for u, s in enumerate(steps)}, {p: i for i, p in enumerate(pols)}
    out = np.full((len(pols), len(steps)), np.nan)
    for s, p, ent in train:
        if ent is not None and np.isfinite(ent):  # (a non-finite value: null, as metrics.jsonl writes it)
            out[row[p], col[s]] = float(ent)
    return steps, out


def _trained_prompts(path: Path) -> set[str]:
    """The prompt ids of ``exchange.jsonl``'s records (the prompts the run trained on)."""
    ids: set[str] = set()
    if not path.is_file():
        return ids
    with open(path, encoding="utf-8") as fh:
        for k, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                ids.add(str(json.loads(line)["prompt_id"]))
            except (ValueError, KeyError, TypeError):
                raise DynamicsError(f"{path}, line {k}: not an exchange record with a prompt_id; the run's exchange "
                                    "log is damaged (restore it from a copy of the run)") from None
    return ids


def _data_file_ids(data: dict[str, Any], config: Path) -> set[str] | None:
    """The prompt ids of the training data file ``data`` (config.json's section), or None when it is gone."""
    from mrl_llm.data import DataConfig, load_jsonl
    from shared_interfaces.config_io import from_mapping

    if not isinstance(data.get("path"), str) or not Path(data["path"]).is_file():
        return None
    try:
        report = load_jsonl(from_mapping(DataConfig, data, where=f"{config}: data"))
    except ValueError as err:  # ConfigError, DataError
        raise DynamicsError(f"{config}: the training data {data['path']} cannot be read ({err}); fix or restore it"
                            ) from None
    return {str(p.prompt_id) for p in report.problems}


def training_pool(d: Path, cfg: dict[str, Any]) -> tuple[set[str] | None, str]:
    """``(pool, how)`` of run directory ``d`` (module docstring, 2): the training prompt ids, or None when every
    evaluated prompt is one; ``how`` says how it was decided. :class:`DynamicsError` when it cannot be."""
    from mrl_llm.run_problems import FILE_NAME as PROBLEMS
    from mrl_llm.run_problems import read_run_problems
    from mrl_llm.run_setup import EVAL_ON_TRAINING

    recorded = read_run_problems(d)  # what the trainer records at a run's start: the one source when present
    if recorded is not None:
        return recorded[0], f"the {len(recorded[0])} prompts of its training pool ({PROBLEMS})"
    summary = d / "summary.json"
    data = read_json_object(summary, "the run writes it at its end", DynamicsError).get("data") \
        if summary.is_file() else None
    ok = isinstance(data, dict) and all(isinstance(data.get(k), dict) for k in ("train", "eval"))
    if ok:
        if data["eval"].get("source") == EVAL_ON_TRAINING:
            return None, "evaluated on its training problems (summary.json data.eval)"
        train_src, n_train = data["train"].get("source"), data["train"].get("problems")
    else:
        if cfg.get("data") is not None and (cfg.get("eval") or {}).get("data") is None:
            return None, "evaluated on its training problems (config.json: data, no eval.data)"
        train_src, n_train = None, None
    exchange = d / "exchange.jsonl"
    drawn = _trained_prompts(exchange) if n_train is not None else set()
    if n_train is not None and len(drawn) == n_train:
        return drawn, f"the {n_train} prompts it trained on (exchange.jsonl), all of its training problems (summary.json)"
    data_cfg = cfg.get("data")
    from_file = data_cfg is not None and (train_src is None or train_src == data_cfg.get("path"))
    if from_file:
        ids = _data_file_ids(data_cfg, d / "config.json")
        if ids is not None:
            return ids, f"the prompts of its training data {data_cfg['path']} (config.json data)"
    if n_train is None:
        why = "it has no summary.json (stopped before its end)"
    elif not exchange.is_file():
        why = "its exchange.jsonl (the prompts it trained on) is gone"
    else:
        why = f"it trained on {len(drawn)} of its {n_train} training prompts (less than one pass over them)"
    data_note = (f", and its training data {data_cfg.get('path')!r} (config.json data.path) is not there to read"
                 if from_file else "")
    fix = ("run it to its end (train --resume), which writes dynamics.json with the training problems it used"
           if n_train is None else f"use the {FILE_NAME} the run wrote at its end (it has the split)")
    raise DynamicsError(f"{d}: cannot tell its training prompts from its held-out ones: {why}{data_note}; {fix}")


def dynamics_from_run(run_dir: str | Path, *, train_prompts: Sequence[str] | None = None) -> Dynamics:
    """The dynamics of one run directory (module docstring); ``train_prompts``: the run's training prompt ids (at
    its end, from the runner), else decided from the directory (:func:`training_pool`)."""
    d = Path(run_dir)
    cfg_path, ev_path = d / "config.json", d / "eval.jsonl"
    if not cfg_path.is_file() or not ev_path.is_file():
        raise DynamicsError(f"{d} is not a run directory with an evaluation (it needs config.json and eval.jsonl)")
    cfg = _config(cfg_path)
    pols = [p["name"] for p in cfg["policies"]]
    try:
        rows = read_run_eval(ev_path, pols, cfg_path)
    except SuccessMatrixError as err:
        raise DynamicsError(str(err)) from None
    steps = sorted({int(r["step"]) for r in rows})
    if not steps or steps[0] != 0:
        raise DynamicsError(f"{ev_path} has no step-0 evaluation; the dynamics start at the run's start (keep eval "
                            "enabled)")
    ent_steps, ent = _entropy(d / "metrics.jsonl", pols, cfg_path)
    if train_prompts is not None:
        pool, how = {str(p) for p in train_prompts}, "the training problems the run resolved (at its end)"
    else:
        pool, how = training_pool(d, cfg)
    prompts = sorted({str(r["prompt_id"]) for r in rows})
    row, col, at = {p: i for i, p in enumerate(pols)}, {p: c for c, p in enumerate(prompts)}, {s: t for t, s in
                                                                                              enumerate(steps)}
    shape = (len(pols), len(steps), len(prompts))
    n, s = np.zeros(shape, dtype=np.int64), np.zeros(shape, dtype=np.int64)
    g = np.full(shape, np.nan)
    skipped = np.zeros(shape[:2], dtype=np.int64)
    fam: dict[str, str] = {}
    for r in rows:
        i, t, c = row[r["policy"]], at[int(r["step"])], col[str(r["prompt_id"])]
        if r.get("family") is not None:
            fam[str(r["prompt_id"])] = str(r["family"])
        if r["skipped"]:
            skipped[i, t] += 1
            continue
        n[i, t, c], s[i, t, c], g[i, t, c] = int(r["samples"]), int(r["successes"]), float(bool(r["greedy_correct"]))
    return Dynamics(
        policies=tuple(pols), prompts=tuple(prompts),
        split=tuple("train" if pool is None or p in pool else "heldout" for p in prompts),
        steps=np.array(steps), samples=n, successes=s, greedy_correct=g, skipped=skipped,
        entropy_steps=np.array(ent_steps, dtype=np.int64), entropy=ent, run=run_settings(cfg, how),
        families=tuple(fam[p] for p in prompts) if len(fam) == len(prompts) else None)


def describe(dyn: Dynamics) -> str:
    """One line: the sizes, the split and the skipped rows."""
    heldout = len(dyn.split_index("heldout"))
    return (f"{len(dyn.policies)} policies, {len(dyn.prompts)} prompts ({len(dyn.prompts) - heldout} train, "
            f"{heldout} held-out; split: {dyn.run['split_from']}), {len(dyn.steps)} evaluations, "
            f"{int(dyn.skipped.sum())} skipped evaluation rows")


def write_run_dynamics(run_dir: str | Path, out: str | Path | None = None, *,
                       train_prompts: Sequence[str] | None = None) -> Path | None:
    """Write ``run_dir``'s dynamics (to ``out``, a file or a directory to write ``dynamics.json`` into,
    :func:`output_path`; default ``run_dir/dynamics.json``). At a run's end (``out`` None) a run with no
    evaluation writes none; one whose dynamics cannot be made says why in the log and returns ``None`` (the run
    itself succeeded); skipped evaluation rows are logged. With ``out`` the error is raised."""
    d = Path(run_dir)
    if out is not None:
        dyn = dynamics_from_run(d, train_prompts=train_prompts)
        return write_dynamics(output_path(out), dyn)
    ev = d / "eval.jsonl"
    if not ev.is_file() or not ev.read_text(encoding="utf-8").strip():
        log.info("no %s written for %s: the run has no evaluation (eval disabled)", FILE_NAME, d)
        return None
    try:
        dyn = dynamics_from_run(d, train_prompts=train_prompts)
    except DynamicsError as e:
        log.warning("no %s written for %s: %s", FILE_NAME, d, e)
        return None
    if dyn.skipped.any():
        log.warning("%s: %d evaluation rows were skipped (recorded as samples 0 in %s, counted in 'skipped')", d,
                    int(dyn.skipped.sum()), FILE_NAME)
    return write_dynamics(d / FILE_NAME, dyn)


def output_path(out: str | Path) -> Path:
    """The file ``--out`` names: ``out`` itself, or ``out/dynamics.json`` when ``out`` is a directory. A path
    under an existing file, or a directory in the way of the file, is an error saying what to pass."""
    from shared_interfaces.out_paths import check_out_file

    p = Path(out)
    if p.is_dir():
        p = p / FILE_NAME
        if p.is_dir():
            raise DynamicsError(f"{p} is a directory; remove it or pass --out FILE")
    check_out_file(p, "--out", example=FILE_NAME)
    return p
