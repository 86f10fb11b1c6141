"""The Ray runtime of ``bandit_sim sweep``: grid points as Ray tasks (``--runtime ray [--ray-address ADDR]``).

Ray is an optional dependency of the simulator (the ``sweep`` extra: ``pip install 'mutual-rl[sweep]'``).
Without ``--ray-address`` a local cluster is started on this machine (and shut down at the end, or cleared by
its watchdog when this process is killed, :mod:`shared_interfaces.ray_local`); with one, the sweep joins that cluster and leaves it running. Each point is one task asking ``cpus_per_point``
CPUs (default 1: a point runs unsharded, one torch thread) with the ``SPREAD`` scheduling strategy, so a
cluster of several nodes runs points on all of them. A task returns the point's result and the id of the
node it ran on (kept in the point's file as ``node``). Retries are the sweep's own (a failing point is
tried once more, :mod:`bandit_sim.sweep`), not Ray's.

**Worker priority.** Ray starts its worker processes at niceness 15 by default (its ``worker_niceness``
setting), so on a machine other jobs also use, its points get a few percent of a core each (measured: two
``paper-full`` points had 23 CPU-s each after 32 min at load average 27, where the sequential runtime's
nice-0 processes ran). A local cluster this runtime starts sets ``worker_niceness`` to ``WORKER_NICENESS``
(0: the priority of the sequential runtime and of every other process); a cluster given by
``--ray-address`` keeps its own setting (start it with ``RAY_worker_niceness=0 ray start ...`` for the same).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from bandit_sim.config import SimConfig
from bandit_sim.sweep import PointFn, describe_error, run_point
from shared_interfaces.config_io import ConfigError
from shared_interfaces.ray_address import check_ray_address
from shared_interfaces.ray_local import ClusterWatchdog, watch_local_cluster

WORKER_NICENESS = 0  # of the workers of a local cluster this runtime starts (module docstring)


def _import_ray():
    try:
        import ray
    except ImportError as err:
        raise ConfigError("--runtime ray needs Ray: install the sweep extra (pip install 'mutual-rl[sweep]') or use "
                          "--runtime sequential") from err
    return ray


def _run_on_node(point_fn: PointFn, base: SimConfig, point: dict) -> dict[str, Any]:
    import ray

    return {**point_fn(base, point, 1), "node": ray.get_runtime_context().get_node_id()}


@dataclass
class RayRuntime:
    """Points as Ray tasks; ``owns_cluster`` when this runtime started the local cluster (and stops it)."""

    point_fn: PointFn = run_point
    cpus_per_point: float = 1.0
    owns_cluster: bool = False
    pending: dict = field(default_factory=dict)
    watchdog: ClusterWatchdog | None = None  # of the local cluster it started (shared_interfaces.ray_local)

    @classmethod
    def start(cls, *, address: str | None = None, point_fn: PointFn = run_point, cpus_per_point: float = 1.0,
              num_cpus: int | None = None) -> RayRuntime:
        ray = _import_ray()
        owns = False
        if not ray.is_initialized():
            check_ray_address(address, flag="--ray-address")
            try:
                local = {"num_cpus": num_cpus, "_system_config": {"worker_niceness": WORKER_NICENESS}}
                ray.init(address=address or "local", **(local if address is None else {}),
                         include_dashboard=False, log_to_driver=False, configure_logging=False)
            except ConnectionError as err:
                raise ConfigError(f"--ray-address {address}: cannot connect to a Ray cluster there ({err}); start one "
                                  "with `ray start --head` or leave --ray-address out for a local cluster") from err
            owns = address is None
        watchdog = watch_local_cluster() if owns else None  # the local cluster does not outlive this process
        return cls(point_fn=point_fn, cpus_per_point=cpus_per_point, owns_cluster=owns, watchdog=watchdog)

    def submit(self, tag: Any, base: SimConfig, point: dict) -> None:
        ray = _import_ray()
        task = ray.remote(num_cpus=self.cpus_per_point, max_retries=0, scheduling_strategy="SPREAD")(_run_on_node)
        self.pending[task.remote(self.point_fn, base, point)] = tag

    def results(self) -> Iterator[tuple[Any, dict | None, str | None]]:
        ray = _import_ray()
        while self.pending:
            ready, _ = ray.wait(list(self.pending), num_returns=1)
            ref = ready[0]
            tag = self.pending.pop(ref)
            try:
                yield tag, ray.get(ref), None
            except ray.exceptions.RayTaskError as err:
                cause = err.cause if isinstance(getattr(err, "cause", None), BaseException) else err
                yield tag, None, describe_error(cause)
            except ray.exceptions.RayError as err:  # a worker died, a node was lost
                yield tag, None, describe_error(err)

    def close(self) -> None:
        ray = _import_ray()
        for ref in list(self.pending):
            ray.cancel(ref, force=True)
        self.pending.clear()
        if self.owns_cluster and ray.is_initialized():
            ray.shutdown()
        if self.watchdog is not None:
            self.watchdog.close()
            self.watchdog = None
