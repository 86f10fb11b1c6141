"""Where the driver's policy actors run: in this process (:class:`LocalBackend`) or on Ray (:class:`RayBackend`).

:class:`~mrl_llm.distributed.driver.Driver` runs one schedule; a backend gives it, per policy, a handle
with the actor's methods behind ``.remote(...)`` (a Ray actor, a worker group of rank actors, or a
:class:`~mrl_llm.distributed.handles.LocalHandle`), the exchange, and the exchange's digest at a step:

* ``open(out)`` — start the exchange on ``out/exchange.jsonl`` (an existing log is loaded: a resumed run);
* ``start(spec)`` — the policy's handle; ``check_shared_dir(handle)`` — every actor sees the run directory;
* ``stop(handle)`` — close its worker and free what it holds; ``close()`` — stop the exchange;
* ``exchange`` — the driver's view of the exchange; ``exchange_digest(step)`` — ``(n, sha256)`` of the log
  lines of records with ``step <= step`` (:func:`mrl_llm.runstate.lines_digest`), what a checkpoint stores.

In-process, the exchange is a :class:`~shared_interfaces.exchange.DiskLogExchange` and every call runs at
once in submission order (:mod:`.handles`). On Ray, the exchange is a service actor (:mod:`.exchange_actor`),
each policy gets a placement group of its planned bundles and its actor (or one actor per rank,
:mod:`.rank_group`) is scheduled there (:func:`actor_options`).
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from mrl_llm.distributed.actors import PolicyActor, PolicyActorSpec
from mrl_llm.distributed.handles import LocalHandle
from mrl_llm.distributed.planner import PlacementPlan, PolicyPlacement


def reserve_placement_group(placement: PolicyPlacement, *, timeout_s: float = 120.0) -> Any:
    """A Ray placement group of the policy's planned bundles (strategy PACK), reserved or an error."""
    import ray
    from ray.util.placement_group import placement_group

    bundles = [{k: float(v) for k, v in b.items() if v > 0} or {"CPU": 0.001} for b in placement.bundles]
    pg = placement_group(bundles, strategy="PACK")
    try:
        ray.get(pg.ready(), timeout=timeout_s)
    except Exception as err:
        ray.util.remove_placement_group(pg)
        raise RuntimeError(
            f"policy {placement.policy!r}: Ray could not reserve its placement group {bundles} within {timeout_s:g} s "
            f"(cluster resources: {ray.cluster_resources()}); plan for this cluster (runtime.cluster / "
            "`python -m mrl_llm plan`) or start Ray with more CPUs/GPUs"
        ) from err
    return pg


def actor_options(placement: PolicyPlacement, pg: Any, bundle: int = 0) -> dict[str, Any]:
    """Ray actor options for the policy's actor of rank ``bundle``: that bundle of ``pg`` with its CPUs and GPUs
    (a worker group has one rank per bundle, :mod:`mrl_llm.distributed.rank_group`)."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    b = placement.bundles[bundle]
    return {"num_cpus": float(b.get("CPU", 0.0)), "num_gpus": float(b.get("GPU", 0.0)),
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                placement_group=pg, placement_group_bundle_index=bundle, placement_group_capture_child_tasks=True)}


class LocalBackend:
    """Every policy's actor in this process, over a disk-logged exchange (module docstring)."""

    name = "local"

    def __init__(self, *, exchange_fsync: bool = True) -> None:
        self.exchange_fsync = exchange_fsync
        self.exchange: Any = None

    def open(self, out: Path) -> None:
        from shared_interfaces.exchange import DiskLogExchange

        self.exchange = DiskLogExchange(Path(out) / "exchange.jsonl", fsync=self.exchange_fsync)

    def start(self, spec: PolicyActorSpec) -> LocalHandle:
        return LocalHandle(PolicyActor(spec, self.exchange))

    def check_shared_dir(self, handle: Any) -> None:
        """Nothing to check: the actors run in the driver's process."""

    def stop(self, handle: Any, name: str | None = None) -> None:
        handle.obj.close()

    def exchange_digest(self, step: int) -> tuple[int, str]:
        from mrl_llm.runstate import lines_digest

        ex = self.exchange
        return lines_digest([ex.line(r.record_id) for r in ex.records() if r.step <= step])

    def close(self) -> None:
        if self.exchange is not None:
            self.exchange.close()


class RayBackend:
    """Each policy's actor (or worker group) on Ray in its planned placement group (module docstring)."""

    name = "ray"

    def __init__(self, *, placement: PlacementPlan | None = None, placement_timeout_s: float = 120.0,
                 exchange_fsync: bool = True, weight_transfer: str = "auto", collective_timeout_s: float = 1800.0,
                 weight_bus_timeout_s: float = 1800.0) -> None:
        self.placement = placement
        self.collective_timeout_s, self.weight_bus_timeout_s = collective_timeout_s, weight_bus_timeout_s
        self.weight_transfer = weight_transfer
        self.placement_timeout_s = placement_timeout_s
        self.exchange_fsync = exchange_fsync
        self.placement_groups: dict[str, Any] = {}
        self.exchange: Any = None
        self.exchange_handle: Any = None
        self.exchange_name: str | None = None  # the exchange actor's Ray name and namespace (open)
        self.exchange_namespace: str | None = None

    def open(self, out: Path) -> None:
        import ray

        from mrl_llm.distributed.exchange_actor import RemoteExchange, start_exchange
        from mrl_llm.distributed.shared_dir import write_token

        if not ray.is_initialized():
            raise RuntimeError("Ray is not initialised; call ray.init(...) (a local cluster) before the Ray driver")
        self.out = Path(out)
        self.fs_token = write_token(self.out)  # every actor must see the run directory (shared_dir)
        self.exchange_name = f"mrl-exchange-{uuid.uuid4().hex}"  # unique: runs may share a Ray cluster
        self.exchange_namespace = ray.get_runtime_context().namespace
        self.exchange_handle = start_exchange(self.out / "exchange.jsonl", fsync=self.exchange_fsync,
                                              name=self.exchange_name, namespace=self.exchange_namespace)
        self.exchange = RemoteExchange(self.exchange_handle, producer="driver")

    def _actor_exchange(self, producer: str) -> Any:
        """What a policy actor reaches the exchange with: the exchange actor by name (no handle in its constructor
        arguments; :mod:`mrl_llm.distributed.exchange_actor`)."""
        from mrl_llm.distributed.exchange_actor import RemoteExchange

        return RemoteExchange.named(self.exchange_name, self.exchange_namespace, producer=producer)

    def _actor_options(self, name: str, rank: int = 0) -> dict[str, Any]:
        opts: dict[str, Any] = dict(max_restarts=-1, max_task_retries=0, num_cpus=0)
        if self.placement is not None:
            if name not in self.placement_groups:
                self.placement_groups[name] = reserve_placement_group(
                    self.placement.for_policy(name), timeout_s=self.placement_timeout_s)
            opts.update(actor_options(self.placement.for_policy(name), self.placement_groups[name], rank))
        return opts

    def start(self, spec: PolicyActorSpec) -> Any:
        """The policy's actor, or its worker group of ``spec.ranks`` actors (one per bundle), or under ``placement:
        split`` its trainers and rollout actors (:mod:`mrl_llm.distributed.split_group`), behind one handle."""
        import ray

        from mrl_llm.distributed.rank_group import start_rank_group

        name = spec.name
        roles = self.placement.for_policy(name).bundle_roles if self.placement is not None else ()
        if "rollout" in roles:  # placement: split — trainers and rollout actors on their own bundles
            from mrl_llm.distributed.split_group import start_split_group

            gpu = self.placement is not None and self.placement.for_policy(name).num_gpus > 0
            return start_split_group(spec, lambda: self._actor_exchange(name),
                                     lambda b: self._actor_options(name, b), roles, gpu=gpu,
                                     transfer=self.weight_transfer, timeout_s=self.collective_timeout_s,
                                     bus_timeout_s=self.weight_bus_timeout_s)
        if spec.ranks == 1:
            return ray.remote(PolicyActor).options(**self._actor_options(name)).remote(
                spec, self._actor_exchange(name))
        if self.placement is not None and len(self.placement.for_policy(name).bundles) != spec.ranks:
            raise ValueError(f"policy {name!r} has {spec.ranks} ranks but its plan {len(self.placement.for_policy(name).bundles)} "
                             "bundles; plan with policies[].ranks (one bundle per rank)")
        gpu = self.placement is not None and self.placement.for_policy(name).num_gpus > 0
        return start_rank_group(spec, lambda: self._actor_exchange(name),
                                lambda r: self._actor_options(name, r), gpu=gpu,
                                timeout_s=self.collective_timeout_s)

    def check_shared_dir(self, handle: Any) -> None:
        import ray

        from mrl_llm.distributed.shared_dir import check_answer

        answer = ray.get(handle.probe_run_dir.remote(str(self.out), self.fs_token))
        check_answer(self.out, self.fs_token, answer if isinstance(answer, list) else [answer])

    def stop(self, handle: Any, name: str | None = None) -> None:
        """Close the policy's worker (its engine's processes), kill its actor, free its placement group."""
        import ray

        from mrl_llm.distributed.rank_group import RankGroup

        try:
            ray.get(handle.close.remote(), timeout=60)
        except Exception:  # a dead or hung actor is killed below anyway
            pass
        if isinstance(handle, RankGroup):  # a worker group: its rank actors
            handle.kill()
        else:
            ray.kill(handle)
        pg = self.placement_groups.pop(name, None) if name is not None else None
        if pg is not None:
            ray.util.remove_placement_group(pg)

    def exchange_digest(self, step: int) -> tuple[int, str]:
        import ray

        return tuple(ray.get(self.exchange_handle.digest.remote(step)))  # type: ignore[return-value]

    def close(self) -> None:
        import ray

        from mrl_llm.distributed.shared_dir import remove_token

        for pg in self.placement_groups.values():
            ray.util.remove_placement_group(pg)
        self.placement_groups.clear()
        if self.exchange_handle is not None:
            ray.kill(self.exchange_handle)
            remove_token(self.out, self.fs_token)
