"""Training entry point: ``train(config, out_dir)`` runs a mutual-RL run on the configured backend.

One runtime (:mod:`mrl_llm.runner`): one step schedule (:class:`mrl_llm.distributed.driver.Driver`,
synchronous, or with bounded staleness ``runtime.max_staleness``; k = 0 is sync) over the policies'
actors (:class:`mrl_llm.distributed.actors.PolicyActor`, with :mod:`mrl_llm.worker` as the policy
worker), and one resume mechanism (:mod:`mrl_llm.resume`). Each step (all policies see the same
``prompts_per_step`` prompts)::

    problems = batches(step)                              # the seeded data cursor, step by step
    for each policy: actor.generate(problems, step)       # sample G, score, publish to the exchange
    for each policy: actor.train(step, prompt_ids, ...)   # fetch -> plan (core) -> rows -> THL -> update

``runtime.backend: local`` (the default) runs the actors in this process, one call after the other
(:class:`~mrl_llm.distributed.backends.LocalBackend`), over a disk-logged exchange in ``DIR/exchange.jsonl``;
``ray`` runs each policy as a Ray actor or worker group placed by the MWRA plan
(:mod:`mrl_llm.distributed.ray_trainer`). The same seed gives the same run on both. Evaluation
(:mod:`mrl_llm.evaluate`) runs before training, every ``eval.every`` steps and at the end; checkpoints every
``checkpoint_every`` steps and at the end. Outputs: ``metrics.jsonl``, ``eval.jsonl``, ``events.jsonl``,
``summary.json``, ``success_matrix.json``, ``dynamics.json``, ``policies/<name>/`` (final HF model directories) and
TensorBoard events when tensorboard is installed.

From Python::

    from mrl_llm.config import load_config
    from mrl_llm.trainer import train
    summary = train(load_config("experiments/configs/tiny_cpu.yaml").with_regime("sgt"), "runs/sgt")

``problems`` / ``eval_problems`` (lists of :class:`mrl_llm.data.Problem`) may be passed instead of the
config's ``data`` / ``eval.data`` sections (e.g. a synthetic task built in code).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from mrl_llm.config import RunConfig
from mrl_llm.data import Problem
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
from mrl_llm.runner import Runtime, run_training

log = logging.getLogger("mrl_llm.trainer")


@contextmanager
def local_runtime(config: RunConfig, out: Path) -> Iterator[Runtime]:
    """The in-process backend: every policy's actor in this process, checkpointing every
    ``checkpoint_every`` steps, on ``runtime.mode`` / ``max_staleness``'s schedule."""
    import torch

    from mrl_llm.distributed.backends import LocalBackend

    if config.threads:
        torch.set_num_threads(config.threads)
    for p in config.policies:
        if p.ranks > 1:  # said, not silently dropped: a worker group needs Ray (mrl_llm.distributed.rank_group)
            log.warning("policy %s: ranks %d applies to --runtime ray; the single-process runtime trains it as "
                        "one rank (the same update)", p.name, p.ranks)
    specs = [replace(s, checkpoint_every=config.checkpoint_every) for s in actor_specs(config, out / "checkpoints")]
    yield Runtime(LocalBackend(exchange_fsync=config.exchange_fsync), specs, config.runtime.mode,
                  config.runtime.max_staleness)


def train(config: RunConfig, out_dir: str | Path, *, resume: bool = False, problems: Sequence[Problem] | None = None,
          eval_problems: Sequence[Problem] | None = None) -> dict[str, Any]:
    """Train ``config`` into ``out_dir`` (one regime per directory) and return the summary (``summary.json``).

    ``resume=True`` continues the run in ``out_dir`` after its newest complete checkpoint (the config must be
    the run's own, except ``steps``, ``eval``, ``threads``, ``progress``, ``tensorboard`` and
    ``policies[].ranks``; the checkpoint's files, the exchange log up to it and the dataset must be unedited,
    see :mod:`mrl_llm.resume`). A new run needs a new or empty ``out_dir`` and leaves nothing there if it fails
    before its first checkpoint (:mod:`mrl_llm.rundir`)."""
    verifier_options(config)  # a conflicting verifier setting fails before anything is written
    if config.runtime.backend == "ray":
        from mrl_llm.distributed.ray_trainer import train_on_ray

        return train_on_ray(config, out_dir, resume=resume, problems=problems, eval_problems=eval_problems)
    return run_training(config, out_dir, start_runtime=local_runtime, resume=resume, problems=problems,
                        eval_problems=eval_problems)
