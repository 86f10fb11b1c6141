"""The Ray driver: one colocated actor per policy, the exchange as a service, sync or bounded-staleness async.

Synchronous (``max_staleness = 0``, ``mode="sync"``): each step every live policy generates and
publishes; the driver waits for all (the barrier over the live policies); then every policy fetches the
step's groups, plans with the core and trains, concurrently; the driver waits again. Publishing is
pipelined: a policy sends its records and returns without waiting for the write; its ``train`` waits
for its own write, and its fetch waits in the exchange for each peer's record count of the step
(``expect``, from the generate results) — see :mod:`.exchange_actor`.

Asynchronous (``mode="async"``, bounded staleness ``k``): each policy's generation runs up to ``k``
steps ahead of its training (``generate(s + k)`` is queued right behind ``train(s - 1)``), and a
policy's ``train(s)`` waits only for its peers' ``generate(s)`` — object refs handed to the actor — not
for their training. The driver keeps at most ``k + 1`` steps in flight. Records then carry versions up
to ``k`` behind, and the actor drops peer records staler than ``k`` (see :mod:`.actors`). ``k = 0``
gives exactly the synchronous schedule.

Fault tolerance: actors are created with ``max_restarts=-1``, so Ray restarts a dead one, which loads
its policy's last checkpoint. The calls it was running fail; the driver logs a ``gap`` event per lost
call; the other policies train that step without its records. Before the next step the driver waits
for the restarted actor, logs ``rejoin`` with the checkpoint step and the ``lost_steps`` (updates since
the checkpoint that are gone), resets the policy's baseline lag, and lets it rejoin at the current step.
The train rows of the steps the dead process had trained after its checkpoint (``rolled_back_steps``
of the ``rejoin`` event) are marked ``"rolled_back": true`` in ``metrics.jsonl``
(:func:`mrl_llm.metrics.mark_rolled_back`), so the metrics describe the weights; readers skip them.

Membership: :meth:`RayDriver.add_policy` / :meth:`RayDriver.remove_policy` between steps, or
``join_step`` / ``leave_step`` per policy (the config/CLI route, :class:`Membership`).

Placement: with a :class:`~mrl_llm.distributed.planner.PlacementPlan`, each policy gets a Ray placement
group made of its planned bundles (``{"GPU": fraction, "CPU": c}`` per device; strategy PACK) and its
actor is scheduled into bundle 0 with that bundle's CPUs and (fractional) GPUs (:func:`actor_options`). A
policy with ``spec.ranks = k > 1`` is a worker group: k actors, rank ``r`` in bundle ``r``, one
``torch.distributed`` group, driven through one handle (:mod:`mrl_llm.distributed.rank_group`; no bundle
idles; ``ranks`` must equal the plan's bundle count; under ``placement: split`` the trainers and the
rollout actors take their own bundles, :mod:`mrl_llm.distributed.split_group`;
the plan's thread count goes into the specs' ``threads``, see
:func:`mrl_llm.distributed.ray_trainer.ray_specs`). Only planned policies can join. A placement group
that cannot be reserved within ``placement_timeout_s`` is an error naming the policy and its bundles.

Shared filesystem: each actor started (every rank of a group) must read a token the driver wrote in the run
directory and write its answer there, or the run stops saying a shared filesystem is needed
(:mod:`mrl_llm.distributed.shared_dir`).

Output (``out_dir``): ``events.jsonl`` (join, leave, gap, rejoin) as the run goes; per finished step
either ``on_step(step, generate_results, train_results)`` or, without it, one ``metrics.jsonl`` row per
policy; the run's outline in ``summary_file`` at the end of :meth:`RayDriver.run`. ``on_leave(name,
actor)`` runs before a leaving policy's actor is stopped (e.g. to export its weights).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from mrl_llm.distributed.actors import PolicyActor, PolicyActorSpec, problem_id
from mrl_llm.distributed.exchange_actor import RemoteExchange, start_exchange
from mrl_llm.distributed.planner import PlacementPlan, PolicyPlacement
from mrl_llm.distributed.rank_group import RankGroup, RankGroupDied, start_rank_group
from mrl_llm.distributed.shared_dir import check_answer, remove_token, write_token
from mrl_llm.distributed.split_group import start_split_group
from shared_interfaces.exchange import InMemoryExchange


@dataclass(frozen=True)
class Membership:
    """When a policy is in the run: steps ``join_step <= s < leave_step`` (None: to the end)."""

    join_step: int = 0
    leave_step: int | None = None

    def active(self, step: int) -> bool:
        return step >= self.join_step and (self.leave_step is None or step < self.leave_step)


@dataclass
class RunResult:
    metrics: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    step_wall_s: dict[int, float] = field(default_factory=dict)  # driver time between finished steps

    def events_of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["event"] == kind]


def _is_actor_failure(err: BaseException) -> bool:
    """A dead actor, or a worker group with a dead rank (restarted whole, :mod:`.rank_group`)."""
    import ray.exceptions as rex

    return isinstance(err, (rex.RayActorError, rex.ActorDiedError, rex.ActorUnavailableError, RankGroupDied))


def wait_status(actor: Any, timeout_s: float = 300.0) -> dict[str, Any]:
    """``actor.status()``, retried while Ray is restarting the actor (a worker group restarts on the call)."""
    import ray
    import ray.exceptions as rex

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return ray.get(actor.status.remote())
        except (rex.ActorUnavailableError, rex.RayActorError, RankGroupDied):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


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


class RayDriver:
    """Runs ``steps`` of mutual RL over Ray actors (module docstring). Call :meth:`close` (or use ``with``)."""

    def __init__(
        self,
        specs: Sequence[PolicyActorSpec],
        problems_for_step: Callable[[int], Sequence[Any]],
        out_dir: str | Path,
        *,
        mode: Literal["sync", "async"] = "sync",
        max_staleness: int = 0,
        membership: dict[str, Membership] | None = None,
        placement: PlacementPlan | None = None,
        exchange_fsync: bool = True,
        on_step: Callable[[int, dict[str, dict[str, Any]], dict[str, dict[str, Any]]], None] | None = None,
        summary_file: str = "summary.json",
        on_leave: Callable[[str, Any], None] | None = None,
        placement_timeout_s: float = 120.0,
        start_step: int = 0,
    ) -> None:
        import ray

        if mode not in ("sync", "async"):
            raise ValueError(f"mode must be 'sync' or 'async', got {mode!r}")
        if max_staleness < 0 or (mode == "sync" and max_staleness != 0):
            raise ValueError(f"max_staleness must be 0 in sync mode and >= 0 in async mode, got {max_staleness}")
        if not ray.is_initialized():
            raise RuntimeError("Ray is not initialised; call ray.init(...) (a local cluster) before RayDriver")
        self.out = Path(out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.problems_for_step = problems_for_step
        self.mode, self.k = mode, max_staleness
        self.placement = placement
        self.placement_timeout_s = placement_timeout_s
        self.placement_groups: dict[str, Any] = {}
        self.on_step = on_step
        self.on_leave = on_leave
        self.summary_file = summary_file
        self.fs_token = write_token(self.out)  # every actor must see the run directory (shared_dir)
        self.exchange_handle = start_exchange(self.out / "exchange.jsonl", fsync=exchange_fsync)
        self.exchange = RemoteExchange(self.exchange_handle, producer="driver")
        self.specs: dict[str, PolicyActorSpec] = {}
        self.membership: dict[str, Membership] = {}
        self.actors: dict[str, Any] = {}
        self.baselines: dict[str, int] = {}
        self.down: dict[str, int] = {}  # policy -> step of its failure
        self.result = RunResult()
        self.next_step = start_step  # > 0 when a run directory is resumed
        for s in specs:
            self.add_policy(s, (membership or {}).get(s.name, Membership()))

    # -- membership --------------------------------------------------------------------------
    def add_policy(self, spec: PolicyActorSpec, membership: Membership | None = None) -> None:
        """Add a policy; it joins at ``membership.join_step`` (default: the next step)."""
        if spec.name in self.specs:
            raise ValueError(f"policy {spec.name!r} is already in the run")
        self.specs[spec.name] = spec
        self.membership[spec.name] = membership or Membership(join_step=self.next_step)

    def remove_policy(self, name: str) -> None:
        """Remove a policy from the next step on (its records stay in the exchange)."""
        if name not in self.specs:
            raise KeyError(f"no policy {name!r} in the run; policies: {sorted(self.specs)}")
        m = self.membership[name]
        self.membership[name] = Membership(m.join_step, self.next_step)

    def _event(self, **row: Any) -> None:
        self.result.events.append(row)
        with open(self.out / "events.jsonl", "a", encoding="utf-8") as fh:
            fh.write(json.dumps(row) + "\n")

    def _actor_options(self, name: str, rank: int = 0) -> dict[str, Any]:
        opts: dict[str, Any] = dict(max_restarts=-1, max_task_retries=0, num_cpus=0)
        if self.placement is not None:
            if name not in self.placement_groups:
                self.placement_groups[name] = reserve_placement_group(
                    self.placement.for_policy(name), timeout_s=self.placement_timeout_s)
            opts.update(actor_options(self.placement.for_policy(name), self.placement_groups[name], rank))
        return opts

    def _start_actor(self, name: str) -> Any:
        """The policy's actor, or its worker group of ``spec.ranks`` actors (one per bundle) behind one handle."""
        import ray

        spec = self.specs[name]
        roles = self.placement.for_policy(name).bundle_roles if self.placement is not None else ()
        if "rollout" in roles:  # placement: split — trainers and rollout actors on their own bundles
            gpu = self.placement is not None and self.placement.for_policy(name).num_gpus > 0
            return start_split_group(spec, lambda: RemoteExchange(self.exchange_handle, producer=name),
                                     lambda b: self._actor_options(name, b), roles, gpu=gpu)
        if spec.ranks == 1:
            return ray.remote(PolicyActor).options(**self._actor_options(name)).remote(
                spec, RemoteExchange(self.exchange_handle, producer=name))
        if self.placement is not None and len(self.placement.for_policy(name).bundles) != spec.ranks:
            raise ValueError(f"policy {name!r} has {spec.ranks} ranks but its plan {len(self.placement.for_policy(name).bundles)} "
                             "bundles; plan with policies[].ranks (one bundle per rank)")
        gpu = self.placement is not None and self.placement.for_policy(name).num_gpus > 0
        return start_rank_group(spec, lambda: RemoteExchange(self.exchange_handle, producer=name),
                                lambda r: self._actor_options(name, r), gpu=gpu)

    def _stop(self, name: str) -> None:
        """Close the policy's worker (its engine's processes), kill its actor, free its placement group."""
        import ray

        actor = self.actors.pop(name)
        try:
            ray.get(actor.close.remote(), timeout=60)
        except Exception:  # a dead or hung actor is killed below anyway
            pass
        if isinstance(actor, RankGroup):  # a worker group: its rank actors
            actor.kill()
        else:
            ray.kill(actor)
        pg = self.placement_groups.pop(name, None)
        if pg is not None:
            ray.util.remove_placement_group(pg)

    def _sync_membership(self, step: int) -> list[str]:
        """Start joiners, stop leavers, bring restarted actors back; returns the live policies."""
        import ray

        live = []
        for name in sorted(self.specs):
            active = self.membership[name].active(step)
            if active and name not in self.actors:
                self.actors[name] = self._start_actor(name)
                st = wait_status(self.actors[name])
                answer = ray.get(self.actors[name].probe_run_dir.remote(str(self.out), self.fs_token))
                check_answer(self.out, self.fs_token, answer if isinstance(answer, list) else [answer])
                self.baselines[name] = step - st["version"]
                self._event(event="join", step=step, policy=name, version=st["version"])
            elif not active and name in self.actors:
                if self.on_leave is not None:
                    self.on_leave(name, self.actors[name])
                self._stop(name)
                self._event(event="leave", step=step, policy=name)
                continue
            if not active:
                continue
            if name in self.down:
                st = wait_status(self.actors[name])  # waits for Ray's restart
                ck = st["restored_step"]
                lost = list(range(ck + 1 if ck is not None else 0, step))
                failed_at = self.down.pop(name)
                rolled = [t for t in lost if t < failed_at]  # trained by the dead process, then lost
                self._roll_back(name, rolled)
                self.baselines[name] = step - st["version"]
                self._event(event="rejoin", step=step, policy=name, checkpoint_step=ck, version=st["version"],
                            lost_steps=lost, failed_at=failed_at, rolled_back_steps=rolled)
            live.append(name)
        return live

    def _roll_back(self, name: str, steps: list[int]) -> None:
        """Mark ``name``'s rows of ``steps`` rolled back, in ``metrics.jsonl`` and in :attr:`result`
        (:func:`mrl_llm.metrics.mark_rolled_back`): their updates are not in the restored weights."""
        from mrl_llm.metrics import mark_rolled_back

        mark_rolled_back(self.out / "metrics.jsonl", name, steps)
        for r in self.result.metrics:
            if r.get("policy") == name and r.get("step") in steps:
                r["rolled_back"] = True

    def ensure_members(self, step: int) -> list[str]:
        """Bring the membership to ``step`` (start joiners, stop leavers, wait for restarted actors) and
        return the live policies, e.g. to use the actors before :meth:`run` (evaluation at step 0)."""
        return self._sync_membership(step)

    def _collect(self, step: int, phase: str, refs: dict[str, Any]) -> dict[str, dict[str, Any]]:
        import ray

        ok = {}
        for name, ref in refs.items():
            try:
                ok[name] = ray.get(ref)
            except Exception as err:
                if not _is_actor_failure(err):
                    raise
                self.down.setdefault(name, step)
                self._event(event="gap", step=step, policy=name, phase=phase, error=type(err).__name__)
        return ok

    def _record(self, step: int, gens: dict[str, dict[str, Any]], rows: dict[str, dict[str, Any]]) -> None:
        now = time.perf_counter()
        self.result.step_wall_s[step] = now - self._t_last
        self._t_last = now
        self.result.metrics.extend(rows[name] for name in sorted(rows))
        if self.on_step is not None:
            self.on_step(step, gens, rows)
            return
        with open(self.out / "metrics.jsonl", "a", encoding="utf-8") as fh:
            for name in sorted(rows):
                fh.write(json.dumps(rows[name]) + "\n")

    # -- running -----------------------------------------------------------------------------
    def run(self, steps: int) -> RunResult:
        """Run steps ``next_step .. steps - 1``; may be called again with more steps (after add/remove)."""
        t0 = self._t_last = time.perf_counter()
        if self.mode == "sync":
            self._run_sync(steps)
        else:
            self._run_async(steps)
        self.result.timings["run_s"] = self.result.timings.get("run_s", 0.0) + time.perf_counter() - t0
        (self.out / self.summary_file).write_text(json.dumps(
            {"steps": self.next_step, "mode": self.mode, "max_staleness": self.k,
             "policies": sorted(self.actors), "events": self.result.events,
             "step_wall_s": self.result.step_wall_s}, indent=1))
        return self.result

    def _run_sync(self, steps: int) -> None:
        for s in range(self.next_step, steps):
            live = self._sync_membership(s)
            problems = list(self.problems_for_step(s))
            pids = [problem_id(p) for p in problems]
            gens = self._collect(s, "generate", {n: self.actors[n].generate.remote(problems, s) for n in live})
            peers = sorted(gens)
            counts = {n: gens[n]["records"] for n in peers}
            refs = {n: self.actors[n].train.remote(s, pids, peers=peers, baselines=dict(self.baselines), expect=counts)
                    for n in peers}
            self._record(s, gens, self._collect(s, "train", refs))
            self.next_step = s + 1

    def _run_async(self, steps: int) -> None:
        gen_refs: dict[int, dict[str, Any]] = {}
        train_refs: dict[int, dict[str, Any]] = {}
        start = self.next_step
        problems_cache: dict[int, list[Any]] = {}

        def submit_gen(t: int, names: list[str]) -> None:
            if t >= steps:
                return
            problems_cache.setdefault(t, list(self.problems_for_step(t)))
            for n in names:
                if self.membership[n].active(t) and n not in gen_refs.setdefault(t, {}):
                    gen_refs[t][n] = self.actors[n].generate.remote(problems_cache[t], t)

        live = self._sync_membership(start)
        for t in range(start, min(start + self.k + 1, steps)):
            submit_gen(t, live)
        for s in range(start, steps):
            if s > start:
                live = self._sync_membership(s)
                for t in range(s, min(s + self.k + 1, steps)):  # joiners / rejoiners catch up
                    submit_gen(t, live)
            pids = [problem_id(p) for p in problems_cache[s]]
            ready = [gen_refs[s][n] for n in live if n in gen_refs[s]]
            train_refs[s] = {
                n: self.actors[n].train.remote(s, pids, peers=live, ready=ready,
                                                baselines=dict(self.baselines), max_staleness=self.k)
                for n in live if n in gen_refs[s]
            }
            submit_gen(s + self.k + 1, live)
            done = s - self.k
            if done >= start:
                self._finish_async_step(done, gen_refs, train_refs)
            self.next_step = s + 1
        for t in range(max(start, steps - self.k), steps):
            self._finish_async_step(t, gen_refs, train_refs)

    def _finish_async_step(self, t: int, gen_refs: dict, train_refs: dict) -> None:
        gens = self._collect(t, "generate", gen_refs.pop(t, {}))
        self._record(t, gens, self._collect(t, "train", train_refs.pop(t, {})))

    # -- inspection --------------------------------------------------------------------------
    def states(self) -> dict[str, Any]:
        import ray

        return {n: ray.get(a.state.remote()) for n, a in sorted(self.actors.items())}

    def close(self) -> None:
        import ray

        for name in list(self.actors):
            self._stop(name)
        for pg in self.placement_groups.values():
            ray.util.remove_placement_group(pg)
        self.placement_groups.clear()
        ray.kill(self.exchange_handle)
        remove_token(self.out, self.fs_token)

    def __enter__(self) -> RayDriver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def run_local(specs: Sequence[PolicyActorSpec], problems_for_step: Callable[[int], Sequence[Any]],
              steps: int) -> tuple[RunResult, dict[str, Any]]:
    """The same steps in one process, in order, over an in-memory exchange (the reference for equality)."""
    ex = InMemoryExchange()
    actors = {s.name: PolicyActor(s, ex) for s in sorted(specs, key=lambda s: s.name)}
    result = RunResult()
    for s in range(steps):
        problems = list(problems_for_step(s))
        pids = [problem_id(p) for p in problems]
        for a in actors.values():
            a.generate(problems, s)
        for a in actors.values():
            result.metrics.append(a.train(s, pids, peers=sorted(actors)))
    return result, {n: a.state() for n, a in actors.items()}
