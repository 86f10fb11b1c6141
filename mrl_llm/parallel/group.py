"""A worker group: the k ranks of one policy, one ``torch.distributed`` process group.

Rank 0 picks the rendezvous (:func:`rendezvous`: this node's routable address, :func:`node_address`, and a free
TCP port); whoever starts the
ranks (the Ray driver, a test's spawn) hands the same :class:`GroupSpec` to every rank with its own ``rank``,
and each calls :meth:`WorkerGroup.join`. The backend is ``gloo`` on CPU and ``nccl`` on CUDA
(:func:`backend_for`). A group of one (``world_size == 1``) creates no process group: its collectives are the
identity, so k = 1 runs the same code as k > 1.

The collectives the trainer needs are small and explicit: :meth:`WorkerGroup.sum` (float vectors, fp64: counts,
loss terms and flags ride on it, :mod:`mrl_llm.parallel.share`) and :meth:`WorkerGroup.gather_objects`
(picklable objects, e.g. the peer traces each rank aligned).

Timeouts: a collective fails after ``GroupSpec.timeout_s`` (``runtime.collective_timeout_s``, default 1800 s,
against torch's 600 s for nccl) without the slowest rank. A rank that waits for another rank's long, uneven work
(rank 0 sampling the whole step under ``sampling.seeding: call``) waits outside any collective first,
:meth:`WorkerGroup.wait_for_ranks`: a store barrier with its own limit (``wait_s``, default none), which a dead
rank 0 ends at once (the store lives in its process) — so the collective that follows only waits for
stragglers, and ``timeout_s`` never has to cover a rollout.

Rank 0's process hosts the group's TCP store (the rendezvous every rank talks to), so leaving is ordered
(:meth:`WorkerGroup.close`, a collective): a barrier (every rank's collectives are done), each rank destroys
its process group and says so in the store, and rank 0 leaves only after every other rank has — a rank 0
that left first would take the store away from ranks still tearing down their connections.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

BACKENDS = ("gloo", "nccl")


def backend_for(device: torch.device | str) -> str:
    """``nccl`` for a CUDA device, ``gloo`` otherwise."""
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


#: A public address no packet is sent to: connecting a UDP socket to it only asks the kernel for a route.
_ROUTE_PROBE = ("8.8.8.8", 80)


def _ray_node_ip() -> str | None:
    """Ray's address of this node when this process is in a Ray cluster (the one its peers already reach)."""
    try:
        import ray
    except ImportError:
        return None
    if not ray.is_initialized():
        return None
    return ray.util.get_node_ip_address()


def _route_ip() -> str | None:
    """The source address of this host's default route (a connected UDP socket sends nothing); None offline."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(_ROUTE_PROBE)
            return s.getsockname()[0]
    except OSError:
        return None


def _hostname_ip() -> str | None:
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return None


def node_address(candidates: Sequence[Callable[[], str | None]] = (_ray_node_ip, _route_ip, _hostname_ip)) -> str:
    """This node's address for other nodes to reach rank 0's store: the first of ``candidates`` (Ray's node
    address when in Ray, then the default route's source address, then the host name's) that answers one that
    is not a loopback address (``127.0.1.1``, which Debian maps the host name to, is loopback); ``127.0.0.1``
    when none does (one node: every rank is local)."""
    for pick in candidates:
        addr = pick()
        if addr and not ipaddress.ip_address(addr).is_loopback and not ipaddress.ip_address(addr).is_unspecified:
            return addr
    return "127.0.0.1"


def rendezvous(host: str | None = None) -> tuple[str, int]:
    """``(address, port)`` for rank 0 to listen on: ``host`` (default: :func:`node_address`) and a TCP port free
    right now (the OS picks it)."""
    if host is None:
        host = node_address()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return host, int(s.getsockname()[1])


@dataclass(frozen=True)
class GroupSpec:
    """One rank's place in its policy's group: ``rank`` of ``world_size``, rank 0's ``addr:port``, ``backend``,
    ``timeout_s``: how long a collective (and the rendezvous) waits for the slowest rank (module docstring)."""

    rank: int
    world_size: int
    addr: str = "127.0.0.1"
    port: int = 0
    backend: str = "gloo"
    timeout_s: float = 1800.0

    def __post_init__(self) -> None:
        if isinstance(self.timeout_s, bool) or not isinstance(self.timeout_s, (int, float)) or not self.timeout_s > 0:
            raise ValueError(f"worker group: timeout_s must be a number of seconds > 0, got {self.timeout_s!r}")
        if isinstance(self.world_size, bool) or not isinstance(self.world_size, int) or self.world_size < 1:
            raise ValueError(f"worker group: world_size must be an integer >= 1, got {self.world_size!r}")
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or not 0 <= self.rank < self.world_size:
            raise ValueError(f"worker group: rank must be an integer in [0, {self.world_size}), got {self.rank!r}")
        if self.backend not in BACKENDS:
            raise ValueError(f"worker group: backend {self.backend!r} is not one of {list(BACKENDS)}")
        if self.world_size > 1 and not (isinstance(self.port, int) and 0 < self.port < 65536):
            raise ValueError(f"worker group: a group of {self.world_size} needs rank 0's port in 1..65535, "
                             f"got {self.port!r}; take it from rendezvous() on rank 0")

    def for_rank(self, rank: int) -> GroupSpec:
        """The same group seen from ``rank``."""
        return replace(self, rank=rank)


class WorkerGroup:
    """This process's membership of its policy's group (module docstring)."""

    def __init__(self, spec: GroupSpec, store: dist.Store | None = None) -> None:
        self.spec = spec
        self._store = store  # the group's rendezvous (None: a group of one, or one already left)
        self._last_wait: str | None = None  # the tag of this rank's last wait_for_ranks (its key goes at the next)

    @property
    def rank(self) -> int:
        return self.spec.rank

    @property
    def world_size(self) -> int:
        return self.spec.world_size

    @property
    def sharded(self) -> bool:
        return self.spec.world_size > 1

    @classmethod
    def join(cls, spec: GroupSpec) -> WorkerGroup:
        """Join the group (blocks until all ``world_size`` ranks have joined); one process, one group."""
        if spec.world_size == 1:
            return cls(spec)
        if dist.is_initialized():
            raise RuntimeError("this process is already in a torch.distributed group; one rank per process")
        timeout = timedelta(seconds=spec.timeout_s)
        store = dist.TCPStore(spec.addr, spec.port, spec.world_size, is_master=spec.rank == 0, timeout=timeout,
                              wait_for_workers=False)
        dist.init_process_group(spec.backend, store=store, rank=spec.rank, world_size=spec.world_size,
                                timeout=timeout)
        return cls(spec, store)

    def close(self) -> None:
        """Leave the group, in order (module docstring; a collective: every rank calls it). Nothing for a group
        of one; a second call does nothing."""
        if self._store is None or not dist.is_initialized():
            return
        store, self._store = self._store, None
        dist.barrier()
        dist.destroy_process_group()
        store.set(f"left/{self.rank}", "1")
        if self.rank == 0:
            store.wait([f"left/{r}" for r in range(1, self.world_size)],
                       timedelta(seconds=self.spec.timeout_s))

    def wait_for_ranks(self, tag: str, wait_s: float | None = None) -> None:
        """Return once every rank has called ``wait_for_ranks(tag)``: a barrier through the group's store, not a
        collective, so it may wait longer than ``timeout_s`` (``wait_s``; None: no limit) — for a rank that is
        still sampling. A dead rank 0 takes the store with it and the waiters fail at once. ``tag``: unique per
        call site and step (every rank the same). Nothing for a group of one."""
        if self._store is None:
            return
        self._store.set(f"wait/{tag}/{self.rank}", "1")
        limit = timedelta(seconds=wait_s) if wait_s is not None else timedelta(days=365)
        self._store.wait([f"wait/{tag}/{r}" for r in range(self.world_size)], limit)
        last, self._last_wait = self._last_wait, tag
        if last is not None:  # every rank has passed that barrier (all are at this one): its key can go
            self._store.delete_key(f"wait/{last}/{self.rank}")

    def _device(self) -> torch.device:
        """Where collective buffers live: the current CUDA device for nccl, the CPU for gloo."""
        return torch.device("cuda", torch.cuda.current_device()) if self.spec.backend == "nccl" else torch.device("cpu")

    def sum(self, values: list[float]) -> list[float]:
        """Element-wise sum of ``values`` over the ranks (fp64)."""
        if not self.sharded or not values:
            return [float(v) for v in values]
        t = torch.tensor(values, dtype=torch.float64, device=self._device())
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t.cpu().tolist()

    def sum_(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` summed over the ranks, in place (on the group's device: the current CUDA device for nccl)."""
        if self.sharded:
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t

    def gather_objects(self, obj: Any) -> list[Any]:
        """Every rank's ``obj`` (picklable), in rank order; ``[obj]`` for a group of one."""
        if not self.sharded:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out
