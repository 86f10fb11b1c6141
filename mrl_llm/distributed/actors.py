"""A policy's colocated actor: generate -> publish to the exchange, fetch -> plan (core) -> train, checkpoint.

The actor wraps a *policy worker* built by a factory named ``"module:function"`` (so Ray workers import
it instead of unpickling a closure): ``factory(name, config, seed) -> worker`` with

* ``worker.version`` — optimizer steps taken (the ``policy_version`` its records carry);
* ``worker.generate(problems, step) -> list[ExperienceRecord]``;
* ``worker.train_step(rows: LearnerRows) -> dict[str, float]`` (the core's rows of the step, with their records);
* ``worker.save_checkpoint(dir)`` / ``worker.load_checkpoint(dir)``.

The regime decisions come only from :func:`shared_interfaces.regimes.plan.plan_groups`, fed from the
exchange's groups; the actor decides nothing itself. Records reach the exchange and come back as
JSON, validated on receipt (:class:`~mrl_llm.distributed.exchange_actor.RemoteExchange`).

Staleness (bounded-staleness asynchronous mode): a record's *lag* is ``step - policy_version``; a
producer's *baseline lag* is its lag when it (re)joined the run (0 from the start; ``s - v`` after a
restart at step ``s`` from a checkpoint of version ``v``). Its staleness is ``lag - baseline``: how many
updates behind its producer's schedule it was generated. A learner sees a peer's record only when
staleness ``<= max_staleness`` (stale ones are counted, never silently used); its own records always.

Peers' claims: a worker with a ``check_peer_records(records) -> {record_id: outcome}`` re-checks every
record the learner fetches before it is planned with (:mod:`mrl_llm.peer_check`); the dropped ones are
counted per outcome in the train result (``peer_verdict_rejected``, ``peer_reward_refused``).

Checkpoints: ``<checkpoint_dir>/step_<s>/`` (the worker's files, their ``manifest.json`` of digests —
:func:`mrl_llm.runstate.write_manifest` — then ``actor.json``) and a ``LATEST`` pointer written last; a
(re)started actor verifies and loads ``LATEST`` if present, so Ray's restart of a dead actor (or a worker
group's restart of all its ranks, :mod:`.rank_group`) brings it back with its last checkpoint's weights (a checkpoint that fails its manifest is a
:class:`~mrl_llm.runstate.CheckpointError` naming the file).
"""

from __future__ import annotations

import importlib
import json
import os
import random
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mrl_llm.runstate import CheckpointError, verify_checkpoint, write_manifest
from shared_interfaces.exchange import ExperienceExchange
from shared_interfaces.records import ExperienceRecord, PromptGroup
from shared_interfaces.regimes.config import RegimeSpec, parse_regime_config
from shared_interfaces.regimes.plan import plan_groups
from shared_interfaces.regimes.rows import LearnerRows

#: The phases a :class:`FaultInjection` can crash in.
FAULT_PHASES = ("generate", "train")


@dataclass(frozen=True)
class FaultInjection:
    """Crash the actor's process (``os._exit``) in ``phase`` (``generate``/``train``) of ``step``, once:
    a marker file in the checkpoint directory keeps the restarted process from crashing again. In a worker
    group only rank ``rank`` crashes (in ``train``: before its update, so the other ranks are left in the
    update's collectives); a single-rank policy is rank 0."""

    step: int
    phase: str = "train"
    rank: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.step, bool) or not isinstance(self.step, int) or self.step < 0:
            raise ValueError(f"fault injection: step must be an integer >= 0, got {self.step!r}")
        if self.phase not in FAULT_PHASES:
            raise ValueError(f"fault injection: phase must be one of {list(FAULT_PHASES)}, got {self.phase!r}")
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 0:
            raise ValueError(f"fault injection: rank must be an integer >= 0, got {self.rank!r}")


@dataclass(frozen=True)
class PolicyActorSpec:
    """Everything a policy actor is created from (plain data, so Ray can ship it)."""

    name: str
    factory: str  # "package.module:function"
    config: Mapping[str, Any]
    seed: int
    regime: Mapping[str, Any]  # a regime section, e.g. {"name": "sgt+xgrpo", "sgt": {...}}
    checkpoint_dir: str
    checkpoint_every: int = 1
    threads: int = 1
    fault: FaultInjection | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    ranks: int = 1  # the policy's worker-group size (mrl_llm.distributed.rank_group); config["group"]: this rank
    role: str = "colocated"  # colocated | train | rollout (placement: split, mrl_llm.distributed.split_group)
    rollouts: int = 1  # split: the policy's rollout actors; rollout_rank: this one's index among them
    rollout_rank: int = 0

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"policy {self.name!r}: actor role must be one of {ROLES}, got {self.role!r}")
        if not 0 <= self.rollout_rank < self.rollouts:
            raise ValueError(f"policy {self.name!r}: rollout_rank {self.rollout_rank} is not in [0, {self.rollouts})")
        if self.fault is not None and self.fault.rank >= self.ranks:
            raise ValueError(f"policy {self.name!r}: the fault injection names rank {self.fault.rank}, but the policy "
                             f"has {self.ranks} rank(s) (0..{self.ranks - 1}); name one of its ranks")


ROLES = ("colocated", "train", "rollout")


def load_factory(path: str) -> Any:
    mod, sep, fn = path.partition(":")
    if not sep:
        raise ValueError(f"worker factory {path!r} must look like 'package.module:function'")
    try:
        return getattr(importlib.import_module(mod), fn)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"worker factory {path!r} cannot be imported ({err}); is the package installed?") from err


def limit_tokenizer_threads(threads: int) -> None:
    """Keep the Rust tokenizers' thread pool to the actor's CPUs, as ``torch.set_num_threads`` does for
    torch: their batch encode/decode otherwise spreads over every core of the node, on top of the
    other actors (unless the user set ``TOKENIZERS_PARALLELISM`` / ``RAYON_NUM_THREADS`` already)."""
    os.environ.setdefault("RAYON_NUM_THREADS", str(max(1, threads)))
    if threads <= 1:
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


#: A worker's generation counters and the keys of a ``generate`` answer's ``timings`` that hold the step's amount
#: (:meth:`~mrl_llm.rank.rollouts.RolloutStats.metrics`): a policy whose samples another actor drew (a split
#: policy's rollout actors, another rank of a worker group) adds them to its own counters with :func:`count_generated`.
GEN_COUNTERS = {"samples": "samples", "gen_tokens": "gen_tokens", "prompt_tokens": "prompt_tokens", "flops": "gen_flops"}


def count_generated(counters: dict[str, float] | None, timings: Mapping[str, Any] | None) -> None:
    """Add a ``generate`` answer's ``timings`` (one step's samples, tokens and FLOPs; :data:`GEN_COUNTERS`) to a
    worker's ``counters``, in place; nothing for a worker without counters or an empty answer."""
    if counters is None or not timings:
        return
    for key, src in GEN_COUNTERS.items():
        counters[key] = counters.get(key, 0) + float(timings.get(src, 0.0))


#: What a learner's peer-record check may drop records as (:mod:`mrl_llm.peer_check`), counted per step.
PEER_CHECK_OUTCOMES = ("peer_verdict_rejected", "peer_reward_refused")


def problem_id(problem: Any) -> str:
    return str(getattr(problem, "prompt_id", problem))


def plan_rng(seed: int, step: int, policy: str) -> np.random.Generator:
    """SGT ``random`` selection's generator: a function of (seed, step, learner), not of scheduling."""
    return np.random.default_rng([seed, step, sum(policy.encode())])


def fetch_learner_rows(exchange: ExperienceExchange, learner: str, regime: RegimeSpec, prompt_ids: Sequence[str],
                  step: int, *, present: Iterable[str], baselines: Mapping[str, int] | None = None,
                  max_staleness: int = 0, seed: int = 0,
                  own: Sequence[ExperienceRecord] | None = None,
                  expect: Mapping[str, int] | None = None,
                  timings: dict[str, float] | None = None,
                  vet: Callable[[list[ExperienceRecord]], Mapping[str, str]] | None = None,
                  counts: dict[str, int] | None = None) -> tuple[LearnerRows, int]:
    """One learner's step decisions: fetch each prompt's group from the exchange, keep the records of the
    ``present`` policies (a peer record staler than ``max_staleness`` is dropped and counted; the
    learner's own records always stay), and plan with the core. Returns ``(rows, stale_dropped)``: the
    learner's :class:`~shared_interfaces.regimes.rows.LearnerRows`, prompt by prompt in ``prompt_ids``
    order (``rows.prompt`` indexes ``prompt_ids``). The Ray actors, the single-process trainer and the
    contract backend all call this one function.

    ``own``: the learner's own records of ``step`` when it still holds them (it published them): then
    only the peers' records are fetched and the two are merged, which gives the same groups (a group's
    order is canonical) for half the transfer and decoding. ``expect`` (``{peer: n_records}``, a remote
    exchange with pipelined publishing only) makes the fetch wait until the peers' records of ``step``
    are in. ``timings`` (when given) gets the seconds spent fetching (``fetch_s``), re-checking peers'
    claims (``peer_check_s``) and planning (``plan_s``).

    ``vet`` (the worker's ``check_peer_records``, :mod:`mrl_llm.peer_check`) is given every record that
    came out of the exchange and survived the filters above (not the learner's own records in hand) and
    returns ``{record_id: outcome}`` for those to leave out of planning; ``counts`` (when given) counts
    them by outcome."""
    t0 = time.perf_counter()
    present = set(present)
    baselines = baselines or {}
    learners = sorted(present)
    if own is None:
        groups = exchange.fetch_groups(list(prompt_ids), step, **({"expect": dict(expect)} if expect else {}))
    else:
        foreign = [r.record_id for r in own if r.policy_id != learner or r.step != step]
        if foreign:
            raise ValueError(f"fetch_learner_rows(own=...) got records of another policy or step: {foreign[:3]}")
        mine: dict[str, list[ExperienceRecord]] = {p: [] for p in prompt_ids}
        for r in own:
            if r.prompt_id in mine:
                mine[r.prompt_id].append(r)
        wait = {"expect": dict(expect)} if expect else {}
        peers = exchange.fetch_groups(list(prompt_ids), step, requester=learner, include_own=False, **wait)
        groups = {p: PromptGroup(p, step, peers[p].records + tuple(mine[p])) for p in prompt_ids}
    t1 = time.perf_counter()
    kept, stale = [], 0
    for pid in prompt_ids:
        g = groups[pid]
        keep = []
        for r in g.records:
            if r.policy_id not in present:
                continue
            if r.policy_id != learner and (r.step - r.policy_version) - baselines.get(r.policy_id, 0) > max_staleness:
                stale += 1
                continue
            keep.append(r)
        kept.append(type(g)(g.prompt_id, g.step, tuple(keep)))
    t2 = time.perf_counter()
    if vet is not None:
        in_hand = {r.record_id for r in own} if own is not None else set()
        fetched = [r for g in kept for r in g.records if r.record_id not in in_hand]
        dropped = vet(fetched) if fetched else {}
        if dropped:
            kept = [type(g)(g.prompt_id, g.step, tuple(r for r in g.records if r.record_id not in dropped))
                    for g in kept]
        if counts is not None:
            for outcome in dropped.values():
                counts[outcome] = counts.get(outcome, 0) + 1
    t3 = time.perf_counter()
    rows = plan_groups(kept, learners, regime, learner=learner, rng=lambda: plan_rng(seed, step, learner))
    if timings is not None:
        timings.update(fetch_s=t1 - t0, peer_check_s=t3 - t2, plan_s=time.perf_counter() - t3 + (t2 - t1))
    return rows, stale


class PolicyActor:
    """The body of one policy's actor (Ray wraps it with ``ray.remote``; the in-process backend with
    :class:`~mrl_llm.distributed.handles.LocalHandle`)."""

    def __init__(self, spec: PolicyActorSpec, exchange: ExperienceExchange) -> None:
        import torch

        torch.set_num_threads(max(1, spec.threads))
        limit_tokenizer_threads(spec.threads)
        self.spec = spec
        self.rank = int((spec.config.get("group") or {}).get("rank", 0))  # rank 0 writes checkpoints
        # a worker group with per-sample seeds (the default) splits the step's prompts over its ranks; else rank 0
        # samples all
        from mrl_llm.config import SamplingSection

        sampling = (spec.config.get("policy") or {}).get("sampling") or {}
        self.sample_seeded = sampling.get("seeding", SamplingSection.seeding) == "sample"
        self.split_rollouts = spec.ranks > 1 and self.sample_seeded
        self.exchange = exchange
        self.regime = parse_regime_config(dict(spec.regime))
        random.seed(spec.seed)
        np.random.seed(spec.seed % 2**32)
        torch.manual_seed(spec.seed)
        self.worker = load_factory(spec.factory)(spec.name, dict(spec.config), spec.seed)
        self.ckpt = Path(spec.checkpoint_dir)
        self._own: dict[int, list[ExperienceRecord]] = {}  # step -> own published records, until trained on
        self._publishing: dict[int, Any] = {}  # step -> the pending publish (a remote exchange's ObjectRef)
        self.restored_step: int | None = None
        latest = self.ckpt / "LATEST"
        if latest.is_file():
            d = self.ckpt / latest.read_text().strip()
            meta = verify_checkpoint(d)
            try:
                self.worker.load_checkpoint(str(d))
            except CheckpointError:
                raise
            except Exception as err:  # verified bytes that still do not load: name the checkpoint
                first = str(err).strip().splitlines()[0] if str(err).strip() else ""
                raise CheckpointError(f"checkpoint {d} of policy {spec.name!r} cannot be loaded "
                                      f"({type(err).__name__}: {first})") from err
            self.restored_step = meta["step"]

    # -- fault injection (tests) -------------------------------------------------------------
    def _maybe_crash(self, phase: str, step: int) -> None:
        f = self.spec.fault
        if f is None or f.phase != phase or f.step != step or f.rank != self.rank:
            return
        marker = self.ckpt / f".crashed-{phase}-{step}-rank{f.rank}"
        if marker.exists():
            return
        self.ckpt.mkdir(parents=True, exist_ok=True)
        marker.write_text("1")
        os._exit(17)  # a hard crash: no cleanup, no exception

    # -- the step ----------------------------------------------------------------------------
    def generate(self, problems: Sequence[Any], step: int) -> dict[str, Any]:
        """Sample this step's records and publish them; returns what the driver tracks. In a worker group every
        rank renders all the step's prompts and keeps its problems for the peer check (``worker.prepare``), so
        the ranks' plans are equal; rank ``r`` samples and publishes prompts ``r, r + k, ...`` with
        ``sampling.seeding: sample`` (a record does not depend on the split), else rank 0 samples them all; then the
        ranks meet at a store barrier (:meth:`~mrl_llm.parallel.group.WorkerGroup.wait_for_ranks`: a rank that
        sampled nothing does not wait out rank 0's rollout inside a collective's timeout) and all-gather their
        records (a collective), so that each trains on the policy's records in hand as a single
        rank does (fetching only the peers'; its own group's records are not re-checked). A split policy's trainer
        samples nothing; its rollout actors share the prompts the same way (module docstring)."""
        nothing = {"policy": self.spec.name, "step": step, "version": int(self.worker.version), "records": 0,
                   "timings": {}}
        if self.spec.role == "train":  # split pools: the rollout actors sample; a trainer keeps what it needs
            prepare = getattr(self.worker, "prepare", None)  # (a worker that renders prompts has it)
            if prepare is not None:
                prepare(list(problems))
            return nothing
        if self.spec.role == "rollout" and self.spec.rollouts > 1:  # the same split as a worker group's ranks
            r, m = self.spec.rollout_rank, self.spec.rollouts
            problems = list(problems)[r::m] if self.sample_seeded else (list(problems) if r == 0 else [])
            if not problems:
                return nothing
        elif self.spec.ranks > 1:
            self.worker.prepare(list(problems))
            problems = list(problems)[self.rank::self.spec.ranks] if self.split_rollouts else (
                list(problems) if self.rank == 0 else [])
        group = getattr(self.worker, "group", None) if self.spec.ranks > 1 else None
        sampled = bool(problems) or self.spec.ranks == 1
        recs = self.worker.generate(list(problems), step) if sampled else []
        self._maybe_crash("generate", step)
        bad = [r.record_id for r in recs if r.policy_id != self.spec.name or r.step != step]
        if bad:
            raise ValueError(f"policy {self.spec.name!r} produced records for another policy/step: {bad[:3]}")
        if not sampled and group is None:
            return nothing
        timings = dict(getattr(self.worker, "last_generate", None) or {}) if sampled else {}
        t0 = time.perf_counter()
        if sampled:
            submit = getattr(self.exchange, "publish_async", None)
            if submit is not None:  # a remote exchange: train() waits for the write (pipelined publishing)
                self._publishing[step] = submit(recs, step)
            else:
                self.exchange.publish(recs)
            timings["publish_s"] = time.perf_counter() - t0
        # kept for this step's training, which then fetches only the peers' records (not after a restart); every
        # rank of a worker group holds all of the policy's records of the step (one all-gather of the ranks' shares)
        if group is not None:  # with the ranks' counts: every rank's counters are the policy's
            t1 = time.perf_counter()
            # the ranks that sampled less (all but rank 0 under seeding: call) wait here, outside any collective
            # (a store barrier with no time limit): the all-gather then never waits out a rollout
            group.wait_for_ranks(f"generate/{step}")
            parts = group.gather_objects((recs, timings))
            self._own[step] = [r for part, _ in parts for r in part]
            for r, (_, theirs) in enumerate(parts):
                if r != self.rank:
                    count_generated(getattr(self.worker, "counters", None), theirs)
            timings["own_gather_s"] = time.perf_counter() - t1
        else:
            self._own[step] = list(recs)
        return {"policy": self.spec.name, "step": step, "version": int(self.worker.version),
                "records": len(recs), "timings": timings}

    def train(self, step: int, prompt_ids: Sequence[str], *, peers: Sequence[str], ready: Sequence[Any] | None = None,
              baselines: Mapping[str, int] | None = None, max_staleness: int = 0,
              expect: Mapping[str, int] | None = None,
              rollouts: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Train on this step's groups with the records of ``peers`` (self included).

        ``rollouts``: a split policy's trainer gets its rollout actors' ``generate`` answer of the step (summed),
        whose samples, tokens and FLOPs go into its counters (:func:`count_generated`), as a colocated actor counts
        its own in ``generate``; the counters are the policy's in its rows, its summary and its checkpoints.

        ``ready`` (bounded-staleness mode) are the peers' generate results (Ray object refs, nested so Ray
        does not resolve them eagerly, or in-process :class:`~mrl_llm.distributed.handles.LocalRef`): a peer
        whose generate failed is left out of this step (a gap). In sync mode ``None``; then ``expect`` may
        give each peer's record count of the step (the driver has their generate results), which a remote
        exchange waits for before answering the fetch.
        """
        t0 = time.perf_counter()
        if rollouts is not None:
            count_generated(getattr(self.worker, "counters", None), rollouts.get("timings"))
        present = set(peers)
        counts = dict(expect or {})
        wait = 0.0
        if ready is not None:
            from mrl_llm.distributed.handles import resolve

            present = set()
            for ref in ready:
                try:
                    got = resolve(ref)
                except Exception:  # the peer died in this step: it simply has no records here
                    continue
                present.add(got["policy"])
                counts[got["policy"]] = got["records"]
            present.add(self.spec.name)
            wait = time.perf_counter() - t0  # waiting for the peers' generation, not exchange work
        t_pub = time.perf_counter()
        pending = self._publishing.pop(step, None)
        if pending is not None:
            import ray

            ray.get(pending)  # this policy's records are in the exchange (a refused publish raises here)
        for k in [k for k in self._publishing if k < step]:
            del self._publishing[k]
        publish_wait = time.perf_counter() - t_pub
        own = self._own.pop(step, None)
        for k in [k for k in self._own if k < step]:
            del self._own[k]
        parts: dict[str, float] = {"publish_wait_s": publish_wait}
        expect_peers = {p: n for p, n in counts.items() if p in present and p != self.spec.name}
        if self.spec.role == "train" or (self.spec.ranks > 1 and getattr(self.worker, "group", None) is None):
            own = None  # the own records came from other actors: fetch them
            expect_peers = {p: n for p, n in counts.items() if p in present}
        if getattr(self.exchange, "publish_async", None) is None:  # in-process: every record is in already
            expect_peers = {}
        dropped: dict[str, int] = dict.fromkeys(PEER_CHECK_OUTCOMES, 0)
        rows, stale = fetch_learner_rows(self.exchange, self.spec.name, self.regime, prompt_ids, step, own=own,
                                         timings=parts, present=present, baselines=baselines,
                                         max_staleness=max_staleness, seed=self.spec.seed, expect=expect_peers,
                                         vet=getattr(self.worker, "check_peer_records", None), counts=dropped)
        learners = sorted(present)
        self._maybe_crash("train", step)
        t1 = time.perf_counter()
        metrics = dict(self.worker.train_step(rows))
        t2 = time.perf_counter()
        if self.spec.checkpoint_every > 0 and (step + 1) % self.spec.checkpoint_every == 0:
            self.save(step)
        counters = getattr(self.worker, "counters", None)
        return {"policy": self.spec.name, "step": step, "version": int(self.worker.version),
                "peers": learners, "stale_dropped": stale, **dropped, "metrics": metrics,
                "timings": {"fetch_plan_s": t1 - t0 - wait, "peer_wait_s": wait, "train_step_s": t2 - t1, **parts},
                "counters": dict(counters) if counters is not None else {}}

    def save(self, step: int) -> str:
        d = self.ckpt / f"step_{step}"
        d.mkdir(parents=True, exist_ok=True)
        self.worker.save_checkpoint(str(d))  # a worker group: every rank gathers, rank 0 writes
        if self.rank != 0:
            return str(d)
        write_manifest(d)
        (d / "actor.json").write_text(json.dumps({"step": step, "version": int(self.worker.version)}))
        tmp = self.ckpt / "LATEST.tmp"
        tmp.write_text(d.name)
        os.replace(tmp, self.ckpt / "LATEST")
        return str(d)

    def weights(self) -> dict[str, Any] | None:
        """The full current weights (CPU tensors, floating-point ones in the rollout engine's dtype:
        :meth:`_wire_dtype`) and version, for a split policy's rollout actors: rank 0's rollout copy, which took the
        gathered weights right after the update (``sync_engine``; for k > 1 it lives in host memory on a trainer
        rank), so no collective; the other ranks answer ``None``. ``reference``: the trainers' drift-probe
        log-probs (:meth:`_reference`)."""
        if self.rank != 0:
            return None
        wire = self._wire_dtype()
        state = {n: t.detach().to("cpu", wire if wire is not None and t.is_floating_point() else t.dtype)
                 for n, t in self.worker.rollout_model.state_dict().items()}
        return {"state": state, "version": int(self.worker.version), "reference": self._reference()}

    def _wire_dtype(self) -> Any:
        """The dtype floating-point weights travel in to the rollout actors: their engine's
        (:func:`mrl_llm.rank.engine.transfer_dtype`); None for a worker without a policy config (its own dtypes)."""
        from mrl_llm.rank.engine import transfer_dtype

        policy = getattr(self.worker, "policy", None)
        return None if policy is None else transfer_dtype(policy)

    def _reference(self) -> Any:
        """The trainers' probe log-probs of the previous and this sync, for the rollout actors' reload check
        (:meth:`mrl_llm.rank.engine.RankEngine.check_received`); None when the policy runs no drift check."""
        sampler = getattr(self.worker, "sampler", None)
        return None if sampler is None else sampler.reference

    def load_weights(self, payload: Mapping[str, Any]) -> dict[str, Any]:
        """Take the trainers' weights (:meth:`weights`) into this rollout actor's model and engine (a vllm engine
        reloads them and runs its drift check: a :class:`~mrl_llm.rollout.DriftError` above its threshold);
        its records then carry the trainers' version. Returns ``{"version", "metrics"}``: the metrics are
        ``sync_s`` (the load's seconds) and the engine's drift check (``worker.drift_metrics()``, when it has one)."""
        self._rollout_only("load_weights")
        t0 = time.perf_counter()
        before = self._probe_now(payload.get("reference"))
        return self._take_weights(payload["state"], int(payload["version"]), t0, payload.get("reference"), before,
                                  engine_state=None if self._hf_engine() else payload["state"])

    # -- the weight bus (placement: split, runtime.weight_transfer: collective) -----------------------------
    def join_bus(self, bus: Mapping[str, Any]) -> bool:
        """Join the policy's weight bus (:mod:`mrl_llm.parallel.weight_bus`; ``bus``: its
        :class:`~mrl_llm.parallel.group.GroupSpec` as a mapping): the trainers' rank 0 as the source (bus rank 0),
        rollout actor ``r`` as bus rank ``1 + r``; the other trainer ranks are not members (``False``). Every
        member must call it at the same time: it blocks until all have joined."""
        from mrl_llm.parallel.group import GroupSpec
        from mrl_llm.parallel.weight_bus import WeightBus

        if self.spec.role == "rollout":
            rank = 1 + self.spec.rollout_rank
        elif self.rank == 0:
            rank = 0
        else:
            return False
        self.bus = WeightBus.join(GroupSpec(**{**dict(bus), "rank": rank}))
        return True

    def push_weights(self) -> dict[str, Any] | None:
        """The trainers' rank 0: broadcast its rollout copy (the whole updated model, :meth:`weights`) and version
        over the bus, to every rollout actor's :meth:`pull_weights`; the other ranks answer ``None``."""
        if self.rank != 0:
            return None
        import torch

        bus = self._bus("push_weights")
        t0 = time.perf_counter()
        ref = self._reference()
        extra = None if ref is None else torch.tensor([x for lps in ref for row in lps for x in row], dtype=torch.float64)
        n = bus.send(self.worker.rollout_model.state_dict(), int(self.worker.version), extra=extra,
                     dtype=self._wire_dtype())
        return {"broadcasts": n, "push_s": time.perf_counter() - t0}

    def pull_weights(self) -> dict[str, Any]:
        """A rollout actor: receive the trainers' :meth:`push_weights` and take them as :meth:`load_weights` does
        (same answer; ``sync_s`` includes the broadcast)."""
        self._rollout_only("pull_weights")
        t0 = time.perf_counter()
        bus = self._bus("pull_weights")
        sampler = getattr(self.worker, "sampler", None)
        before = None if sampler is None or sampler.probe is None else sampler.engine_logprobs()
        keep: dict[str, Any] | None = None if self._hf_engine() else {}  # a vLLM engine loads them as received
        version = bus.recv_into(self.worker.model.state_dict(), dtype=self._wire_dtype(), keep=keep)  # in place
        reference = None
        if bus.last_extra is not None and before is not None:  # the trainers' probe log-probs: old, then new
            flat = bus.last_extra.tolist()
            shape = [len(row) for row in before]
            if len(flat) != 2 * sum(shape):
                raise RuntimeError(f"policy {self.spec.name!r}: the trainers sent {len(flat)} probe log-probs, this "
                                   f"rollout actor's probe has 2 x {sum(shape)}: trainers and rollout actors must "
                                   "share the policy's drift settings")
            rows, at = [], 0
            for n in shape * 2:
                rows.append(flat[at:at + n])
                at += n
            reference = (rows[:len(shape)], rows[len(shape):])
        return self._take_weights(None, version, t0, reference, before, engine_state=keep)

    def _hf_engine(self) -> bool:
        """Whether this rollout actor's engine samples from its model (HF), not from weights of its own (vLLM)."""
        sampler = getattr(self.worker, "sampler", None)
        return sampler is None or sampler.engine is None or sampler.samples_rollout

    def _probe_now(self, reference: Any) -> list[list[float]] | None:
        """This rollout actor's engine's probe log-probs before new weights arrive (None: nothing to check)."""
        sampler = getattr(self.worker, "sampler", None)
        if reference is None or sampler is None or sampler.probe is None:
            return None
        return sampler.engine_logprobs()

    def _bus(self, method: str) -> Any:
        bus = getattr(self, "bus", None)
        if bus is None:
            raise RuntimeError(f"policy {self.spec.name!r}: {method} needs the weight bus; join_bus first "
                               "(runtime.weight_transfer: collective under placement: split)")
        return bus

    def _rollout_only(self, method: str) -> None:
        if self.spec.role != "rollout":
            raise RuntimeError(f"policy {self.spec.name!r}: {method} is for rollout actors, this one is "
                               f"{self.spec.role}")

    def _take_weights(self, state: Mapping[str, Any] | None, version: int, t0: float, reference: Any = None,
                      before: list[list[float]] | None = None, engine_state: Mapping[str, Any] | None = None
                      ) -> dict[str, Any]:
        """Load ``state`` (None: the model has them already) and ``version``; sync the engine (drift check) —
        a vLLM engine straight from ``engine_state``, the weights as received in its dtype; with the trainers' probe
        log-probs ``reference`` and this engine's ``before`` the weights arrived, the reload check of the engine
        against the trainers (:meth:`~mrl_llm.rank.engine.RankEngine.check_received`)."""
        from mrl_llm.parallel.fsdp import load_full_state_dict

        if state is not None:
            load_full_state_dict(self.worker.model, state)
        self.worker.version = version
        if engine_state is not None:
            self.worker.sync_engine(engine_state)
        else:
            self.worker.sync_engine()
        if reference is not None and before is not None:
            self.worker.sampler.check_received(before, reference, version=version)
        drift = getattr(self.worker, "drift_metrics", None)
        metrics = {"sync_s": time.perf_counter() - t0, **(drift() if callable(drift) else {})}
        return {"version": int(self.worker.version), "metrics": metrics}

    def probe_run_dir(self, run_dir: str, token: str) -> dict[str, Any]:
        """Whether this actor's node sees the driver's run directory (:mod:`mrl_llm.distributed.shared_dir`)."""
        from mrl_llm.distributed.shared_dir import probe

        who = f"rollout-{self.spec.rollout_rank}" if self.spec.role == "rollout" else self.rank
        return probe(run_dir, token, self.spec.name, who)

    def status(self) -> dict[str, Any]:
        """Who the actor is and where it stands: its policy's version, the checkpoint step it restored (None:
        none) and the worker's compute counters (restored with its checkpoint)."""
        counters = getattr(self.worker, "counters", None)
        return {"policy": self.spec.name, "version": int(self.worker.version), "pid": os.getpid(),
                "restored_step": self.restored_step, "counters": dict(counters) if counters is not None else {}}

    # -- pass-throughs for the trainer (workers that have them) ----------------------------------
    def evaluate(self, problems: Sequence[Any], **kwargs: Any) -> list[dict[str, Any]]:
        """``worker.evaluate(problems, **kwargs)`` (the eval protocol's rows)."""
        return self.worker.evaluate(list(problems), **kwargs)

    def export(self, out_dir: str) -> str:
        """``worker.export(out_dir)``: the policy as a model directory."""
        return str(self.worker.export(out_dir))

    def close(self) -> None:
        """Release the worker's resources (``worker.close()``: verifier processes, the rollout engine) and leave the
        weight bus."""
        bus, self.bus = getattr(self, "bus", None), None
        if bus is not None:
            bus.close()
        fn = getattr(self.worker, "close", None)
        if callable(fn):
            fn()

    def state(self) -> dict[str, Any]:
        """The worker's comparable state (``worker.state()`` when it has one), for equality checks."""
        fn = getattr(self.worker, "state", None)
        return fn() if callable(fn) else {"version": int(self.worker.version)}
