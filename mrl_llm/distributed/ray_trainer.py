"""The Ray backend of a run (``runtime: {backend: ray}``, ``python -m mrl_llm train --runtime ray``).

The same run as the in-process backend (:mod:`mrl_llm.runner`: same data cursor, same worker
(:mod:`mrl_llm.worker`), same step logic (:class:`~mrl_llm.distributed.actors.PolicyActor`), same schedule
(:class:`~mrl_llm.distributed.driver.Driver`), same run-directory files and resume mechanism
(:mod:`mrl_llm.resume`)) but each policy is a Ray actor (:class:`~mrl_llm.distributed.backends.RayBackend`):

1. Ray: ``runtime.address`` (an existing cluster) or a local cluster of ``runtime.num_cpus`` CPUs, which a
   watchdog clears when the driver ends, ``kill -9`` included (:mod:`shared_interfaces.ray_local`).
2. MWRA: the config's policies are planned on the cluster (``runtime.cluster`` YAML, else the Ray
   cluster's nodes; :func:`ray_cluster_spec`); the plan is written to ``plan.txt``, each policy gets a
   placement group of its bundles and its torch threads, and a ``vllm`` policy's engine gets the
   plan's memory settings (:func:`mrl_llm.rollout.vllm_memory.vllm_memory`). A policy planned on k
   bundles (``policies[].ranks: k`` in CPU mode, or k GPUs) runs as k ranks, one actor per bundle, each
   rank's role in ``plan.txt`` and the log (:mod:`mrl_llm.distributed.rank_group`).
3. Policies join and leave at their ``join_step`` / ``leave_step``; a crashed actor is restarted by Ray
   from its policy's last checkpoint (``checkpoint_every``; 0: only at the end, so it restarts from its
   initial weights), a worker group with a dead rank restarts all its ranks from it
   (:mod:`mrl_llm.distributed.rank_group`), a split policy its trainers and rollout actors
   (:mod:`mrl_llm.distributed.split_group`), with ``gap`` / ``rejoin`` events in ``events.jsonl``.

With ``mode: sync`` and the same ``threads`` the files equal the in-process backend's up to timings and the
exchange log's line order (publishers run concurrently).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

from mrl_llm.config import RunConfig
from mrl_llm.data import Problem
from mrl_llm.distributed.actors import FaultInjection, PolicyActorSpec
from mrl_llm.distributed.backends import RayBackend
from mrl_llm.distributed.cluster import ClusterSpec, live_ray_cluster, load_cluster
from mrl_llm.distributed.memory import PolicyFootprint
from mrl_llm.distributed.plan_cli import footprints_from_config
from mrl_llm.distributed.planner import PlacementPlan, plan_placement
from mrl_llm.run_setup import actor_specs
from mrl_llm.runner import Runtime, run_training
from shared_interfaces.config_io import ConfigError, to_mapping
from shared_interfaces.ray_address import check_ray_address
from shared_interfaces.ray_local import watch_local_cluster

log = logging.getLogger("mrl_llm.ray_trainer")


def ray_cluster_spec(cluster_file: str | None = None) -> ClusterSpec:
    """The cluster to plan for: ``cluster_file``, else the live Ray cluster's nodes, each GPU node's memory
    read on that node (:func:`mrl_llm.distributed.cluster.live_ray_cluster`)."""
    return load_cluster(cluster_file) if cluster_file else live_ray_cluster()


def footprints(config: RunConfig) -> list[PolicyFootprint]:
    """The planner's view of ``config``'s policies (a ``model_config`` without ``vocab_size`` gets its
    tokenizer's, as :func:`mrl_llm.models.build_model` does)."""
    from mrl_llm.models import load_tokenizer

    data = json.loads(json.dumps(to_mapping(config)))
    for pol, cfg_pol in zip(data["policies"], config.policies, strict=True):
        mc = pol.get("model_config")
        if isinstance(mc, dict) and "vocab_size" not in mc:
            mc["vocab_size"] = len(load_tokenizer(cfg_pol))
    return footprints_from_config(data)


def plan_run(config: RunConfig, cluster: ClusterSpec) -> PlacementPlan:
    """The MWRA plan of ``config``'s policies on ``cluster`` (``runtime.placement`` layout; under ``split`` a
    vllm policy's engines run in its rollout actors only, :mod:`mrl_llm.distributed.split_group`)."""
    fps = footprints(config)
    mode = config.runtime.placement
    if mode == "auto":
        mode = "cpu" if cluster.n_gpus == 0 else "colocated"
    return plan_placement(fps, cluster, mode=mode)


def ray_specs(config: RunConfig, plan: PlacementPlan, ckpt_root: Path,
              faults: Mapping[str, FaultInjection] | None = None) -> list[PolicyActorSpec]:
    """The policies' actor specs: the local trainer's, with the plan's threads (``threads``, when set,
    may lower them), checkpoints every ``checkpoint_every`` steps, a vllm engine's memory settings, and one
    rank per planned bundle (a worker group, :mod:`mrl_llm.distributed.rank_group`; each rank's role is logged).
    ``faults`` (tests) must name the config's policies and their ranks (a ``ConfigError`` / ``ValueError``). A
    policy sharded over k > 1 ranks on a torch without FSDP2's methods is a ``ConfigError`` before any rank starts."""
    from mrl_llm.parallel.fsdp import require_fsdp2
    from mrl_llm.rollout.vllm_memory import vllm_memory
    unknown = sorted(set(faults or {}) - set(config.policy_names))
    if unknown:
        raise ConfigError(f"fault injection for {unknown}, which the config has no policies of; name one of "
                          f"{list(config.policy_names)}")
    fps = {f.name: f for f in footprints(config)}
    out = []
    for s in actor_specs(config, ckpt_root):
        p = plan.for_policy(s.name)
        for line in p.plan_lines():
            log.info("plan: %s", line)
        cfg = dict(s.config)
        if p.num_gpus > 0:  # the worker must land on the GPU it was given (device auto resolves there)
            if config.policy(s.name).device == "cpu":
                raise ConfigError(f"policy {s.name!r} is planned on a GPU bundle but sets device: cpu; set "
                                  "policies[].device: auto (or cuda), or runtime.placement: cpu")
            cfg["gpu_bundle"] = True
        if config.policy(s.name).engine == "vllm":
            cfg["engine_args"] = vllm_memory(plan, fps[s.name]).engine_args()  # policies[].engine_args win
        ranks = sum(role != "rollout" for role in p.bundle_roles) or len(p.bundles)
        if ranks > 1 and config.policy(s.name).train.fsdp_unit != "none":
            try:  # here, not in the ranks' creation, where Ray would wrap it in their traceback
                require_fsdp2()
            except RuntimeError as err:
                raise ConfigError(f"policy {s.name!r} (ranks: {ranks}): {err}") from err
        out.append(replace(s, config=cfg, threads=min(config.threads or p.threads, p.threads),
                           checkpoint_every=config.checkpoint_every, fault=(faults or {}).get(s.name), ranks=ranks))
    return out


@contextmanager
def ray_runtime(config: RunConfig, out: Path, *,
                faults: Mapping[str, FaultInjection] | None = None) -> Iterator[Runtime]:
    """The Ray backend of a run (module docstring, 1-2): Ray started (or joined), the plan made and written
    to ``plan.txt``, the actor specs from it; Ray is shut down at the end if this started it."""
    import ray

    rt = config.runtime
    started = not ray.is_initialized()
    watchdog = None
    if started:
        check_ray_address(rt.address, flag="runtime.address (--ray-address)")
        ray.init(address=rt.address, num_cpus=rt.num_cpus if rt.address is None else None,
                 include_dashboard=False, namespace="mrl")
        watchdog = watch_local_cluster()  # a local cluster does not outlive this driver, even killed with -9
    try:
        plan = plan_run(config, ray_cluster_spec(rt.cluster))
        (out / "plan.txt").write_text(plan.render() + "\n")
        specs = ray_specs(config, plan, out / "checkpoints", faults)
        yield Runtime(RayBackend(placement=plan, exchange_fsync=config.exchange_fsync,
                                 weight_transfer=rt.weight_transfer, collective_timeout_s=rt.collective_timeout_s,
                                 weight_bus_timeout_s=rt.weight_bus_timeout_s), specs, rt.mode,
                      rt.max_staleness, max_restarts=rt.max_restarts)
    finally:
        if started:
            ray.shutdown()
        if watchdog is not None:
            watchdog.close()


def train_on_ray(config: RunConfig, out_dir: str | Path, *, resume: bool = False,
                 problems: Sequence[Problem] | None = None, eval_problems: Sequence[Problem] | None = None,
                 faults: Mapping[str, FaultInjection] | None = None) -> dict[str, Any]:
    """Train ``config`` on Ray into ``out_dir`` (:func:`mrl_llm.runner.run_training` on :func:`ray_runtime`);
    returns the summary. ``resume`` continues the run in ``out_dir`` after its newest complete checkpoint
    (:mod:`mrl_llm.resume`). ``faults`` crash chosen actors once (tests of the fault tolerance)."""
    return run_training(config, out_dir, start_runtime=partial(ray_runtime, faults=faults), resume=resume,
                        problems=problems, eval_problems=eval_problems)
