"""The MWRA placement planner: policies x cluster -> who runs where, with per-device memory estimates.

Layouts (``mode``):

* ``colocated`` — rollout and training share GPUs. With ``n_gpus >= P`` each policy gets whole GPUs,
  apportioned by step cost ``N * rollouts * seq_len`` (largest remainder, at least one each), trains
  FSDP-sharded over them and runs one rollout engine per GPU (on a cluster of mixed GPUs the policies that need
  most memory on one GPU take the largest GPUs first). With ``n_gpus < P`` policies share GPUs:
  each goes to the least-loaded GPU (most free memory) and holds a fraction of it equal to its share of
  that GPU's estimated memory (fractional GPUs for small models).
* ``split`` — separate pools: each policy gets at least 2 whole GPUs, half (rounded down) for its rollout
  engines and the rest for its trainer (the largest GPUs first, as in ``colocated``). Preferred for asynchronous
  training, where generation and training overlap; ``colocated`` is preferred for synchronous steps, where
  they alternate. On a cluster without GPUs (``mode="split"`` asked for) the pools are CPU slots: each policy
  gets ``ranks`` trainer slots (its shards) and ``ranks`` rollout slots (an engine each, with a full copy of the
  weights), each on the node with most free RAM, and its CPUs are shared over all of them as in ``cpu`` mode.
* ``cpu`` — no GPUs: each policy gets ``ranks`` CPU slots (its worker group, ``policies[].ranks``), each on
  the node with most free RAM, and its share of CPUs split over them (whole CPUs, largest remainder, at least
  one each, or with fewer CPUs than slots a fractional share and one thread). A rank holds its shard of the
  training state and a full rollout copy.

Memory is estimated per device (:mod:`mrl_llm.distributed.memory`) and must fit in
``usable_fraction`` of it. Rollout concurrency (sequences in flight per engine) starts at
``min(ceil(rollouts_per_step / engines), max_num_seqs)`` and is scaled down until the KV cache fits, as
vLLM does; a device that cannot hold one sequence per engine makes the plan infeasible, and the
:class:`~shared_interfaces.mwra.AllocationError` says which device, for which policies, by how much.
The driver and the exchange actor reserve no CPU (they mostly wait on the policy actors).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from mrl_llm.distributed.cluster import ClusterSpec, Device
from mrl_llm.distributed.memory import (
    DTYPE_BYTES,
    GiB,
    MemoryBreakdown,
    PolicyFootprint,
    autocast_cache_bytes,
    checkpoint_host_bytes,
    full_model_bytes,
    kv_bytes_per_sequence,
    rollout_bytes,
    sampling_bytes_per_sequence,
    sync_copy_bytes,
    training_bytes,
)
from shared_interfaces.mwra import AllocationError, AllocationPlan, PolicyAllocation

PlanMode = Literal["auto", "colocated", "split", "cpu"]
HINTS = (
    "try: more or larger GPUs (--cluster), --mode split/colocated, a smaller micro_batch, "
    "gradient checkpointing, bf16, or a shorter max_response_len"
)


@dataclass(frozen=True)
class DevicePart:
    """What one policy puts on one device in one role (``colocated``, ``train``, ``rollout``, ``cpu``,
    ``host``)."""

    policy: str
    role: str
    memory: MemoryBreakdown


@dataclass(frozen=True)
class DeviceLoad:
    device: Device
    usable_bytes: float
    parts: tuple[DevicePart, ...]

    @property
    def used_bytes(self) -> float:
        return sum(p.memory.total for p in self.parts)


@dataclass(frozen=True)
class PolicyPlacement:
    """Where one policy runs. ``bundles`` are its Ray placement-group bundles (strategy PACK)."""

    policy: str
    train_devices: tuple[str, ...]
    rollout_devices: tuple[str, ...]
    num_gpus: float
    num_cpus: float
    threads: int
    bundles: tuple[dict[str, float], ...]
    rollouts_per_step: int
    rollout_concurrency: int
    rollout_waves: int
    share: float
    bundle_roles: tuple[str, ...] = ()  # per bundle: colocated | train | rollout | cpu (one Ray actor, one rank)
    bundle_devices: tuple[str, ...] = ()  # per bundle: the device it is planned on
    training: str = ""  # how its trainer ranks share the model (:func:`training_layout`)

    def rank_roles(self) -> list[str]:
        """One line per bundle: the rank that runs there, its role, device and resources."""
        what = {"colocated": "train + rollout", "cpu": "train + rollout (CPU)", "train": "train", "rollout": "rollout"}
        if self.bundles and not any("GPU" in b for b in self.bundles):  # CPU slots of split pools
            what |= {"train": "train (CPU)", "rollout": "rollout (CPU)"}
        return [f"{self.policy} rank {r}/{len(self.bundles)}: {what.get(role, role)} on {dev}, "
                + ", ".join(f"{v:.2f} {k}" for k, v in sorted(b.items()))
                for r, (role, dev, b) in enumerate(zip(self.bundle_roles, self.bundle_devices, self.bundles, strict=True))]

    def plan_lines(self) -> list[str]:
        """What the plan prints and the run logs for this policy: :meth:`rank_roles`, then how it trains."""
        return [*self.rank_roles(), f"{self.policy} trains {self.training}"]


def hints(policies: Sequence[tuple[PolicyFootprint, int]]) -> str:
    """:data:`HINTS`, and for each ``(policy, trainer ranks)`` on a device that does not fit, the layout setting that
    would cost less there: FSDP2 shards instead of whole replicas, per-layer units instead of one, gradients
    reduce-scattered every micro-batch instead of kept gathered."""
    extra = []
    for fp, n_train in policies:
        if n_train <= 1:
            continue
        if fp.fsdp_unit == "none":
            extra.append(f"train.fsdp_unit: layer for {fp.name} (FSDP2 shards, not {n_train} whole replicas)")
        elif fp.grad_sync == "mini_batch":
            extra.append(f"train.grad_sync: micro_batch for {fp.name} (its units resharded after each pass)")
        elif fp.fsdp_unit == "model":
            extra.append(f"train.fsdp_unit: layer for {fp.name} (one layer gathered at a time)")
    return HINTS + "".join(f"; or {e}" for e in extra)


def training_layout(fp: PolicyFootprint, n_train: int) -> str:
    """How ``n_train`` trainer ranks of ``fp`` hold the model (``train.fsdp_unit``, ``train.grad_sync``), in words."""
    if n_train <= 1:
        return "in one process (no sharding)"
    if fp.fsdp_unit == "none":
        return f"as {n_train} whole replicas (gradients all-reduced once a mini-batch)"
    unit = "a unit per decoder layer" if fp.fsdp_unit == "layer" else "the whole model one unit"
    sync = ("kept gathered through a mini-batch, gradients reduce-scattered once a mini-batch"
            if fp.grad_sync == "mini_batch" else "gradients reduce-scattered every micro-batch")
    return f"FSDP2-sharded over {n_train} ranks ({unit}; {sync})"


@dataclass(frozen=True)
class PlacementPlan:
    cluster: ClusterSpec
    mode: Literal["colocated", "split", "cpu"]
    policies: tuple[PolicyPlacement, ...]
    devices: tuple[DeviceLoad, ...]

    def for_policy(self, name: str) -> PolicyPlacement:
        for p in self.policies:
            if p.policy == name:
                return p
        raise KeyError(f"no placement for policy {name!r}; planned: {[p.policy for p in self.policies]}")

    def allocation(self) -> AllocationPlan:
        """The plan as the core's MWRA contract type."""
        return AllocationPlan(
            mode=self.mode,
            allocations=tuple(
                PolicyAllocation(p.policy, p.num_gpus, max(1, round(p.num_cpus)), p.rollouts_per_step, p.share)
                for p in self.policies
            ),
        )

    def render(self) -> str:
        from mrl_llm.distributed.plan_render import render_plan

        return render_plan(self)


def apportion(shares: Sequence[float], total: int, minimum: int) -> list[int]:
    """Integers ``>= minimum`` summing to ``total``, proportional to ``shares`` (largest remainder)."""
    n = len(shares)
    spare = total - minimum * n
    if spare < 0:
        raise AllocationError(f"{n} parts need at least {minimum * n} units, only {total} available")
    raw = [s * spare for s in shares]
    base = [int(x) for x in raw]
    for i in sorted(range(n), key=lambda i: (-(raw[i] - base[i]), i))[: spare - sum(base)]:
        base[i] += 1
    return [b + minimum for b in base]


@dataclass
class _Slot:
    policy: int
    device: Device
    role: str


def _engines(slots: list[_Slot], i: int) -> int:
    return max(1, sum(s.role in ("colocated", "rollout", "cpu") and s.policy == i for s in slots))


def _slot_memory(fp: PolicyFootprint, slot: _Slot, n_train: int, seqs: int, cluster: ClusterSpec) -> MemoryBreakdown:
    """One policy's bytes on one slot's device (:mod:`mrl_llm.distributed.memory`): a trainer's shard of the
    training state plus, with ``n_train > 1`` FSDP ranks (not replicas, ``fsdp_unit: none``), its whole rollout copy (a split trainer keeps it in host
    RAM: counted here on a CPU slot, by :func:`_host_loads` on a GPU node); a rollout actor's whole
    model; the engine's own weights copy only for ``vllm`` (``hf`` samples from the process's whole model, under
    autocast: its compute-dtype casts, unless the whole model is the trained one, whose casts the training state
    counts); a ``vllm`` engine's sync copy in its dtype."""
    mm = cluster.memory_model
    over = MemoryBreakdown(overhead=mm.process_overhead_gib * GiB)
    if slot.device.kind == "ram":  # a CPU process: its own host overhead
        over = MemoryBreakdown(overhead=mm.host_process_gib * GiB)
    engine = rollout_bytes(fp, seqs, own_weights=fp.engine == "vllm")
    engine += MemoryBreakdown(weights=sync_copy_bytes(fp))
    casts = MemoryBreakdown(weights=autocast_cache_bytes(fp) if fp.engine == "hf" else 0.0)
    if slot.role == "rollout":
        return full_model_bytes(fp) + engine + casts + over
    copied = n_train > 1 and fp.fsdp_unit != "none"  # FSDP shards: a whole rollout copy beside them (replicas: none)
    if slot.role == "train":  # its rollout copy is in host RAM: this slot's on a CPU, else the node's
        on_host = copied and slot.device.kind == "ram"
        return training_bytes(fp, n_train) + (full_model_bytes(fp) if on_host else MemoryBreakdown()) + over
    # colocated (a GPU) or cpu (host RAM): trainer (sharded over the policy's ranks) and engine in one process
    copy = full_model_bytes(fp) + casts if copied else MemoryBreakdown()
    return training_bytes(fp, n_train) + copy + engine + over


def _rank0_slots(slots: list[_Slot]) -> set[int]:
    """The index of each policy's first trainer slot (its rank 0: where a checkpoint gathers the optimizer state)."""
    first: dict[int, int] = {}
    for k, s in enumerate(slots):
        if s.role in ("colocated", "train", "cpu"):
            first.setdefault(s.policy, k)
    return set(first.values())


def _evaluate(
    fps: Sequence[PolicyFootprint], slots: list[_Slot], cluster: ClusterSpec, mode: str
) -> tuple[list[DeviceLoad], list[int]]:
    """Memory per device with rollout concurrency scaled to fit; raises when a device cannot fit."""
    usable = cluster.memory_model.usable_fraction
    n_train = [max(1, sum(s.policy == i and s.role in ("colocated", "train", "cpu") for s in slots))
               for i in range(len(fps))]
    req = [min(math.ceil(fp.rollouts_per_step / _engines(slots, i)), fp.max_num_seqs) for i, fp in enumerate(fps)]
    by_dev: dict[str, list[_Slot]] = defaultdict(list)
    for s in slots:
        by_dev[s.device.name].append(s)
    conc = list(req)
    for slist in by_dev.values():
        cap = slist[0].device.capacity_bytes * usable
        base = sum(_slot_memory(fps[s.policy], s, n_train[s.policy], 0, cluster).total for s in slist)
        per_seq = {s.policy: kv_bytes_per_sequence(fps[s.policy]) + sampling_bytes_per_sequence(fps[s.policy])
                   for s in slist if s.role != "train"}
        want = sum(req[i] * c for i, c in per_seq.items())
        if base + want <= cap:
            continue
        factor = max(0.0, (cap - base) / want) if want else 0.0
        if want == 0 or any(math.floor(req[i] * factor) < 1 for i in per_seq):
            need = base + sum(per_seq.values())
            dev = slist[0].device
            here = sorted({s.policy for s in slist})
            raise AllocationError(
                f"{mode} plan does not fit: {dev.name} ({dev.capacity_bytes / GiB:.1f} GiB, "
                f"{cap / GiB:.1f} GiB usable) needs {need / GiB:.1f} GiB for {', '.join(fps[i].name for i in here)} "
                f"(with one rollout sequence in flight); short by {(need - cap) / GiB:.1f} GiB; "
                f"{hints([(fps[i], n_train[i]) for i in here])}"
            )
        for i in per_seq:
            conc[i] = min(conc[i], math.floor(req[i] * factor))
    loads = []
    rank0 = {id(slots[k]) for k in _rank0_slots(slots)}
    for slist in by_dev.values():
        parts = tuple(
            DevicePart(fps[s.policy].name, s.role, _slot_memory(fps[s.policy], s, n_train[s.policy],
                                                                 0 if s.role == "train" else conc[s.policy], cluster)
                       + _checkpoint_part(fps[s.policy], s, n_train[s.policy], id(s) in rank0))
            for s in slist
        )
        loads.append(DeviceLoad(slist[0].device, slist[0].device.capacity_bytes * usable, parts))
    return loads, conc


def _checkpoint_part(fp: PolicyFootprint, slot: _Slot, n_train: int, rank0: bool) -> MemoryBreakdown:
    """A CPU slot's share of a checkpoint: the gathered optimizer state on the policy's rank 0 (GPU nodes:
    :func:`_host_loads`)."""
    if not rank0 or slot.device.kind != "ram":
        return MemoryBreakdown()
    return MemoryBreakdown(optimizer=checkpoint_host_bytes(fp, n_train))


def _host_loads(fps: Sequence[PolicyFootprint], slots: list[_Slot], cluster: ClusterSpec) -> list[DeviceLoad]:
    """Host RAM on GPU nodes: one process per GPU slot, a staging copy of each policy's weights, the whole
    rollout copy of each split trainer rank of a policy trained on more than one (:func:`_slot_memory`), and on
    the node of a sharded policy's rank 0 the optimizer state a checkpoint gathers there
    (:func:`~mrl_llm.distributed.memory.checkpoint_host_bytes`)."""
    mm, out = cluster.memory_model, []
    rank0 = _rank0_slots(slots)
    for ram in cluster.rams():
        parts = []
        for i, fp in enumerate(fps):
            procs = sum(s.policy == i and s.device.node == ram.node for s in slots)
            trainers = [s for s in slots if s.policy == i and s.role == "train"]
            copied = len(trainers) > 1 and fp.fsdp_unit != "none"  # replicas' rollout copy is the model itself
            copies = sum(s.device.node == ram.node for s in trainers) if copied else 0
            if procs:
                staging = fp.n_params * DTYPE_BYTES[fp.dtype]
                n_train = sum(s.policy == i and s.role != "rollout" for s in slots)
                here0 = any(slots[k].policy == i and slots[k].device.node == ram.node for k in rank0)
                mem = MemoryBreakdown(weights=staging + copies * full_model_bytes(fp).weights,
                                      optimizer=checkpoint_host_bytes(fp, n_train) if here0 else 0.0,
                                      overhead=procs * mm.host_process_gib * GiB)
                parts.append(DevicePart(fp.name, "host", mem))
        if parts:
            load = DeviceLoad(ram, ram.capacity_bytes * mm.usable_fraction, tuple(parts))
            if load.used_bytes > load.usable_bytes:
                raise AllocationError(
                    f"host RAM of {ram.name} ({ram.capacity_bytes / GiB:.1f} GiB) cannot stage "
                    f"{load.used_bytes / GiB:.1f} GiB for {[p.policy for p in parts]}; short by "
                    f"{(load.used_bytes - load.usable_bytes) / GiB:.1f} GiB; use nodes with more RAM"
                )
            out.append(load)
    return out


def _gpu_slots(fps: Sequence[PolicyFootprint], cluster: ClusterSpec, mode: str, shares: list[float]) -> list[_Slot]:
    gpus, n = cluster.gpus(), len(fps)
    slots: list[_Slot] = []
    order = list(range(n))  # the order policies take their whole GPUs in, from the first
    if len({g.capacity_bytes for g in gpus}) > 1:  # mixed GPUs: the largest to the policies that need most on one
        gpus = sorted(gpus, key=lambda g: -g.capacity_bytes)
        order.sort(key=lambda i: -_slot_memory(fps[i], _Slot(i, gpus[0], "colocated"), 1, 1, cluster).total)
    if mode == "split":
        if len(gpus) < 2 * n:
            raise AllocationError(
                f"split pools need at least 2 GPUs per policy ({2 * n} for {n} policies); the cluster has "
                f"{len(gpus)}; use --mode colocated"
            )
        counts, pos = apportion(shares, len(gpus), 2), 0
        for i in order:
            n_roll = counts[i] // 2
            for j in range(counts[i]):
                slots.append(_Slot(i, gpus[pos + j], "rollout" if j < n_roll else "train"))
            pos += counts[i]
        return sorted(slots, key=lambda s: s.policy)
    if len(gpus) >= n:
        counts, pos = apportion(shares, len(gpus), 1), 0
        for i in order:
            slots.extend(_Slot(i, gpus[pos + j], "colocated") for j in range(counts[i]))
            pos += counts[i]
        return sorted(slots, key=lambda s: s.policy)
    # fewer GPUs than policies: share GPUs, largest policies first, each to the emptiest GPU
    used = {g.name: 0.0 for g in gpus}
    for i in sorted(range(n), key=lambda i: -_slot_memory(fps[i], _Slot(i, gpus[0], "colocated"), 1,
                                                          fps[i].rollouts_per_step, cluster).total):
        g = max(gpus, key=lambda d: (d.capacity_bytes - used[d.name], -gpus.index(d)))
        used[g.name] += _slot_memory(fps[i], _Slot(i, g, "colocated"), 1, fps[i].rollouts_per_step, cluster).total
        slots.append(_Slot(i, g, "colocated"))
    return sorted(slots, key=lambda s: s.policy)


def _cpu_slots(fps: Sequence[PolicyFootprint], cluster: ClusterSpec, *, split: bool = False) -> list[_Slot]:
    """``ranks`` CPU slots per policy (``split``: ``ranks`` trainer slots, then ``ranks`` rollout slots), each on
    the node with most free RAM."""
    rams, used = cluster.rams(), defaultdict(float)
    slots = []
    for i, fp in enumerate(fps):
        for role in ("train", "rollout") if split else ("cpu",):
            for _ in range(fp.ranks):
                d = max(rams, key=lambda r: (r.capacity_bytes - used[r.name], -r.node))
                used[d.name] += _slot_memory(fp, _Slot(i, d, role), fp.ranks, 1, cluster).total
                slots.append(_Slot(i, d, role))
    return slots


def _plan_mode(fps: Sequence[PolicyFootprint], cluster: ClusterSpec, mode: str) -> PlacementPlan:
    costs = [fp.step_cost for fp in fps]
    shares = [c / sum(costs) for c in costs]
    on_cpus = mode == "cpu" or cluster.n_gpus == 0
    slots = (_cpu_slots(fps, cluster, split=mode == "split") if on_cpus
             else _gpu_slots(fps, cluster, mode, shares))
    loads, conc = _evaluate(fps, slots, cluster, mode)
    if not on_cpus:
        loads += _host_loads(fps, slots, cluster)
    nodes = cluster.expanded()
    # CPUs: each node's CPUs go to the slots on it, by share (whole CPUs when there are enough)
    cpus = [0.0] * len(fps)
    threads = [1] * len(fps)
    per_slot_cpu: dict[int, float] = {}
    for node_idx, node in enumerate(nodes):
        here = [k for k, s in enumerate(slots) if s.device.node == node_idx]
        if not here:
            continue
        w = [shares[slots[k].policy] / sum(slots[q].policy == slots[k].policy for q in here) for k in here]
        w = [x / sum(w) for x in w]
        got = apportion(w, node.cpus, 1) if node.cpus >= len(here) else [node.cpus * x for x in w]
        for k, c in zip(here, got, strict=True):
            per_slot_cpu[k] = float(c)
    placements = []
    for i, fp in enumerate(fps):
        mine = [k for k, s in enumerate(slots) if s.policy == i]
        cpus[i] = sum(per_slot_cpu[k] for k in mine)
        threads[i] = max(1, math.floor(min(per_slot_cpu[k] for k in mine)))
        on_gpu = [slots[k].device for k in mine if slots[k].device.kind == "gpu"]
        frac = 1.0
        if mode == "colocated" and len(on_gpu) == 1:
            load = next(ld for ld in loads if ld.device.name == on_gpu[0].name)
            frac = next(p.memory.total for p in load.parts if p.policy == fp.name) / load.used_bytes
        bundles = tuple(
            ({"GPU": frac} if slots[k].device.kind == "gpu" else {}) | {"CPU": per_slot_cpu[k]} for k in mine
        )
        engines = _engines(slots, i)
        placements.append(PolicyPlacement(
            policy=fp.name,
            train_devices=tuple(slots[k].device.name for k in mine if slots[k].role != "rollout"),
            rollout_devices=tuple(slots[k].device.name for k in mine if slots[k].role != "train"),
            num_gpus=sum(b.get("GPU", 0.0) for b in bundles),
            num_cpus=cpus[i],
            threads=threads[i],
            bundles=bundles,
            rollouts_per_step=fp.rollouts_per_step,
            rollout_concurrency=conc[i],
            rollout_waves=math.ceil(math.ceil(fp.rollouts_per_step / engines) / conc[i]),
            share=shares[i],
            bundle_roles=tuple(slots[k].role for k in mine),
            bundle_devices=tuple(slots[k].device.name for k in mine),
            training=training_layout(fp, sum(slots[k].role != "rollout" for k in mine)),
        ))
    return PlacementPlan(cluster, mode, tuple(placements), tuple(loads))  # type: ignore[arg-type]


def plan_placement(
    footprints: Sequence[PolicyFootprint], cluster: ClusterSpec, *, mode: PlanMode = "auto",
    prefer_split: bool = False,
) -> PlacementPlan:
    """Place ``footprints`` on ``cluster`` (module docstring); raise :class:`AllocationError` if nothing fits.

    ``mode="auto"`` picks ``cpu`` without GPUs, else tries ``colocated`` then ``split`` (``split`` first
    when ``prefer_split``, i.e. asynchronous training) and returns the first that fits.
    """
    if not footprints:
        raise AllocationError("no policies to place; the config lists none")
    names = [f.name for f in footprints]
    if len(set(names)) != len(names):
        raise AllocationError(f"policy names must be unique, got {names}")
    if mode == "cpu" or (mode == "auto" and cluster.n_gpus == 0):
        return _plan_mode(footprints, cluster, "cpu")
    if cluster.n_gpus == 0 and mode != "split":
        raise AllocationError(f"mode {mode!r} needs GPUs; cluster {cluster.name!r} has none (use --mode cpu or split)")
    if cluster.n_gpus == 0:  # split pools of CPU slots
        return _plan_mode(footprints, cluster, "split")
    if mode != "auto":
        return _plan_mode(footprints, cluster, mode)
    order = ["split", "colocated"] if prefer_split else ["colocated", "split"]
    if cluster.n_gpus < 2 * len(footprints):
        order.remove("split")
    errors = []
    for m in order:
        try:
            return _plan_mode(footprints, cluster, m)
        except AllocationError as err:
            errors.append(str(err))
    raise AllocationError(errors[0] + "".join(f"\n(also tried: {e})" for e in errors[1:]))
