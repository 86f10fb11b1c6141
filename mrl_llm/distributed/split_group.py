"""A policy under ``placement: split`` on Ray: trainer actors and rollout actors on different bundles, behind
one actor's interface (MWRA's split pools, :mod:`mrl_llm.distributed.planner`).

The plan gives the policy ``k`` ``train`` bundles and ``m`` ``rollout`` bundles. :func:`start_split_group`
starts the trainers as one worker group (:func:`~mrl_llm.distributed.rank_group.start_rank_group`: ``k``
ranks, one ``torch.distributed`` group, FSDP2-sharded for ``k > 1``) and ``m`` rollout actors, each a whole
(unsharded) copy of the policy with its engine. :class:`SplitGroup` routes the driver's calls:

* ``generate(problems, step)`` — the trainers render the prompts (``role: train`` samples nothing); rollout
  actor ``r`` samples prompts ``r, r + m, ...`` with ``sampling.seeding: sample``, else rollout 0 samples them
  all; they publish; the answer is the sum over all (``records``).
* ``train(...)`` — the trainers (every rank: a collective), which fetch their own records from the exchange
  like the peers'. Right behind it the trainers' weights go to every rollout actor: ``weights()`` (gathered,
  through Ray's object store) then ``load_weights(ref)``, queued on each rollout actor before anything the
  driver sends it later — so the next ``generate`` samples from the updated weights, as a colocated actor
  does (Ray runs an actor's calls in submission order).
* ``save``, ``export``, ``state`` — the trainers (they hold the masters and the optimizer); ``evaluate`` —
  rollout actor 0; ``status``, ``close``, ``probe_run_dir`` — every actor.

A (re)started rollout actor loads the policy's ``LATEST`` checkpoint as any actor does. The actors are started
with ``max_restarts=0``: a failure of any of them stops the run (restarting a split policy as a whole is not
built yet).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from mrl_llm.distributed.actors import PolicyActor, PolicyActorSpec
from mrl_llm.distributed.rank_group import RankGroup, _generated, _rank0, start_rank_group


def _answers(*answers: Any) -> list[Any]:
    return list(answers)


class _SplitCall:
    def __init__(self, group: SplitGroup, method: str) -> None:
        self.group, self.method = group, method

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        import ray

        g, m = self.group, self.method
        if m == "evaluate":
            return g.rollouts[0].evaluate.remote(*args, **kwargs)
        if m in ("save", "export", "state", "weights"):
            return getattr(g.trainers, m).remote(*args, **kwargs)
        if m == "train":
            out = g.trainers.train.remote(*args, **kwargs)
            weights = g.trainers.weights.remote()  # behind the update on every trainer rank (a collective)
            for r in g.rollouts:
                r.load_weights.remote(weights)  # queued before whatever the driver sends this actor next
            return out
        if m in ("generate", "status", "close", "probe_run_dir"):
            refs = [getattr(g.trainers, m).remote(*args, **kwargs)]
            refs += [getattr(r, m).remote(*args, **kwargs) for r in g.rollouts]
            combine = {"generate": _generated, "probe_run_dir": _flatten}.get(m, _rank0)
            return ray.remote(num_cpus=0)(combine).remote(*refs)
        raise AttributeError(f"a split policy's actors have no method {m!r}")


def _flatten(*answers: Any) -> list[Any]:
    out: list[Any] = []
    for a in answers:
        out.extend(a if isinstance(a, list) else [a])
    return out


class SplitGroup(RankGroup):
    """A split policy's trainers (a :class:`RankGroup`) and rollout actors behind one actor's interface."""

    def __init__(self, trainers: RankGroup, rollouts: Sequence[Any]) -> None:
        super().__init__([*trainers.actors, *rollouts])
        self.trainers, self.rollouts = trainers, list(rollouts)

    def __getattr__(self, method: str) -> _SplitCall:  # type: ignore[override]
        if method.startswith("_"):
            raise AttributeError(method)
        return _SplitCall(self, method)


def start_split_group(spec: PolicyActorSpec, make_exchange: Callable[[], Any], options: Callable[[int], dict[str, Any]],
                      roles: Sequence[str], *, gpu: bool) -> SplitGroup:
    """Start ``spec``'s trainers in the ``train`` bundles and a rollout actor in each ``rollout`` bundle of
    ``roles`` (the plan's ``bundle_roles``); ``options(b)``: bundle ``b``'s Ray actor options."""
    import ray

    train_b = [b for b, r in enumerate(roles) if r == "train"]
    roll_b = [b for b, r in enumerate(roles) if r == "rollout"]
    if not train_b or not roll_b or len(train_b) + len(roll_b) != len(roles):
        raise ValueError(f"policy {spec.name!r}: a split plan needs train and rollout bundles only, got {list(roles)}")
    if spec.ranks != len(train_b):
        raise ValueError(f"policy {spec.name!r} has {spec.ranks} trainer ranks but its plan {len(train_b)} train bundles")
    trainer_spec = replace(spec, role="train")
    if spec.ranks == 1:
        opts = {**options(train_b[0]), "max_restarts": 0}
        trainers = RankGroup([ray.remote(PolicyActor).options(**opts).remote(trainer_spec, make_exchange())])
    else:
        trainers = start_rank_group(trainer_spec, make_exchange, lambda r: options(train_b[r]), gpu=gpu)
    rollouts = []
    for i, b in enumerate(roll_b):
        rspec = replace(spec, role="rollout", ranks=1, rollouts=len(roll_b), rollout_rank=i, fault=None,
                        config={k: v for k, v in spec.config.items() if k != "group"})
        rollouts.append(ray.remote(PolicyActor).options(**{**options(b), "max_restarts": 0}).remote(rspec, make_exchange()))
    return SplitGroup(trainers, rollouts)
