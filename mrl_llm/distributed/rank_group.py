"""A policy's worker group on Ray: k :class:`~mrl_llm.distributed.actors.PolicyActor` actors, one per
placement-group bundle, that look like one actor to the driver.

:func:`start_rank_group` asks rank 0's bundle for a rendezvous (a zero-CPU task placed there picks its
node's address and a free port, :func:`mrl_llm.parallel.group.rendezvous`), then starts rank ``r`` in bundle
``r`` with ``WorkerConfig.group = GroupSpec(r, k, addr, port, backend, timeout_s)`` (``nccl`` on a GPU bundle,
``gloo`` otherwise; ``timeout_s``: ``runtime.collective_timeout_s``); the ranks join one ``torch.distributed`` group while they build their workers.

Rollouts: with ``sampling.seeding: sample`` (the default) each rank samples and publishes its share of the step's prompts
(one seed per (prompt, sample index): the records do not depend on the split); else rank 0 samples them all.

:class:`RankGroup` has the actor's methods: ``group.train.remote(...)`` sends the call to every rank in
the same order (every training step, checkpoint save and weight sync is a collective) and returns one
object ref, that of :func:`_gather` run on the driver's :class:`Combiner` (one long-lived zero-CPU threaded actor), which
resolves once every rank has answered to rank 0's answer (``generate``: the ranks' records and counts summed,
:func:`generated`). Calls that need no collective
and whose answer is rank 0's alone (``evaluate``, ``export``, ``state``) go to rank 0 only.

Fault tolerance — the group restarts whole. When a rank dies during a call, :func:`_gather` does not wait for
the others (they may hang in a collective with the dead rank, or fail out of it: an error from one rank waits
up to ``grace_s`` for a dead rank among the others) and raises :class:`RankGroupDied`, which the driver treats
as an actor failure (a ``gap``). The next call on the group (the driver's ``status``, waiting for the policy
to come back) first restarts it (:meth:`RankGroup.ensure_up`): the surviving ranks are killed (not waited
for), a fresh rendezvous is taken and k new rank actors start in the same bundles, one new process group;
each loads the policy's last complete checkpoint (``LATEST``; any k loads it, :mod:`mrl_llm.parallel.checkpoint`),
and ``status`` answers once every new rank is up. The driver then logs ``rejoin`` exactly as for a single
actor that Ray restarted, and stops the run instead once the policy has been restarted ``runtime.max_restarts``
times from the same checkpoint step without finishing a step (:class:`~mrl_llm.distributed.driver.RestartLimit`). A rank that fails while starting (e.g. a checkpoint that does not verify) is a
``RuntimeError`` naming the policy and rank, not a restart: a new start would fail the same way.

Group ranks are created with ``max_restarts=0``: Ray's own restart of a lone rank would rebuild it with the
old rendezvous, and it would wait for a group that no longer exists (its peers are gone or in the old group),
so the group, not Ray, restarts its ranks. Single-rank policies keep Ray's restart (``max_restarts=-1``).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from mrl_llm.distributed.actors import PolicyActor, PolicyActorSpec
from mrl_llm.parallel.group import GroupSpec
from shared_interfaces.config_io import to_mapping

log = logging.getLogger("mrl_llm.rank_group")

#: Methods every rank runs (collectives, or state every rank needs); the rest go to rank 0 alone.
ALL_RANKS = frozenset({"generate", "train", "save", "status", "close", "probe_run_dir", "weights"})

#: Seconds :func:`_gather` waits, after one rank's error, for the others to answer (a dead rank among them
#: makes the error a :class:`RankGroupDied`; ranks that hang past it are not waited for).
FAILURE_GRACE_S = 30.0


class RankGroupDied(RuntimeError):
    """A rank of a policy's worker group died during a call: the group restarts whole from its last
    checkpoint (module docstring). The driver counts it as an actor failure."""


def rank0(*answers: Any) -> Any:
    return answers[0]


def _every_rank(*answers: Any) -> list[Any]:
    return list(answers)


def generated(*answers: dict[str, Any]) -> dict[str, Any]:
    """The ranks' ``generate`` answers as one: records and counts summed, seconds the slowest rank's."""
    out = dict(answers[0])
    out["records"] = sum(int(a["records"]) for a in answers)
    timings: dict[str, float] = {}
    for a in answers:
        for k, v in (a.get("timings") or {}).items():
            timings[k] = max(timings.get(k, 0.0), v) if k.endswith("_s") else timings.get(k, 0.0) + v
    out["timings"] = timings
    return out


COMBINE: dict[str, Callable[..., Any]] = {"generate": generated, "probe_run_dir": _every_rank}


def bundle_rendezvous(options: dict[str, Any]) -> tuple[str, int]:
    """A rendezvous (address, free port) on the node of the bundle ``options`` place an actor in: a zero-CPU task
    placed there picks it (:func:`mrl_llm.parallel.group.rendezvous`)."""
    import ray

    first = {key: v for key, v in options.items() if key == "scheduling_strategy"}
    return ray.get(zero_cpu_remote(_rendezvous).options(**first).remote())


def _rendezvous() -> tuple[str, int]:
    from mrl_llm.parallel.group import rendezvous

    return rendezvous()


def _gather(policy: str, method: str, refs: list[Any], grace_s: float) -> Any:
    """The ranks' answers to one call, combined (:data:`COMBINE`, else rank 0's); run remotely (on the
    :class:`Combiner`) with ``refs`` (rank ``r``'s call, in rank order) nested in a list so that Ray does not
    wait for them all.

    A rank that died (a ``RayActorError``) raises :class:`RankGroupDied` at once, without waiting for the
    others; a rank that failed while starting raises a ``RuntimeError`` naming it; another error waits up
    to ``grace_s`` for the remaining ranks (a dead one among them still makes it a :class:`RankGroupDied`:
    the survivors of a dead rank fail out of their collectives) and is then raised as it is."""
    import ray
    import ray.exceptions as rex

    rank_of = {ref: r for r, ref in enumerate(refs)}
    answers: dict[int, Any] = {}
    pending, first, deadline = list(refs), None, None
    while pending:
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        ready, pending = ray.wait(pending, num_returns=1, timeout=timeout)
        if not ready:
            break  # grace_s is over and the other ranks have not answered (hung in a collective?)
        r = rank_of[ready[0]]
        try:
            answers[r] = ray.get(ready[0])
        except rex.RayActorError as err:
            if err.actor_init_failed:
                raise RuntimeError(f"policy {policy!r}: rank {r} of its worker group failed to start: "
                                   f"{str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__}"
                                   ) from None
            raise RankGroupDied(f"policy {policy!r}: rank {r} of {len(refs)} died during {method!r} "
                                f"({type(err).__name__}); its worker group restarts from its last checkpoint"
                                ) from None
        except Exception as err:  # noqa: BLE001 - raised below once the other ranks are known
            if first is None:  # the rank's own exception (a RayTaskError re-raised here would nest)
                cause = getattr(err, "cause", None) if isinstance(err, rex.RayTaskError) else None
                first, deadline = cause if isinstance(cause, BaseException) else err, time.monotonic() + grace_s
    if first is not None:
        raise first
    return COMBINE.get(method, rank0)(*(answers[r] for r in range(len(refs))))


class Combiner:
    """Runs the groups' combining steps — :func:`_gather` of a rank group's call, :meth:`combine` of a split
    group's answers — each call on one of its threads (``max_concurrency``).

    Not a task per call: a Ray task needs an idle worker process, and on a node whose CPUs the ranks hold Ray
    keeps none — it starts one for the task and kills it about a second later (measured on the 2-core machine
    with 4 busy rank actors: 0.8-1.0 s a call as a zero-CPU task, against the 0.2 s the ranks took; nothing
    added on this actor), so every step of a k-rank group paid a process start per call."""

    def gather(self, policy: str, method: str, refs: list[Any], grace_s: float) -> Any:
        return _gather(policy, method, refs, grace_s)

    def combine(self, fn: Callable[..., Any], refs: list[Any], named: dict[str, Any]) -> Any:
        """``fn(*values, **named_values)`` of the answers ``refs`` / ``named`` (object refs, nested so that the
        call starts at once): what a task with them as arguments computes, its first failed answer raised."""
        import ray

        return fn(*ray.get(refs), **dict(zip(named, ray.get(list(named.values())), strict=True)))


#: The driver's :class:`Combiner` per Ray cluster (keyed by the driver's node id: a new cluster has a new one).
_COMBINERS: dict[str, Any] = {}
COMBINER_THREADS = 64


def combiner() -> Any:
    """This driver's :class:`Combiner` on the current Ray cluster, started on first use (zero CPUs; Ray restarts
    it if it dies: the calls it was serving fail, as they would with a dead rank)."""
    import ray

    key = ray.get_runtime_context().get_node_id()
    if key not in _COMBINERS:
        _COMBINERS.clear()  # an earlier cluster's handle
        _COMBINERS[key] = ray.remote(Combiner).options(num_cpus=0, max_concurrency=COMBINER_THREADS,
                                                       max_restarts=-1, max_task_retries=0).remote()
    return _COMBINERS[key]


def combined(fn: Callable[..., Any], *refs: Any, **named: Any) -> Any:
    """An object ref of ``fn`` over the answers ``refs`` / ``named``, computed on the :func:`combiner`."""
    return combiner().combine.remote(fn, list(refs), named)


@functools.cache
def zero_cpu_remote(fn: Callable[..., Any]) -> Any:
    """``fn`` as a zero-CPU Ray remote function, made once per process."""
    import ray

    return ray.remote(num_cpus=0)(fn)


def is_rank_failure(err: BaseException) -> bool:
    """Whether ``err`` (from a call on a group or one of its ranks) means a rank died: the group must restart."""
    import ray.exceptions as rex

    return isinstance(err, RankGroupDied) or (isinstance(err, rex.RayActorError) and not err.actor_init_failed)


class _Call:
    def __init__(self, group: RankGroup, method: str) -> None:
        self.group, self.method = group, method

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        import ray

        g = self.group
        if self.method == "close" and g.failed():  # a broken group is closed by killing its ranks
            g.kill()
            return ray.put(None)
        g.ensure_up()
        targets = g.actors if self.method in ALL_RANKS else g.actors[:1]
        refs = [getattr(a, self.method).remote(*args, **kwargs) for a in targets]
        out = refs[0] if len(refs) == 1 else combiner().gather.remote(g.policy, self.method, refs, g.grace_s)
        g.pending.append(out)
        return out


class RankGroup:
    """The k rank actors of one policy behind one actor's interface, restarted whole when a rank dies
    (module docstring). ``start()`` starts k new rank actors (a fresh rendezvous; :func:`start_rank_group`);
    ``restarts`` counts the group's restarts."""

    def __init__(self, actors: Sequence[Any], *, policy: str = "", start: Callable[[], list[Any]] | None = None,
                 grace_s: float = FAILURE_GRACE_S) -> None:
        self.actors = list(actors)
        self.policy = policy
        self.start = start
        self.grace_s = grace_s
        self.restarts = 0
        self.pending: list[Any] = []  # refs of calls on the current ranks, until seen answered
        self.broken = False

    def __getattr__(self, method: str) -> _Call:
        if method.startswith("_"):
            raise AttributeError(method)
        return _Call(self, method)

    def failed(self) -> bool:
        """Whether a call on the current ranks has failed because a rank died (does not block)."""
        import ray

        if not self.broken and self.pending:
            ready, self.pending = ray.wait(self.pending, num_returns=len(self.pending), timeout=0)
            for ref in ready:
                try:
                    ray.get(ref)
                except Exception as err:  # noqa: BLE001 - the caller of that call sees it; here: a dead rank?
                    self.broken = self.broken or is_rank_failure(err)
        return self.broken

    def ensure_up(self) -> None:
        """Restart the group when a rank has died (:meth:`failed`): kill every rank, start k new ones."""
        if not self.failed():
            return
        if self.start is None:
            raise RankGroupDied(f"policy {self.policy!r}: a rank of its worker group died and the group cannot "
                                "be restarted (no start function)")
        self.kill()
        log.warning("policy %s: a rank died; restarting its %d ranks from the last checkpoint", self.policy,
                    len(self.actors))
        self.actors = self.start()
        self.pending, self.broken = [], False
        self.restarts += 1

    def kill(self) -> None:
        """Kill every rank now (a rank hung in a collective is not waited for)."""
        import ray

        for a in self.actors:
            ray.kill(a, no_restart=True)


def start_ranks(spec: PolicyActorSpec, make_exchange: Callable[[], Any],
                 options: Callable[[int], dict[str, Any]], *, gpu: bool, timeout_s: float = 1800.0) -> list[Any]:
    """``spec.ranks`` new rank actors of ``spec`` on a fresh rendezvous, rank ``r`` with ``options(r)``;
    ``timeout_s``: the group's collective timeout (``runtime.collective_timeout_s``)."""
    import ray

    k = spec.ranks
    addr, port = bundle_rendezvous(options(0))
    actors = []
    for r in range(k):
        group = GroupSpec(rank=r, world_size=k, addr=addr, port=port, backend="nccl" if gpu else "gloo",
                          timeout_s=timeout_s)
        rank_spec = replace(spec, config={**dict(spec.config), "group": to_mapping(group)})
        opts = {**options(r), "max_restarts": 0}  # the group restarts its ranks, not Ray (module docstring)
        actors.append(ray.remote(PolicyActor).options(**opts).remote(rank_spec, make_exchange()))
    return actors


def start_rank_group(spec: PolicyActorSpec, make_exchange: Callable[[], Any],
                     options: Callable[[int], dict[str, Any]], *, gpu: bool,
                     grace_s: float = FAILURE_GRACE_S, timeout_s: float = 1800.0) -> RankGroup:
    """Start ``spec.ranks`` actors of ``spec`` (module docstring); ``options(r)``: rank ``r``'s Ray actor options
    (its bundle), ``make_exchange()``: an exchange client per rank. The group restarts on the same terms."""

    def start() -> list[Any]:
        return start_ranks(spec, make_exchange, options, gpu=gpu, timeout_s=timeout_s)

    return RankGroup(start(), policy=spec.name, start=start, grace_s=grace_s)
