"""A policy's worker group on Ray: k :class:`~mrl_llm.distributed.actors.PolicyActor` actors, one per
placement-group bundle, that look like one actor to the driver.

:func:`start_rank_group` asks rank 0's bundle for a rendezvous (a zero-CPU task placed there picks its
node's address and a free port, :func:`mrl_llm.parallel.group.rendezvous`), then starts rank ``r`` in bundle
``r`` with ``WorkerConfig.group = GroupSpec(r, k, addr, port, backend)`` (``nccl`` on a GPU bundle, ``gloo``
otherwise); the ranks join one ``torch.distributed`` group while they build their workers.

Rollouts: with ``sampling.seeding: sample`` each rank samples and publishes its share of the step's prompts
(one seed per (prompt, sample index): the records do not depend on the split); else rank 0 samples them all.

:class:`RankGroup` has the actor's methods: ``group.train.remote(...)`` sends the call to every rank in
the same order (every training step, checkpoint save and weight sync is a collective) and returns one
object ref that resolves, once every rank has answered, to rank 0's answer (``generate``: the ranks'
records and counts summed, :func:`_generated`). Calls that need no collective
and whose answer is rank 0's alone (``evaluate``, ``export``, ``state``) go to rank 0 only.

Not done yet: a rank that dies is not restarted (its actors have ``max_restarts=0``; the run stops with
the error) — restarting the whole group from its last checkpoint is the issue's fault-tolerance item.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from mrl_llm.distributed.actors import PolicyActor, PolicyActorSpec
from mrl_llm.parallel.group import GroupSpec
from shared_interfaces.config_io import to_mapping

#: Methods every rank runs (collectives, or state every rank needs); the rest go to rank 0 alone.
ALL_RANKS = frozenset({"generate", "train", "save", "status", "close", "probe_run_dir", "weights"})


def _rank0(*answers: Any) -> Any:
    return answers[0]


def _every_rank(*answers: Any) -> list[Any]:
    return list(answers)


def _generated(*answers: dict[str, Any]) -> dict[str, Any]:
    """The ranks' ``generate`` answers as one: records and counts summed, seconds the slowest rank's."""
    out = dict(answers[0])
    out["records"] = sum(int(a["records"]) for a in answers)
    timings: dict[str, float] = {}
    for a in answers:
        for k, v in (a.get("timings") or {}).items():
            timings[k] = max(timings.get(k, 0.0), v) if k.endswith("_s") else timings.get(k, 0.0) + v
    out["timings"] = timings
    return out


def _rendezvous() -> tuple[str, int]:
    from mrl_llm.parallel.group import rendezvous

    return rendezvous()


class _Call:
    def __init__(self, group: RankGroup, method: str) -> None:
        self.group, self.method = group, method

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        import ray

        targets = self.group.actors if self.method in ALL_RANKS else self.group.actors[:1]
        refs = [getattr(a, self.method).remote(*args, **kwargs) for a in targets]
        if len(refs) == 1:
            return refs[0]
        combine = {"generate": _generated, "probe_run_dir": _every_rank}.get(self.method, _rank0)
        return ray.remote(num_cpus=0)(combine).remote(*refs)


class RankGroup:
    """The k rank actors of one policy behind one actor's interface (module docstring)."""

    def __init__(self, actors: Sequence[Any]) -> None:
        self.actors = list(actors)

    def __getattr__(self, method: str) -> _Call:
        if method.startswith("_"):
            raise AttributeError(method)
        return _Call(self, method)

    def kill(self) -> None:
        import ray

        for a in self.actors:
            ray.kill(a)


def start_rank_group(spec: PolicyActorSpec, make_exchange: Callable[[], Any],
                     options: Callable[[int], dict[str, Any]], *, gpu: bool) -> RankGroup:
    """Start ``spec.ranks`` actors of ``spec`` (module docstring); ``options(r)``: rank ``r``'s Ray actor options
    (its bundle), ``make_exchange()``: an exchange client per rank."""
    import ray

    k = spec.ranks
    first = {key: v for key, v in options(0).items() if key == "scheduling_strategy"}
    addr, port = ray.get(ray.remote(num_cpus=0)(_rendezvous).options(**first).remote())
    actors = []
    for r in range(k):
        group = GroupSpec(rank=r, world_size=k, addr=addr, port=port, backend="nccl" if gpu else "gloo")
        rank_spec = replace(spec, config={**dict(spec.config), "group": to_mapping(group)})
        opts = {**options(r), "max_restarts": 0}
        actors.append(ray.remote(PolicyActor).options(**opts).remote(rank_spec, make_exchange()))
    return RankGroup(actors)
