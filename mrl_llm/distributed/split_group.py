"""A policy under ``placement: split`` on Ray: trainer actors and rollout actors on different bundles, behind
one actor's interface (MWRA's split pools, :mod:`mrl_llm.distributed.planner`).

The plan gives the policy ``k`` ``train`` bundles and ``m`` ``rollout`` bundles. :func:`start_split_group`
starts the trainers as one worker group (:func:`~mrl_llm.distributed.rank_group.start_rank_group`: ``k``
ranks, one ``torch.distributed`` group, FSDP2-sharded for ``k > 1``) and ``m`` rollout actors, each a whole
(unsharded) copy of the policy with its engine. :class:`SplitGroup` routes the driver's calls:

* ``generate(problems, step)`` — the trainers render the prompts (``role: train`` samples nothing); rollout
  actor ``r`` samples prompts ``r, r + m, ...`` with ``sampling.seeding: sample`` (the default), else rollout 0
  samples them all; they publish; the answer is the sum over all (``records``).
* ``train(...)`` — the trainers (every rank: a collective), which fetch their own records from the exchange
  like the peers', and count the step's samples, tokens and generation FLOPs (the rollout actors' ``generate``
  answer of the step, passed as ``rollouts=``) in their compute counters, as a colocated actor counts its own:
  the rows, ``summary.json`` and the checkpoints (so a resume) carry the policy's counts. Right behind it the
  trainers' weights go to every rollout actor, as ``transfer`` says (``runtime.weight_transfer``):
  ``object_store`` — ``weights()`` (rank 0's gathered copy, through Ray's object store) then
  ``load_weights(ref)``; ``collective`` — ``push_weights()`` on the trainers and ``pull_weights()``
  on every rollout actor, one broadcast per bucket over the policy's weight bus
  (:mod:`mrl_llm.parallel.weight_bus`: the trainers' rank 0 and the rollout actors, joined when they start;
  nccl between GPUs, gloo on CPU; ``auto``: collective on GPUs). Either way the load is queued on each rollout
  actor before anything the driver sends it later — so the next ``generate`` samples from the updated weights, as a colocated actor
  does (Ray runs an actor's calls in submission order). The answer is the trainers' once every rollout actor
  has loaded the weights (:func:`trained`): a load that fails (a vllm engine's drift check above its
  threshold) fails the call, and the row gets the rollout actors' drift check and load time.
* The trainers build no rollout engine (``WorkerConfig.rollout_engine: false``): only the rollout actors run
  one (HF or vLLM; a vllm engine reloads the weights in place and runs its drift check).
* ``save``, ``export``, ``state`` — the trainers (they hold the masters and the optimizer); ``evaluate`` —
  rollout actor 0; ``status``, ``close``, ``probe_run_dir`` — every actor.

Fault tolerance — the policy restarts whole, like a worker group (:mod:`mrl_llm.distributed.rank_group`).
Every actor is started with ``max_restarts=0``. When a trainer rank or a rollout actor dies during a call,
the call fails (the driver logs a ``gap``) and the next call on the policy (the driver's ``status``) first
kills every trainer and rollout actor and starts them all again in their bundles; each loads the policy's
``LATEST`` checkpoint, so trainers and rollout actors hold the same weights and version again, and the driver
logs ``rejoin`` as for any actor. A fault injected into a split policy (tests) crashes a rollout actor in
``generate`` (``fault.rank``: which one) or a trainer rank in ``train``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from mrl_llm.distributed.actors import PolicyActor, PolicyActorSpec
from mrl_llm.distributed.rank_group import (
    RankGroup,
    bundle_rendezvous,
    combined,
    generated,
    rank0,
    start_ranks,
)
from mrl_llm.parallel.group import GroupSpec
from shared_interfaces.config_io import to_mapping

log = logging.getLogger("mrl_llm.split_group")


class _SplitCall:
    def __init__(self, group: SplitGroup, method: str) -> None:
        self.group, self.method = group, method

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        import ray

        g, m = self.group, self.method
        if m == "close" and g.failed():  # a broken policy is closed by killing its actors
            g.kill()
            return ray.put(None)
        g.ensure_up()
        if m == "evaluate":
            return g.track(g.rollouts[0].evaluate.remote(*args, **kwargs))
        if m in ("save", "export", "state", "weights"):
            return getattr(g.trainers, m).remote(*args, **kwargs)
        if m == "train":
            gen = g.take_generated(args[0] if args else kwargs["step"])
            if gen is not None:  # the rollout actors' samples, tokens and FLOPs, counted by the trainers
                kwargs = {**kwargs, "rollouts": gen}
            out = g.trainers.train.remote(*args, **kwargs)
            if g.collective:  # behind the update: rank 0 broadcasts, every rollout actor receives
                pushed = g.trainers.push_weights.remote()
                loads = [g.track(r.pull_weights.remote()) for r in g.rollouts]
                return combined(trained, out, *loads, pushed=pushed)
            weights = g.trainers.weights.remote()  # behind the update on every trainer rank (a collective)
            # queued before whatever the driver sends these actors next
            loads = [g.track(r.load_weights.remote(weights)) for r in g.rollouts]
            return combined(trained, out, *loads)
        if m in ("generate", "status", "close", "probe_run_dir"):
            refs = [getattr(g.trainers, m).remote(*args, **kwargs)]
            refs += [g.track(getattr(r, m).remote(*args, **kwargs)) for r in g.rollouts]
            combine = {"generate": generated, "probe_run_dir": _flatten}.get(m, rank0)
            out = combined(combine, *refs)
            if m == "generate":
                g.generated[args[1] if len(args) > 1 else kwargs["step"]] = out
            return out
        raise AttributeError(f"a split policy's actors have no method {m!r}")


def trained(res: dict[str, Any], *loads: dict[str, Any], pushed: Any = None) -> dict[str, Any]:
    """The trainers' ``train`` answer ``res`` with the rollout actors' ``load_weights`` / ``pull_weights`` answers:
    ``sync_s`` is the trainers' plus the slowest load, each ``drift_*`` metric the largest over the rollout
    actors. ``pushed``: the trainers' ``push_weights`` answer (a collective transfer; resolved with the others, so
    a failed broadcast fails the call), whose broadcast count the row gets (``weight_broadcasts``)."""
    out = dict(res)
    metrics = dict(res.get("metrics") or {})
    got = [ld.get("metrics") or {} for ld in loads]
    if got:
        metrics["sync_s"] = float(metrics.get("sync_s", 0.0)) + max(float(g.get("sync_s", 0.0)) for g in got)
        for k in sorted({k for g in got for k in g if k.startswith("drift_")}):
            metrics[k] = max(float(g[k]) for g in got if k in g)
    if pushed is not None:
        metrics["weight_broadcasts"] = float(pushed["broadcasts"])
    out["metrics"] = metrics
    return out


def _flatten(*answers: Any) -> list[Any]:
    out: list[Any] = []
    for a in answers:
        out.extend(a if isinstance(a, list) else [a])
    return out


class SplitGroup(RankGroup):
    """A split policy's trainers (a :class:`RankGroup`) and rollout actors behind one actor's interface, restarted
    together (module docstring). ``start()`` starts them all: ``(trainers, rollouts)``."""

    def __init__(self, start: Callable[[], tuple[RankGroup, list[Any]]], *, policy: str = "",
                 collective: bool = False) -> None:
        trainers, rollouts = start()
        super().__init__([*trainers.actors, *rollouts], policy=policy)
        self.trainers, self.rollouts, self.start_all = trainers, rollouts, start
        self.collective = collective
        self.generated: dict[int, Any] = {}  # step -> the rollout actors' generate answer, until its train call

    def take_generated(self, step: int) -> Any:
        """The rollout actors' ``generate`` answer of ``step`` (an object ref; None: none was asked for), forgotten
        here with any of earlier steps."""
        for s in [s for s in self.generated if s < step]:
            del self.generated[s]
        return self.generated.pop(step, None)

    def __getattr__(self, method: str) -> _SplitCall:  # type: ignore[override]
        if method.startswith("_"):
            raise AttributeError(method)
        return _SplitCall(self, method)

    def track(self, ref: Any) -> Any:
        """Keep ``ref`` (a rollout actor's call) for :meth:`failed`; returns it."""
        self.pending.append(ref)
        return ref

    def failed(self) -> bool:
        """Whether a trainer rank or a rollout actor has died in a call (does not block)."""
        return bool(super().failed() or self.trainers.failed())

    def ensure_up(self) -> None:
        """After a death anywhere in the policy: kill every actor, start trainers and rollout actors anew."""
        if not self.failed():
            return
        self.kill()
        log.warning("policy %s: an actor died; restarting its trainers and rollout actors from the last checkpoint",
                    self.policy)
        self.trainers, self.rollouts = self.start_all()
        self.actors = [*self.trainers.actors, *self.rollouts]
        self.pending, self.broken, self.generated = [], False, {}
        self.restarts += 1

    def kill(self) -> None:
        import ray

        self.trainers.kill()
        for a in self.rollouts:
            ray.kill(a, no_restart=True)


TRANSFERS = ("auto", "object_store", "collective")


def start_split_group(spec: PolicyActorSpec, make_exchange: Callable[[], Any], options: Callable[[int], dict[str, Any]],
                      roles: Sequence[str], *, gpu: bool, transfer: str = "auto", timeout_s: float = 1800.0,
                      bus_timeout_s: float = 1800.0) -> SplitGroup:
    """Start ``spec``'s trainers in the ``train`` bundles and a rollout actor in each ``rollout`` bundle of
    ``roles`` (the plan's ``bundle_roles``); ``options(b)``: bundle ``b``'s Ray actor options; ``transfer``: how
    the weights reach the rollout actors (module docstring; ``collective``: the weight bus is joined here);
    ``timeout_s`` / ``bus_timeout_s``: the trainers' and the bus's collective timeouts (``runtime.collective_timeout_s``,
    ``runtime.weight_bus_timeout_s``)."""
    import ray

    if transfer not in TRANSFERS:
        raise ValueError(f"policy {spec.name!r}: weight transfer {transfer!r} is not one of {list(TRANSFERS)}")
    collective = transfer == "collective" or (transfer == "auto" and gpu)

    train_b = [b for b, r in enumerate(roles) if r == "train"]
    roll_b = [b for b, r in enumerate(roles) if r == "rollout"]
    if not train_b or not roll_b or len(train_b) + len(roll_b) != len(roles):
        raise ValueError(f"policy {spec.name!r}: a split plan needs train and rollout bundles only, got {list(roles)}")
    if spec.ranks != len(train_b):
        raise ValueError(f"policy {spec.name!r} has {spec.ranks} trainer ranks but its plan {len(train_b)} train bundles")
    fault = spec.fault
    train_fault = fault if fault is not None and fault.phase == "train" else None
    trainer_spec = replace(spec, role="train", fault=train_fault,  # the rollout actors sample: no engine here
                           config={**dict(spec.config), "rollout_engine": False})

    def start() -> tuple[RankGroup, list[Any]]:
        if spec.ranks == 1:
            opts = {**options(train_b[0]), "max_restarts": 0}
            trainers = RankGroup([ray.remote(PolicyActor).options(**opts).remote(trainer_spec, make_exchange())],
                                 policy=spec.name)
        else:
            trainers = RankGroup(start_ranks(trainer_spec, make_exchange, lambda r: options(train_b[r]), gpu=gpu,
                                             timeout_s=timeout_s), policy=spec.name)
        rollouts = []
        for i, b in enumerate(roll_b):
            mine = fault if fault is not None and fault.phase == "generate" and fault.rank == i else None
            rspec = replace(spec, role="rollout", ranks=1, rollouts=len(roll_b), rollout_rank=i,
                            fault=None if mine is None else replace(mine, rank=0),
                            config={k: v for k, v in spec.config.items() if k != "group"})
            opts = {**options(b), "max_restarts": 0}
            rollouts.append(ray.remote(PolicyActor).options(**opts).remote(rspec, make_exchange()))
        if collective:  # a fresh bus for every start: rank 0's bundle picks its rendezvous
            addr, port = bundle_rendezvous(options(train_b[0]))
            bus = to_mapping(GroupSpec(rank=0, world_size=1 + len(roll_b), addr=addr, port=port,
                                       backend="nccl" if gpu else "gloo", timeout_s=bus_timeout_s))
            ray.get([trainers.actors[0].join_bus.remote(bus), *(r.join_bus.remote(bus) for r in rollouts)])
        return trainers, rollouts

    return SplitGroup(start, policy=spec.name, collective=collective)
