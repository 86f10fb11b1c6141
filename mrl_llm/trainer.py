"""The single-process mutual-RL loop: N policies, one exchange, the core's regimes, metrics, checkpoints.

Each step (all policies see the same ``prompts_per_step`` prompts)::

    problems = data_cursor.next_batch()
    for each policy: actor.generate(problems, step)        # sample G, score, publish to the exchange
    for each policy: actor.train(step, prompt_ids, ...)    # fetch -> plan (core) -> rows -> THL -> update

through :class:`mrl_llm.distributed.actors.PolicyActor` — the same step logic the Ray driver runs —
with :mod:`mrl_llm.worker` as the policy worker, over a :class:`~shared_interfaces.exchange.DiskLogExchange`
in ``DIR/exchange.jsonl``. Evaluation (:mod:`mrl_llm.evaluate`) runs before training, every
``eval.every`` steps and at the end; checkpoints (:mod:`mrl_llm.runstate`) every ``checkpoint_every``
steps and at the end. Outputs: ``metrics.jsonl``, ``eval.jsonl``, ``summary.json``, ``policies/<name>/``
(final HF model directories) and TensorBoard events when tensorboard is installed.

From Python::

    from mrl_llm.config import load_config
    from mrl_llm.trainer import train
    summary = train(load_config("experiments/configs/tiny_cpu.yaml").with_regime("sgt"), "runs/sgt")

``problems`` / ``eval_problems`` (lists of :class:`mrl_llm.data.Problem`) may be passed instead of the
config's ``data`` / ``eval.data`` sections (e.g. a synthetic task built in code).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from mrl_llm.config import RunConfig
from mrl_llm.data import DataConfig, DataCursor, Problem, load_jsonl
from mrl_llm.distributed.actors import PolicyActor, PolicyActorSpec
from mrl_llm.evaluate import evaluate_workers, peer_exclusive_sets, read_eval_rows, summarize
from mrl_llm.metrics import TIMES, MetricsLog, clean, read_metrics, train_row
from mrl_llm.rollout.base import generation_eos_ids
from mrl_llm.rundir import RESUMABLE_CHANGES, check_run_dir, new_run_guard  # noqa: F401 - re-exported
from mrl_llm.runstate import (
    CheckpointError,
    LogDigest,
    count_lines,
    head_lines,
    lines_digest,
    load_run_state,
    point_latest,
    prune,
    save_run_state,
    truncate_lines,
    verify_checkpoint,
)
from mrl_llm.worker import WorkerConfig
from shared_interfaces.config_io import ConfigError, to_mapping
from shared_interfaces.exchange import DiskLogExchange

log = logging.getLogger("mrl_llm.trainer")

def load_problems(data: DataConfig) -> list[Problem]:
    """A dataset's problems; rows whose gold answer the verifier cannot use are skipped (counted, warned)."""
    from mrl_llm import rewards

    v = rewards.get_verifier(data.verifier, **data.verifier_options())
    try:
        report = load_jsonl(data, check_gold=rewards.gold_checker(v))
    finally:
        rewards.close_verifier(v)
    if report.skipped:
        log.warning("%s", report.summary())
    return list(report.problems)


def resolve_problems(config: RunConfig, problems: Sequence[Problem] | None,
                     eval_problems: Sequence[Problem] | None) -> tuple[list[Problem], list[Problem]]:
    """The run's training problems and its evaluation set (at most ``eval.max_prompts``): the given ones,
    else loaded from the config's ``data`` / ``eval.data`` (evaluation defaults to the training data).
    Before any model loads, the policies' tokenizers and model configs are checked and every prompt must
    fit every policy's ``max_prompt_len`` (:mod:`mrl_llm.preflight`: an error, or skipped and counted
    under the dataset's ``on_malformed: skip``)."""
    from mrl_llm.preflight import check_model_configs, fit_prompts

    if problems is None:
        if config.data is None:
            raise ConfigError("config has no data section; add data: {path: FILE.jsonl, verifier: math}")
        problems = load_problems(config.data)
    tokenizers = check_model_configs(config)
    train_mode = config.data.on_malformed if config.data is not None else "error"
    problems, _ = fit_prompts(config, problems, on_malformed=train_mode, tokenizers=tokenizers,
                              source=config.data.path if config.data is not None else "the training problems")
    if eval_problems is None and config.eval.data is not None:
        eval_problems = load_problems(config.eval.data)
    if eval_problems is None:
        return problems, problems[: config.eval.max_prompts]
    ev = config.eval.data
    eval_set, _ = fit_prompts(config, list(eval_problems)[: config.eval.max_prompts], tokenizers=tokenizers,
                              on_malformed=ev.on_malformed if ev is not None else train_mode,
                              source=ev.path if ev is not None else "the evaluation problems")
    return problems, eval_set


def log_eval(log: MetricsLog, rows: list[dict[str, Any]], names: Sequence[str], t: int, regime: str,
             exclusive: dict[str, set[str]]) -> dict[str, set[str]]:
    """Write evaluation ``t``'s per-prompt ``rows`` to ``eval.jsonl`` and one ``kind: eval`` metrics row per
    policy of ``names``; returns the peer-exclusive prompt sets (measured at t = 0, else ``exclusive``).
    Both runtimes call it, so their evaluation output cannot drift apart."""
    if t == 0:
        exclusive = peer_exclusive_sets(rows)
    log.eval_rows(rows)
    summ = summarize(rows, exclusive)
    log.metrics([{"kind": "eval", "step": t, "policy": n, "regime": regime, **summ.get(n, {})} for n in names])
    return exclusive


def unique_prompts(batch: Sequence[Problem]) -> list[Problem]:
    """The batch without repeated prompt ids (a batch that spans two epochs can draw a prompt twice; a
    prompt is one group of the exchange, so its second draw is dropped, with a log line)."""
    seen: set[str] = set()
    out = [p for p in batch if not (str(p.prompt_id) in seen or seen.add(str(p.prompt_id)))]
    if len(out) < len(batch):
        log.info("dropped %d repeated prompt(s) from a batch spanning an epoch boundary", len(batch) - len(out))
    return out


def verifier_options(config: RunConfig) -> dict[str, dict[str, Any]]:
    """Verifier constructor options by verifier name, from the ``data`` and ``eval.data`` sections; two
    sections that configure one verifier differently are an error naming the keys."""
    out: dict[str, dict[str, Any]] = {}
    for where, d in (("data", config.data), ("eval.data", config.eval.data)):
        if d is None:
            continue
        opts = d.verifier_options()
        if d.verifier in out and out[d.verifier] != opts:
            diff = sorted(k for k in opts if opts[k] != out[d.verifier].get(k))
            raise ConfigError(f"{where} configures verifier {d.verifier!r} with {diff} different from data "
                              f"({ {k: out[d.verifier][k] for k in diff} } vs { {k: opts[k] for k in diff} }); "
                              "a run scores with one setting per verifier: make them equal")
        out[d.verifier] = opts
    return out


def worker_config(config: RunConfig, name: str) -> dict[str, Any]:
    """The plain mapping a policy's worker is built from (also what a Ray actor receives)."""
    pol = config.policy(name)
    toks = tuple(dict.fromkeys(p.tokenizer_path for p in config.policies if p.tokenizer_path))
    eos = {p.name: list(generation_eos_ids(p.model_dir)) for p in config.policies if p.model_dir}
    return to_mapping(WorkerConfig(policy=pol, loss=config.loss, tokenizers=toks,
                                   peer_eos_ids={k: v for k, v in eos.items() if v},
                                   track_ref_kl=config.track_ref_kl, max_nan_steps=config.max_nan_steps,
                                   init_seed=pol.init_seed, verifier_options=verifier_options(config)))


def actor_specs(config: RunConfig, ckpt_root: Path) -> list[PolicyActorSpec]:
    threads = config.threads or torch.get_num_threads()
    return [PolicyActorSpec(name=p.name, factory="mrl_llm.worker:build", config=worker_config(config, p.name),
                            seed=config.seed, regime=dict(config.regime), checkpoint_dir=str(ckpt_root / p.name),
                            checkpoint_every=0, threads=threads)
            for p in config.policies]


class Run:
    """One run directory being trained (see :func:`train`)."""

    def __init__(self, config: RunConfig, out_dir: str | Path, *, resume: bool,
                 problems: Sequence[Problem] | None, eval_problems: Sequence[Problem] | None) -> None:
        self.cfg = config
        self.out = Path(out_dir)
        self.ckpt = self.out / "checkpoints"
        self.regime = config.regime_spec.name
        if config.threads:
            torch.set_num_threads(config.threads)
        self._check_dir(resume)
        state = load_run_state(self.ckpt) if resume else None
        self.out.mkdir(parents=True, exist_ok=True)
        given = problems
        problems, self.eval_problems = resolve_problems(config, problems, eval_problems)
        source = config.data.path if given is None and config.data is not None else "the problems given to train()"
        self.cursor = DataCursor(problems, config.prompts_per_step, seed=config.seed, source=source)
        self.start = 0
        self.ex_digest = LogDigest(self.out / "exchange.jsonl")
        if state is not None:
            self._restore(state)
        else:
            (self.out / "config.json").write_text(json.dumps(to_mapping(config), indent=1))
        self.exchange = DiskLogExchange(self.out / "exchange.jsonl", fsync=config.exchange_fsync)
        for p in config.policies:
            if p.ranks > 1:  # said, not silently dropped: a worker group needs Ray (mrl_llm.distributed.rank_group)
                log.warning("policy %s: ranks %d applies to --runtime ray; the single-process runtime trains it as "
                            "one rank (the same update)", p.name, p.ranks)
        self.actors = {s.name: PolicyActor(s, self.exchange) for s in actor_specs(config, self.ckpt)}
        self.log = MetricsLog(self.out, tensorboard=config.tensorboard)
        self.exclusive = peer_exclusive_sets(r for r in read_eval_rows(self.out / "eval.jsonl") if r["step"] == 0)

    def _check_dir(self, resume: bool) -> None:
        check_run_dir(self.cfg, self.out, resume)
        if resume and not (self.ckpt / "run_state.json").is_file():
            raise FileNotFoundError(f"--resume {self.out}: no checkpoints/run_state.json there; nothing to resume")

    def _restore(self, state: dict) -> None:
        """Verify the checkpoint (exchange digest, dataset, every policy's manifest), then cut the logs back
        to it; nothing in the directory changes when a check fails."""
        s = state.get("step")
        if not isinstance(s, int) or not isinstance(state.get("exchange_lines"), int):
            raise CheckpointError(f"{self.ckpt / 'run_state.json'}: no valid step / exchange_lines; the run state is "
                                  "corrupt")
        ex = self.out / "exchange.jsonl"
        n = int(state["exchange_lines"])
        head = head_lines(ex, n)
        if len(head) < n or lines_digest(head)[1] != state.get("exchange_sha256"):
            raise CheckpointError(f"{ex} was edited: its first {n} lines (up to the checkpoint of step {s}) do not "
                                  "match the digest stored in checkpoints/run_state.json; restore the original log "
                                  "or start a new run directory")
        self.cursor.load_state_dict(state["data_cursor"])
        for p in self.cfg.policies:
            verify_checkpoint(self.ckpt / p.name / f"step_{s}")
        self.start = s + 1
        for p in self.cfg.policies:
            point_latest(self.ckpt / p.name, s)
        truncate_lines(ex, n)
        truncate_lines(self.out / "metrics.jsonl", int(state["metrics_lines"]))
        truncate_lines(self.out / "eval.jsonl", int(state["eval_lines"]))
        self.ex_digest.update()
        log.info("resuming %s after step %d", self.out, s)

    # -- pieces of a step --------------------------------------------------------------------
    def evaluate(self, t: int) -> None:
        e = self.cfg.eval
        if not e.enabled or not self.eval_problems:
            return
        rows = evaluate_workers({n: a.worker for n, a in self.actors.items()}, self.eval_problems, step=t, k=e.k,
                                temperature=e.temperature, top_p=e.top_p, max_new_tokens=e.max_new_tokens)
        self.exclusive = log_eval(self.log, rows, list(self.actors), t, self.regime, self.exclusive)

    def step(self, s: int) -> list[dict[str, Any]]:
        problems = unique_prompts(self.cursor.next_batch())
        pids = [str(p.prompt_id) for p in problems]
        names = list(self.actors)
        gens = {n: a.generate(problems, s) for n, a in self.actors.items()}
        return [train_row(s, n, self.regime, gens[n], a.train(s, pids, peers=names))
                for n, a in self.actors.items()]

    def checkpoint(self, s: int) -> None:
        for a in self.actors.values():
            a.save(s)
        save_run_state(self.ckpt, {
            "step": s, "data_cursor": self.cursor.state_dict(),
            **dict(zip(("exchange_lines", "exchange_sha256"), self.ex_digest.update(), strict=True)),
            "metrics_lines": count_lines(self.out / "metrics.jsonl"),
            "eval_lines": count_lines(self.out / "eval.jsonl"),
        })
        for p in self.cfg.policies:
            prune(self.ckpt / p.name, self.cfg.keep_checkpoints)

    # -- the loop ------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        from tqdm.auto import tqdm

        cfg = self.cfg
        t_start = time.perf_counter()
        if self.start == 0:
            self.evaluate(0)
        bar = tqdm(range(self.start, cfg.steps), initial=self.start, total=cfg.steps, disable=not cfg.progress,
                   desc=f"{cfg.name or 'train'} [{self.regime}]", unit="step")
        try:
            for s in bar:
                rows = self.step(s)
                self.log.metrics(rows)
                bar.set_postfix({r["policy"]: f"r={r['reward_mean']:.2f}" for r in rows})
                last = s + 1 == cfg.steps
                if last or (cfg.eval.every and (s + 1) % cfg.eval.every == 0):
                    self.evaluate(s + 1)
                if last or (cfg.checkpoint_every and (s + 1) % cfg.checkpoint_every == 0):
                    self.checkpoint(s)
            for n, a in self.actors.items():
                a.worker.export(self.out / "policies" / n)
            summary = self.summary(time.perf_counter() - t_start)
        finally:
            bar.close()
            self.log.close()
            self.exchange.close()
            for a in self.actors.values():
                a.worker.close()
        (self.out / "summary.json").write_text(json.dumps(clean(summary), indent=1, allow_nan=False))
        from mrl_llm.success_matrix import write_run_matrix

        write_run_matrix(self.out)  # success_matrix.json: the run's start, for bandit_sim predict
        return summary

    def summary(self, wall_s: float) -> dict[str, Any]:
        return run_summary(self.cfg, self.out, {n: a.worker.counters for n, a in self.actors.items()}, wall_s)


def run_summary(cfg: RunConfig, out: Path, counters: dict[str, dict[str, float]], wall_s: float) -> dict[str, Any]:
    """``summary.json`` of a run from its ``metrics.jsonl`` and each policy's worker counters."""
    rows = read_metrics(out / "metrics.jsonl")
    regime = cfg.regime_spec.name
    pols = []
    for n, c in counters.items():
        train_rows = [r for r in rows if r["kind"] == "train" and r["policy"] == n]
        evals = [r for r in rows if r["kind"] == "eval" and r["policy"] == n]
        last_t = train_rows[-1] if train_rows else {}
        last_e = evals[-1] if evals else {}
        pols.append({
            "name": n,
            "eval_accuracy": last_e.get("eval_accuracy"), "pass_at_k": last_e.get("pass_at_k"),
            "peer_exclusive_accuracy": last_e.get("peer_exclusive_accuracy"),
            "peer_exclusive_n": last_e.get("peer_exclusive_n"),
            "eval_accuracy_start": evals[0].get("eval_accuracy") if evals else None,
            "kl_to_ref": last_t.get("kl_to_ref"), "entropy": last_t.get("entropy"),
            "reward_mean": last_t.get("reward_mean"),
            "sgt_activations": sum(r.get("sgt_activations") or 0 for r in train_rows),
            "nan_skipped_steps": c.get("nan_skipped_steps", 0.0),
            "compute": {k: c.get(k, 0.0) for k in ("samples", "gen_tokens", "train_tokens", "flops", "optimizer_steps")},
            "time_s": {k: sum(r.get(k) or 0.0 for r in train_rows) for k in TIMES},
            "policy_dir": str(out / "policies" / n),
        })
    return {"name": cfg.name, "regime": regime, "seed": cfg.seed, "steps": cfg.steps, "runtime": cfg.runtime.backend,
            "policies": pols, "wall_s_this_session": wall_s, "out_dir": str(out)}


def train(config: RunConfig, out_dir: str | Path, *, resume: bool = False, problems: Sequence[Problem] | None = None,
          eval_problems: Sequence[Problem] | None = None) -> dict[str, Any]:
    """Train ``config`` into ``out_dir`` (one regime per directory) and return the summary (``summary.json``).

    ``resume=True`` continues the run in ``out_dir`` from its last checkpoint (the config must be the
    run's own, except ``steps``, ``eval``, ``threads``, ``progress`` and ``tensorboard``; the checkpoint's
    files, the exchange log up to it and the dataset must be unedited, see :mod:`mrl_llm.runstate`).
    A new run needs a new or empty ``out_dir`` and leaves nothing there if it fails before its first
    checkpoint (:mod:`mrl_llm.rundir`)."""
    verifier_options(config)  # a conflicting verifier setting fails before anything is written
    if config.runtime.backend == "ray":
        from mrl_llm.distributed.ray_trainer import train_on_ray

        return train_on_ray(config, out_dir, resume=resume, problems=problems, eval_problems=eval_problems)
    with new_run_guard(Path(out_dir), resume):
        return Run(config, out_dir, resume=resume, problems=problems, eval_problems=eval_problems).run()
