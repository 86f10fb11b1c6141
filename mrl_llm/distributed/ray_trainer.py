"""The trainer on Ray (``runtime: {backend: ray}``, ``python -m mrl_llm train --runtime ray``).

The same run as :func:`mrl_llm.trainer.train`'s single-process loop — same data cursor, same worker
(:mod:`mrl_llm.worker`), same step logic (:class:`~mrl_llm.distributed.actors.PolicyActor`), same
run-directory files (``config.json``, ``metrics.jsonl``, ``eval.jsonl``, ``summary.json``,
``exchange.jsonl``, ``policies/<name>/``) — but each policy is a Ray actor driven by
:class:`~mrl_llm.distributed.driver.RayDriver`:

1. Ray: ``runtime.address`` (an existing cluster) or a local cluster of ``runtime.num_cpus`` CPUs.
2. MWRA: the config's policies are planned on the cluster (``runtime.cluster`` YAML, else the Ray
   cluster's nodes; :func:`ray_cluster_spec`); the plan is written to ``plan.txt``, each policy gets a
   placement group of its bundles and its torch threads, and a ``vllm`` policy's engine gets the
   plan's memory settings (:func:`mrl_llm.rollout.vllm_memory.vllm_memory`). A policy planned on k
   bundles (``policies[].ranks: k`` in CPU mode, or k GPUs) runs as k ranks, one actor per bundle, each
   rank's role in ``plan.txt`` and the log (:mod:`mrl_llm.distributed.rank_group`).
3. The driver runs the steps (sync, or async with ``max_staleness``); policies join and leave at
   their ``join_step`` / ``leave_step``. Evaluation runs on the actors before training, every
   ``eval.every`` steps and at the end (the driver drains its pipeline there). Each actor checkpoints
   its policy every ``checkpoint_every`` steps (0: never, so a crashed actor restarts from its initial
   weights), which is where Ray restarts a crashed actor from
   (the ``gap`` / ``rejoin`` events go to ``events.jsonl``). A policy that leaves is exported to
   ``policies/<name>/`` as it leaves, the others at the end; the last step is always checkpointed.
4. ``resume=True`` (``train --resume DIR``) continues after the newest step every policy active at it
   has a checkpoint of (:mod:`mrl_llm.distributed.resume`); in ``mode: sync`` the result equals an
   uninterrupted run's.

With ``mode: sync`` and the same ``threads`` the files equal the local loop's up to timings.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from mrl_llm.config import RunConfig
from mrl_llm.data import DataCursor, Problem
from mrl_llm.distributed.actors import FaultInjection, PolicyActorSpec
from mrl_llm.distributed.cluster import ClusterSpec, NodeSpec, detect_local_cluster, load_cluster
from mrl_llm.distributed.driver import Membership, RayDriver, wait_status
from mrl_llm.distributed.memory import GiB, PolicyFootprint
from mrl_llm.distributed.plan_cli import footprints_from_config
from mrl_llm.distributed.planner import PlacementPlan, plan_placement
from mrl_llm.metrics import MetricsLog, clean, train_row
from mrl_llm.run_setup import Batches, actor_specs, log_eval, resolve_problems, run_summary
from mrl_llm.runstate import prune
from shared_interfaces.config_io import ConfigError, to_mapping

log = logging.getLogger("mrl_llm.ray_trainer")


def ray_cluster_spec(cluster_file: str | None = None) -> ClusterSpec:
    """The cluster to plan for: ``cluster_file``, else the live Ray cluster's nodes (CPUs, GPUs, Ray's
    schedulable memory as RAM; GPU memory from this machine's GPUs, the only ones it can see)."""
    import ray

    if cluster_file:
        return load_cluster(cluster_file)
    local = detect_local_cluster().nodes[0]
    nodes = []
    for n in ray.nodes():
        if not n.get("Alive", True):
            continue
        r = n["Resources"]
        gpus = int(r.get("GPU", 0))
        if gpus and not local.gpu_memory_gib:
            raise ConfigError("the Ray cluster has GPUs this machine cannot see; describe it in a cluster YAML and "
                              "set runtime.cluster (see experiments/configs/clusters/)")
        ram = float(r.get("memory", local.ram_gib * GiB)) / GiB
        nodes.append(NodeSpec(gpus=gpus, gpu_memory_gib=local.gpu_memory_gib if gpus else 0.0,
                              cpus=max(1, int(r.get("CPU", 1))), ram_gib=ram))
    return ClusterSpec("ray", tuple(nodes))


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
    """The MWRA plan of ``config``'s policies on ``cluster`` (``runtime.placement`` layout)."""
    if config.runtime.placement == "split":
        raise ConfigError("runtime.placement split needs a rollout actor per policy apart from its trainer, which the "
                          "Ray runtime does not have yet; use colocated (or auto)")
    fps = footprints(config)
    mode = config.runtime.placement
    if mode == "auto":
        mode = "cpu" if cluster.n_gpus == 0 else "colocated"
    return plan_placement(fps, cluster, mode=mode)


def ray_specs(config: RunConfig, plan: PlacementPlan, ckpt_root: Path,
              faults: Mapping[str, FaultInjection] | None = None) -> list[PolicyActorSpec]:
    """The policies' actor specs: the local trainer's, with the plan's threads (``threads``, when set,
    may lower them), checkpoints every ``checkpoint_every`` steps, a vllm engine's memory settings, and one
    rank per planned bundle (a worker group, :mod:`mrl_llm.distributed.rank_group`; each rank's role is logged)."""
    from mrl_llm.rollout.vllm_memory import vllm_memory
    fps = {f.name: f for f in footprints(config)}
    out = []
    for s in actor_specs(config, ckpt_root):
        p = plan.for_policy(s.name)
        for line in p.rank_roles():
            log.info("plan: %s", line)
        cfg = dict(s.config)
        if p.num_gpus > 0:  # the worker must land on the GPU it was given (device auto resolves there)
            if config.policy(s.name).device == "cpu":
                raise ConfigError(f"policy {s.name!r} is planned on a GPU bundle but sets device: cpu; set "
                                  "policies[].device: auto (or cuda), or runtime.placement: cpu")
            cfg["gpu_bundle"] = True
        if config.policy(s.name).engine == "vllm":
            cfg["engine_args"] = vllm_memory(plan, fps[s.name]).engine_args()  # policies[].engine_args win
        out.append(replace(s, config=cfg, threads=min(config.threads or p.threads, p.threads),
                           checkpoint_every=config.checkpoint_every, fault=(faults or {}).get(s.name),
                           ranks=len(p.bundles)))
    return out


def train_on_ray(config: RunConfig, out_dir: str | Path, *, resume: bool = False,
                 problems: Sequence[Problem] | None = None, eval_problems: Sequence[Problem] | None = None,
                 faults: Mapping[str, FaultInjection] | None = None) -> dict[str, Any]:
    """Train ``config`` on Ray into ``out_dir`` (module docstring); returns the summary. ``resume``
    continues the run in ``out_dir`` after its newest complete checkpoint
    (:mod:`mrl_llm.distributed.resume`). ``faults`` crash chosen actors once (tests of the fault tolerance)."""
    from mrl_llm.rundir import check_run_dir, new_run_guard

    out = Path(out_dir)
    check_run_dir(config, out, resume)
    with new_run_guard(out, resume):
        return _train_on_ray(config, out, resume=resume, problems=problems, eval_problems=eval_problems, faults=faults)


def _train_on_ray(config: RunConfig, out: Path, *, resume: bool, problems: Sequence[Problem] | None,
                  eval_problems: Sequence[Problem] | None,
                  faults: Mapping[str, FaultInjection] | None) -> dict[str, Any]:
    import ray

    from mrl_llm.data import fingerprint
    from mrl_llm.distributed.resume import record_checkpoint, restore_run_dir, resume_step, verify_run_dir
    from mrl_llm.evaluate import peer_exclusive_sets, read_eval_rows

    source = config.data.path if problems is None and config.data is not None else "the problems given to train()"
    problems, eval_set = resolve_problems(config, problems, eval_problems)
    data_fp = fingerprint(problems)
    start = 0
    if resume:
        start = resume_step(config, out) + 1
        verify_run_dir(config, out, start - 1, data_fp, source)
        restore_run_dir(config, out, start - 1)
        log.info("resuming %s at step %d", out, start)
    else:
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(json.dumps(to_mapping(config), indent=1))
    logged = read_eval_rows(out / "eval.jsonl")  # a resumed run's earlier evaluations
    done_evals = {int(r["step"]) for r in logged}
    rt = config.runtime
    started = not ray.is_initialized()
    if started:
        ray.init(address=rt.address, num_cpus=rt.num_cpus if rt.address is None else None,
                 include_dashboard=False, namespace="mrl")
    t_start = time.perf_counter()
    metrics = MetricsLog(out, tensorboard=config.tensorboard)
    order = list(config.policy_names)
    regime = config.regime_spec.name
    counters: dict[str, dict[str, float]] = {}
    exclusive = peer_exclusive_sets(r for r in logged if r["step"] == 0)
    try:
        plan = plan_run(config, ray_cluster_spec(rt.cluster))
        (out / "plan.txt").write_text(plan.render() + "\n")
        specs = ray_specs(config, plan, out / "checkpoints", faults)
        membership = {p.name: Membership(p.join_step, p.leave_step) for p in config.policies}

        def on_step(step: int, gens: dict[str, dict], trains: dict[str, dict]) -> None:
            rows = [train_row(step, n, regime, gens[n], trains[n]) for n in order if n in trains and n in gens]
            metrics.metrics(rows)
            for n in trains:
                counters[n] = dict(trains[n].get("counters") or {})
                if config.checkpoint_every:
                    prune(out / "checkpoints" / n, config.keep_checkpoints)
            if trains and config.checkpoint_every and (step + 1) % config.checkpoint_every == 0:  # the actors saved
                record_checkpoint(out, step, ray.get(drv.exchange_handle.digest.remote(step)), data_fp)
            log.info("step %d: %s", step, " ".join(f"{r['policy']} r={r['reward_mean']:.2f}" for r in rows))

        def evaluate(drv: RayDriver, t: int) -> None:
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
                                                      top_p=e.top_p, max_new_tokens=e.max_new_tokens) for n in names}
            rows = [{"step": t, "policy": n, **r} for n in names for r in ray.get(refs[n])]
            exclusive = log_eval(metrics, rows, names, t, regime, exclusive)

        cursor = DataCursor(list(problems), config.prompts_per_step, seed=config.seed)
        every = config.eval.every
        with RayDriver(specs, Batches(cursor), out, mode=rt.mode, max_staleness=rt.max_staleness,
                       membership=membership, placement=plan, exchange_fsync=config.exchange_fsync,
                       on_step=on_step, summary_file="runtime.json", start_step=start,
                       on_leave=lambda n, actor: ray.get(actor.export.remote(str(out / "policies" / n)))) as drv:
            if start == 0 or (every and start % every == 0):
                evaluate(drv, start)
            t = start
            while t < config.steps:
                t = min(config.steps, (t // every + 1) * every) if every else config.steps
                drv.run(t)
                evaluate(drv, t)
            last = config.steps - 1
            for n in order:
                if n in drv.actors:
                    if last >= start and not (config.checkpoint_every and config.steps % config.checkpoint_every == 0):
                        ray.get(drv.actors[n].save.remote(last))  # the end is a checkpoint (resume continues there)
                        prune(out / "checkpoints" / n, config.keep_checkpoints)
                    ray.get(drv.actors[n].export.remote(str(out / "policies" / n)))
            if last >= start:
                record_checkpoint(out, last, ray.get(drv.exchange_handle.digest.remote(last)), data_fp)
        summary = run_summary(config, out, {n: counters.get(n, {}) for n in order}, time.perf_counter() - t_start)
        summary["events"] = [e for e in drv.result.events if e["event"] != "join" or e["step"]]
    finally:
        metrics.close()
        if started:
            ray.shutdown()
    (out / "summary.json").write_text(json.dumps(clean(summary), indent=1, allow_nan=False))
    from mrl_llm.success_matrix import write_run_matrix

    write_run_matrix(out)  # success_matrix.json: the run's start, for bandit_sim predict
    return summary
