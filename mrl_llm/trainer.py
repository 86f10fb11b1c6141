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
from mrl_llm.data import DataCursor, Problem
from mrl_llm.distributed.actors import PolicyActor
from mrl_llm.evaluate import evaluate_workers, peer_exclusive_sets, read_eval_rows
from mrl_llm.metrics import MetricsLog, clean, train_row
from mrl_llm.run_setup import (  # noqa: F401 - re-exported: tests and callers import them from here
    actor_specs,
    load_problems,
    log_eval,
    resolve_problems,
    run_summary,
    unique_prompts,
    verifier_options,
    worker_config,
)
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
from shared_interfaces.config_io import to_mapping
from shared_interfaces.exchange import DiskLogExchange

log = logging.getLogger("mrl_llm.trainer")

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
