"""The driver: the one step schedule of a run, over in-process actors or Ray actors, sync or bounded-staleness async.

:class:`Driver` runs the schedule below over a backend (:mod:`.backends`): :class:`~.backends.LocalBackend`
(every policy's actor in this process, each call run when it is sent, :mod:`.handles`) or
:class:`~.backends.RayBackend` (one actor, or one worker group, per policy; the exchange as a service).
Running in-process calls in submission order is what Ray's per-actor FIFO order gives this schedule, so
the two backends produce the same run for the same seed (sync and async). :class:`RayDriver` is the
driver with a Ray backend.

One schedule, with the staleness bound ``k`` as its parameter (:meth:`Driver._run`):

Synchronous (``k = 0``; ``mode="sync"``, or ``"async"`` with ``max_staleness=0``): each step every live
policy generates and publishes; the driver waits for all (the barrier over the live policies); then every
policy fetches the step's groups, plans with the core and trains (concurrently on Ray); the driver waits again. Publishing is
pipelined: a policy sends its records and returns without waiting for the write; its ``train`` waits
for its own write, and its fetch waits in the exchange for each peer's record count of the step
(``expect``, from the generate results) — see :mod:`.exchange_actor`.

Bounded staleness (``mode="async"``, ``k > 0``): each policy's generation runs up to ``k``
steps ahead of its training (``generate(s + k)`` is queued right behind ``train(s - 1)``), and a
policy's ``train(s)`` waits only for its peers' ``generate(s)`` — object refs handed to the actor — not
for their training. The driver keeps at most ``k + 1`` steps in flight. Records then carry versions up
to ``k`` behind, and the actor drops peer records staler than ``k`` (see :mod:`.actors`).

Fault tolerance (Ray): actors are created with ``max_restarts=-1``, so Ray restarts a dead one, which loads
its policy's last checkpoint. The calls it was running fail; the driver logs a ``gap`` event per lost
call; the other policies train that step without its records. Before the next step the driver waits
for the restarted actor, logs ``rejoin`` with the checkpoint step and the ``lost_steps`` (updates since
the checkpoint that are gone), resets the policy's baseline lag, and lets it rejoin at the current step.
A policy restarted ``max_restarts`` times (``runtime.max_restarts``; a worker group's own restarts counted) without
finishing a step in between — every restart back to the same checkpoint step — is not restarted again: the run
stops with :class:`RestartLimit`, one line naming the policy, the step it failed at and the cause.
The train rows of the steps the dead process had trained after its checkpoint (``rolled_back_steps``
of the ``rejoin`` event) are marked ``"rolled_back": true`` in ``metrics.jsonl``
(:func:`mrl_llm.metrics.mark_rolled_back`), so the metrics describe the weights; readers skip them.
An error raised inside a call (in-process, or a Ray task's own exception) is not a failure of the actor:
it is raised as it is and stops the run, which resumes from its last checkpoint (:mod:`mrl_llm.resume`).

Membership: :meth:`Driver.add_policy` / :meth:`Driver.remove_policy` between steps, or
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
policy; the run's outline in ``summary_file`` at the end of :meth:`Driver.run`. ``on_leave(name,
actor)`` runs before a leaving policy's actor is stopped (e.g. to export its weights).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from mrl_llm.distributed.actors import PolicyActorSpec, problem_id
from mrl_llm.distributed.backends import (  # noqa: F401 - actor_options, reserve_placement_group re-exported
    LocalBackend,
    RayBackend,
    actor_options,
    reserve_placement_group,
)
from mrl_llm.distributed.handles import LocalRef, resolve
from mrl_llm.distributed.planner import PlacementPlan
from mrl_llm.distributed.rank_group import RankGroupDied


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


class RestartLimit(RuntimeError):
    """A policy failed again after ``runtime.max_restarts`` restarts without finishing a step (module docstring)."""


def _cause(err: BaseException) -> str:
    """``err`` in one short line: its type and its message's first line (a Ray task's error: the error it wraps)."""
    cause = getattr(err, "cause", None)
    if isinstance(cause, BaseException):
        err = cause
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0][:200]}" if text else type(err).__name__


def _is_actor_failure(err: BaseException) -> bool:
    """A Ray actor died or is unavailable (Ray restarts it), or a worker group lost a rank (it restarts whole,
    :mod:`.rank_group`); any other error is the call's own, raised as it is."""
    if isinstance(err, RankGroupDied):
        return True
    if not type(err).__module__.startswith("ray"):
        return False
    import ray.exceptions as rex

    return isinstance(err, (rex.RayActorError, rex.ActorDiedError, rex.ActorUnavailableError))


def wait_status(actor: Any, timeout_s: float = 300.0) -> dict[str, Any]:
    """``actor.status()``, retried (a fresh call each time) while Ray restarts the actor or a worker group restarts
    on the call; an in-process actor answers at once."""
    ref = actor.status.remote()
    if isinstance(ref, LocalRef):
        return ref.get()
    import ray
    import ray.exceptions as rex

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return ray.get(ref)
        except (rex.ActorUnavailableError, rex.RayActorError, RankGroupDied):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
            ref = actor.status.remote()


class Driver:
    """Runs ``steps`` of mutual RL over a backend's actors (module docstring). Call :meth:`close` (or use ``with``)."""

    def __init__(
        self,
        specs: Sequence[PolicyActorSpec],
        problems_for_step: Callable[[int], Sequence[Any]],
        out_dir: str | Path,
        *,
        backend: LocalBackend | RayBackend,
        mode: Literal["sync", "async"] = "sync",
        max_staleness: int = 0,
        membership: dict[str, Membership] | None = None,
        on_step: Callable[[int, dict[str, dict[str, Any]], dict[str, dict[str, Any]]], None] | None = None,
        summary_file: str = "summary.json",
        on_leave: Callable[[str, Any], None] | None = None,
        start_step: int = 0,
        max_restarts: int = 3,
    ) -> None:
        if mode not in ("sync", "async"):
            raise ValueError(f"mode must be 'sync' or 'async', got {mode!r}")
        if max_staleness < 0 or (mode == "sync" and max_staleness != 0):
            raise ValueError(f"max_staleness must be 0 in sync mode and >= 0 in async mode, got {max_staleness}")
        self.out = Path(out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.problems_for_step = problems_for_step
        self.mode, self.k = mode, max_staleness
        self.backend = backend
        self.on_step = on_step
        self.on_leave = on_leave
        self.summary_file = summary_file
        backend.open(self.out)
        self.exchange = backend.exchange
        self.specs: dict[str, PolicyActorSpec] = {}
        self.membership: dict[str, Membership] = {}
        self.actors: dict[str, Any] = {}
        self.baselines: dict[str, int] = {}
        self.down: dict[str, int] = {}  # policy -> step of its failure
        self.causes: dict[str, str] = {}  # policy -> its last failure, in one line
        self.max_restarts = max_restarts
        self.streak: dict[str, int] = {}  # policy -> restarts since it last finished a step
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

    def _start_actor(self, name: str) -> Any:
        """The policy's actor, or its worker group of ``spec.ranks`` actors behind one handle, from the backend."""
        return self.backend.start(self.specs[name])

    def _stop(self, name: str) -> None:
        """Close the policy's worker (its engine's processes) and release its actor."""
        self.backend.stop(self.actors.pop(name), name)

    def _sync_membership(self, step: int) -> list[str]:
        """Start joiners, stop leavers, bring restarted actors back; returns the live policies (in the
        order they were added: the config's)."""
        live = []
        for name in self.specs:
            active = self.membership[name].active(step)
            if active and name not in self.actors:
                self.actors[name] = self._start_actor(name)
                st = wait_status(self.actors[name])
                self.backend.check_shared_dir(self.actors[name])  # every actor must see the run directory
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
                self._check_restarts(name, step)
                before = getattr(self.actors[name], "restarts", 0)
                st = wait_status(self.actors[name])  # waits for Ray's restart (a worker group restarts on it)
                self.streak[name] = self.streak.get(name, 0) + max(1, getattr(self.actors[name], "restarts", 0) - before)
                self._check_restarts(name, step, restarted=True)
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

    def _check_restarts(self, name: str, step: int, *, restarted: bool = False) -> None:
        """Stop the run (:class:`RestartLimit`) when ``name`` has used its ``max_restarts`` restarts without
        finishing a step (``restarted``: counting the restarts just made)."""
        n = self.streak.get(name, 0)
        if n > self.max_restarts or (not restarted and n >= self.max_restarts):
            raise RestartLimit(
                f"policy {name!r} failed at step {self.down.get(name, step)} ({self.causes.get(name, 'unknown cause')}) "
                f"after {n} restart(s) without finishing a step (runtime.max_restarts: {self.max_restarts}); the run "
                "stops: fix the cause, then resume the run directory")

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
        """The calls' results; a dead Ray actor's call is a ``gap`` (the policy sits the step out), any other
        error (an in-process call's included) is raised as it is."""
        ok = {}
        for name, ref in refs.items():
            try:
                ok[name] = resolve(ref)
                if phase == "train":  # a finished step: the policy's restarts count from zero again
                    self.streak.pop(name, None)
            except Exception as err:
                if not _is_actor_failure(err):
                    raise
                self.down.setdefault(name, step)
                self.causes[name] = f"{phase}: {_cause(err)}"
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
        self._run(steps)
        self.result.timings["run_s"] = self.result.timings.get("run_s", 0.0) + time.perf_counter() - t0
        (self.out / self.summary_file).write_text(json.dumps(
            {"steps": self.next_step, "mode": self.mode, "max_staleness": self.k, "backend": self.backend.name,
             "policies": sorted(self.actors), "events": self.result.events,
             "step_wall_s": self.result.step_wall_s}, indent=1))
        return self.result

    def _run(self, steps: int) -> None:
        """The schedule (module docstring): generation runs up to ``k`` steps ahead of training; with k = 0
        (sync) step ``s``'s training waits for every live policy's generation of ``s`` and its record counts."""
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

        for s in range(start, steps):
            live = self._sync_membership(s)
            for t in range(s, min(s + self.k + 1, steps)):  # the window; joiners / rejoiners catch up
                submit_gen(t, live)
            pids = [problem_id(p) for p in problems_cache.pop(s)]
            if self.k == 0:  # sync: the barrier, then every live policy trains on the step's records
                gens = self._collect(s, "generate", gen_refs.pop(s, {}))
                peers = sorted(gens)
                counts = {n: gens[n]["records"] for n in peers}
                refs = {n: self.actors[n].train.remote(s, pids, peers=peers, baselines=dict(self.baselines),
                                                       expect=counts) for n in live if n in gens}
                self._record(s, gens, self._collect(s, "train", refs))
                self.next_step = s + 1
                continue
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
            if t in train_refs:
                self._finish_async_step(t, gen_refs, train_refs)

    def _finish_async_step(self, t: int, gen_refs: dict, train_refs: dict) -> None:
        gens = self._collect(t, "generate", gen_refs.pop(t, {}))
        self._record(t, gens, self._collect(t, "train", train_refs.pop(t, {})))

    # -- inspection --------------------------------------------------------------------------
    def states(self) -> dict[str, Any]:
        return {n: resolve(a.state.remote()) for n, a in sorted(self.actors.items())}

    def close(self) -> None:
        try:
            for name in list(self.actors):
                self._stop(name)
        finally:
            self.backend.close()

    def __enter__(self) -> Driver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RayDriver(Driver):
    """The driver over Ray actors (:class:`~.backends.RayBackend`): ``placement`` (the MWRA plan) gives each
    policy its placement group; Ray must be initialised."""

    def __init__(self, specs: Sequence[PolicyActorSpec], problems_for_step: Callable[[int], Sequence[Any]],
                 out_dir: str | Path, *, placement: PlacementPlan | None = None, exchange_fsync: bool = True,
                 placement_timeout_s: float = 120.0, **kwargs: Any) -> None:
        super().__init__(specs, problems_for_step, out_dir, backend=RayBackend(
            placement=placement, placement_timeout_s=placement_timeout_s, exchange_fsync=exchange_fsync), **kwargs)

    @property
    def exchange_handle(self) -> Any:
        return self.backend.exchange_handle
