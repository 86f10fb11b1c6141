"""A run, start to end, on either backend: resume, evaluation, the driver's steps, checkpoints, export, summary.

:func:`run_training` is what :func:`mrl_llm.trainer.train` runs for ``runtime.backend: local`` and
:func:`mrl_llm.distributed.ray_trainer.train_on_ray` for ``ray``; the backend comes from ``start_runtime``
(a context manager giving a :class:`Runtime`: the driver's backend, the policies' actor specs and the
schedule's mode and staleness), everything else is the same code:

1. ``out`` is checked and locked for this process (:mod:`mrl_llm.rundir`: a second run or ``--resume`` on it
   is refused while this one holds it); a new run that fails before its first checkpoint leaves nothing behind. The problems are resolved (:func:`mrl_llm.run_setup.resolve_problems`).
2. ``resume=True``: the resume point ``S`` is derived from the checkpoints, verified, and the directory
   cut back to it (:mod:`mrl_llm.resume`); the run continues at ``S + 1``. Else ``config.json`` is written.
3. :class:`~mrl_llm.distributed.driver.Driver` runs the steps over the backend's actors. Evaluation runs
   on the actors before training, every ``eval.every`` steps and at the end (the driver drains its
   pipeline there). Each actor checkpoints its policy every ``checkpoint_every`` steps; once every policy
   has, the step is recorded with its exchange digest in ``checkpoints/run_state.json``, and only then are
   older checkpoints pruned (``keep_checkpoints``). The last step is always checkpointed; policies are
   exported to ``policies/<name>/`` (one that leaves, as it leaves), each whole or not at all
   (:func:`export`). A resume with no step left (killed after the last checkpoint) does the end again: the
   final evaluation unless it was logged, the export, the summary with the checkpoints' compute counters.
4. Outputs: ``metrics.jsonl`` (train rows in the config's policy order), ``eval.jsonl``, ``events.jsonl``,
   ``runtime.json`` (the driver's outline), ``summary.json``, ``success_matrix.json``, ``dynamics.json``
   (:mod:`mrl_llm.dynamics`: per-prompt curves, the split from the training problems resolved here), TensorBoard
   events when installed; a tqdm bar (``progress``), else one log line per step.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mrl_llm.config import RunConfig
from mrl_llm.data import DataCursor, Problem, fingerprint
from mrl_llm.distributed.actors import PolicyActorSpec
from mrl_llm.distributed.backends import LocalBackend, RayBackend
from mrl_llm.distributed.driver import Driver, Membership, wait_status
from mrl_llm.distributed.handles import resolve
from mrl_llm.evaluate import peer_exclusive_sets, read_eval_rows
from mrl_llm.metrics import MetricsLog, clean, train_row
from mrl_llm.resume import record_checkpoint, restore_run_dir, resume_step, verify_run_dir
from mrl_llm.run_problems import write_run_problems
from mrl_llm.run_setup import Batches, log_eval, resolve_problems, run_summary, setup_warnings
from mrl_llm.rundir import RunDirLock, check_run_dir, new_run_guard
from mrl_llm.runstate import prune
from shared_interfaces.config_io import ConfigError, to_mapping

log = logging.getLogger("mrl_llm.runner")


@dataclass
class Runtime:
    """What a backend gives a run (module docstring)."""

    backend: LocalBackend | RayBackend
    specs: list[PolicyActorSpec]
    mode: str = "sync"
    max_staleness: int = 0
    max_restarts: int = 3  # runtime.max_restarts: restarts from one checkpoint step before the run stops


StartRuntime = Callable[[RunConfig, Path], AbstractContextManager[Runtime]]


def run_training(config: RunConfig, out_dir: str | Path, *, start_runtime: StartRuntime, resume: bool = False,
                 problems: Sequence[Problem] | None = None,
                 eval_problems: Sequence[Problem] | None = None) -> dict[str, Any]:
    """Train ``config`` into ``out_dir`` on ``start_runtime``'s backend (module docstring); returns the summary."""
    out = Path(out_dir)
    check_run_dir(config, out, resume)  # before anything is made
    made = not out.exists()
    with RunDirLock(out):  # one process a run directory; checked again under the lock
        check_run_dir(config, out, resume)
        with new_run_guard(out, resume, made=made):
            return _run(config, out, resume=resume, problems=problems, eval_problems=eval_problems,
                        start_runtime=start_runtime)


def export(actor: Any, dest: Path) -> Path:
    """``actor``'s policy exported to ``dest`` whole or not at all: written beside it, then moved in (a run
    killed while exporting leaves the earlier export or none, never a half-written one)."""
    tmp = dest.with_name(f".{dest.name}.partial")
    shutil.rmtree(tmp, ignore_errors=True)
    resolve(actor.export.remote(str(tmp)))
    if dest.exists():
        shutil.rmtree(dest)
    os.replace(tmp, dest)
    return dest


def _run(config: RunConfig, out: Path, *, resume: bool, problems: Sequence[Problem] | None,
         eval_problems: Sequence[Problem] | None, start_runtime: StartRuntime) -> dict[str, Any]:
    from tqdm.auto import tqdm

    resolved = resolve_problems(config, problems, eval_problems)
    problems, eval_set = resolved.train, resolved.eval
    for msg in setup_warnings(config):
        log.warning("%s", msg)
    data_fp = fingerprint(problems)
    start = 0
    if resume:
        start = resume_step(config, out) + 1
        if start > config.steps:
            raise ConfigError(f"--resume {out}: the run has trained {start} steps (its checkpoint of step {start - 1}), "
                              f"more than steps {config.steps}; give --steps {start} or more (a run is not cut back)")
        # before anything in the directory changes
        verify_run_dir(config, out, start - 1, data_fp, resolved.use["train"].source)
        restore_run_dir(config, out, start - 1)
        log.info("resuming %s at step %d", out, start)
    else:
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(json.dumps(to_mapping(config), indent=1))
    write_run_problems(out, problems, eval_set)  # the pool and the evaluated prompts (mrl_llm.run_problems)
    logged = read_eval_rows(out / "eval.jsonl")  # a resumed run's earlier evaluations
    done_evals = {int(r["step"]) for r in logged}
    t_start = time.perf_counter()
    metrics = MetricsLog(out, tensorboard=config.tensorboard)
    order = list(config.policy_names)
    regime = config.regime_spec.name
    counters: dict[str, dict[str, float]] = {}
    exclusive = peer_exclusive_sets(r for r in logged if r["step"] == 0)
    every_ck = config.checkpoint_every
    bar = tqdm(total=config.steps, initial=min(start, config.steps), disable=not config.progress,
               desc=f"{config.name or 'train'} [{regime}]", unit="step")
    try:
        with start_runtime(config, out) as rt:
            def on_step(step: int, gens: dict[str, dict], trains: dict[str, dict]) -> None:
                rows = [train_row(step, n, regime, gens[n], trains[n]) for n in order if n in trains and n in gens]
                metrics.metrics(rows)
                for n in trains:
                    counters[n] = dict(trains[n].get("counters") or {})
                if trains and every_ck and (step + 1) % every_ck == 0:  # the actors saved
                    record_checkpoint(out, step, rt.backend.exchange_digest(step), data_fp)
                if every_ck:  # after the record: pruning first could leave only an unrecorded checkpoint
                    for n in trains:
                        prune(out / "checkpoints" / n, config.keep_checkpoints)
                rewards = ", ".join(f"{r['policy']} reward {r['reward_mean']:.2f}" for r in rows)
                bar.update(1)
                bar.set_postfix_str(rewards)
                if not config.progress:
                    log.info("step %d: %s", step, rewards)

            def evaluate(drv: Driver, t: int) -> None:
                nonlocal exclusive
                e = config.eval
                if not e.enabled or not eval_set or t in done_evals:
                    return
                if t == drv.next_step:  # before the first step of this session: start the actors
                    drv.ensure_members(t)
                names = [n for n in order if n in drv.actors]
                for n in names:
                    wait_status(drv.actors[n])  # an actor Ray is restarting after a crash comes back first
                refs = {n: drv.actors[n].evaluate.remote(eval_set, step=t, k=e.k, temperature=e.temperature,
                                                          top_p=e.top_p, max_new_tokens=e.max_new_tokens)
                        for n in names}
                rows = [{"step": t, "policy": n, **r} for n in names for r in resolve(refs[n])]
                exclusive = log_eval(metrics, rows, names, t, regime, exclusive)
                done_evals.add(t)

            membership = {p.name: Membership(p.join_step, p.leave_step) for p in config.policies}
            cursor = DataCursor(list(problems), config.prompts_per_step, seed=config.seed)
            every = config.eval.every
            with Driver(rt.specs, Batches(cursor), out, backend=rt.backend, mode=rt.mode,  # type: ignore[arg-type]
                        max_staleness=rt.max_staleness, max_restarts=rt.max_restarts, membership=membership, on_step=on_step,
                        summary_file="runtime.json", start_step=start,
                        on_leave=lambda n, actor: export(actor, out / "policies" / n)) as drv:
                last = config.steps - 1
                if resume and start > last:  # killed after the last step's checkpoint: the end is done again
                    drv.ensure_members(last)
                if start == 0 or (every and start % every == 0):
                    evaluate(drv, start)
                t = start
                while t < config.steps:
                    t = min(config.steps, (t // every + 1) * every) if every else config.steps
                    drv.run(t)
                    evaluate(drv, t)
                evaluate(drv, config.steps)  # done in the loop, unless the end is done again
                saved = last >= start and not (every_ck and config.steps % every_ck == 0)
                for n in order:
                    if n in drv.actors and saved:
                        resolve(drv.actors[n].save.remote(last))  # the end is a checkpoint (resume goes on)
                if last >= start:
                    record_checkpoint(out, last, rt.backend.exchange_digest(last), data_fp)
                for n in order:
                    if n in drv.actors:
                        if saved:
                            prune(out / "checkpoints" / n, config.keep_checkpoints)
                        if n not in counters:  # no step of this session: the checkpoint's counts
                            counters[n] = dict(wait_status(drv.actors[n]).get("counters") or {})
                        export(drv.actors[n], out / "policies" / n)
        summary = run_summary(config, out, {n: counters.get(n, {}) for n in order}, time.perf_counter() - t_start,
                              resolved.use)
        summary["events"] = [e for e in drv.result.events if e["event"] != "join" or e["step"]]
    finally:
        bar.close()
        metrics.close()
    (out / "summary.json").write_text(json.dumps(clean(summary), indent=1, allow_nan=False))
    from mrl_llm.success_matrix import write_run_matrix

    write_run_matrix(out)  # success_matrix.json: the run's start, for bandit_sim predict
    from mrl_llm.dynamics import write_run_dynamics

    write_run_dynamics(out, train_prompts=[str(p.prompt_id) for p in problems])  # dynamics.json: per-prompt curves
    return summary
