"""Multi-Worker Resource Allocation (MWRA): the contract and a simple documented planner.

Types: :class:`PolicySpec` (what a policy needs), :class:`Resources` (what the cluster has),
:class:`PolicyAllocation` / :class:`AllocationPlan` (who gets what). The Ray runtime's memory-aware
planner (``mrl_llm plan``) produces the same :class:`AllocationPlan`.

:func:`plan_proportional` splits compute in proportion to each policy's per-step cost
``cost_i = n_params_i * rollouts_per_step_i * (prompt_len_i + max_response_len_i)`` (the 2N FLOPs per
generated token and 6N per trained token are common factors, so the split is the same):

* ``n_gpus >= n_policies``: whole GPUs by largest remainder, at least one each (split pools);
* ``0 < n_gpus < n_policies``: every policy shares GPUs, fractions proportional to cost (colocated);
* ``n_gpus == 0``: CPU workers by largest remainder, at least one each.

In every mode the CPUs are split by largest remainder, at least one each, so there must be at least one CPU per
policy (an :class:`AllocationError` otherwise).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal


class AllocationError(ValueError):
    """The resources cannot host the policies; the message says what does not fit."""


@dataclass(frozen=True)
class PolicySpec:
    name: str
    n_params: int
    tokenizer_id: str
    rollouts_per_step: int
    max_response_len: int
    prompt_len: int = 256
    dtype: Literal["fp32", "bf16", "fp16"] = "bf16"

    def __post_init__(self) -> None:
        for f in ("n_params", "rollouts_per_step", "max_response_len", "prompt_len"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int):
                raise AllocationError(f"policy {self.name!r}: {f} must be an integer, got {v!r}")
        for f in ("n_params", "rollouts_per_step", "max_response_len"):
            if getattr(self, f) < 1:
                raise AllocationError(f"policy {self.name!r}: {f} must be >= 1, got {getattr(self, f)}")
        if self.prompt_len < 0:
            raise AllocationError(f"policy {self.name!r}: prompt_len must be >= 0")
        if self.dtype not in ("fp32", "bf16", "fp16"):
            raise AllocationError(f"policy {self.name!r}: dtype must be fp32, bf16 or fp16, got {self.dtype!r}")

    @property
    def step_cost(self) -> float:
        return float(self.n_params) * self.rollouts_per_step * (self.prompt_len + self.max_response_len)


@dataclass(frozen=True)
class Resources:
    n_gpus: int = 0
    gpu_memory_gib: float = 0.0
    n_cpus: int = 1
    ram_gib: float = 1.0

    def __post_init__(self) -> None:
        for f, least in (("n_gpus", 0), ("n_cpus", 1)):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < least:
                raise AllocationError(f"resources: {f} must be an integer >= {least}, got {v!r}")
        for f in ("gpu_memory_gib", "ram_gib"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int | float) or not (0 <= v < math.inf):
                raise AllocationError(f"resources: {f} must be a finite number >= 0, got {v!r}")


@dataclass(frozen=True)
class PolicyAllocation:
    policy: str
    gpus: float
    cpus: int
    rollouts_per_step: int
    share: float


@dataclass(frozen=True)
class AllocationPlan:
    mode: Literal["split", "colocated", "cpu"]
    allocations: tuple[PolicyAllocation, ...]

    def for_policy(self, name: str) -> PolicyAllocation:
        for a in self.allocations:
            if a.policy == name:
                return a
        raise KeyError(f"no allocation for policy {name!r}; planned: {[a.policy for a in self.allocations]}")


def _largest_remainder(shares: Sequence[float], total: int, minimum: int) -> list[int]:
    n = len(shares)
    spare = total - minimum * n
    raw = [s * spare for s in shares]
    base = [int(x) for x in raw]
    left = spare - sum(base)
    order = sorted(range(n), key=lambda i: (-(raw[i] - base[i]), i))
    for i in order[:left]:
        base[i] += 1
    return [b + minimum for b in base]


def plan_proportional(policies: Sequence[PolicySpec], resources: Resources) -> AllocationPlan:
    """Split ``resources`` among ``policies`` in proportion to their step cost (module docstring)."""
    if not policies:
        raise AllocationError("no policies to place")
    names = [p.name for p in policies]
    if len(set(names)) != len(names):
        raise AllocationError(f"policy names must be unique, got {names}")
    costs = [p.step_cost for p in policies]
    total = sum(costs)
    shares = [c / total for c in costs]
    n = len(policies)
    if resources.n_cpus < n:
        raise AllocationError(
            f"{n} policies need at least {n} CPUs (one each), the cluster has {resources.n_cpus}; "
            "add CPUs or place fewer policies"
        )
    cpus = _largest_remainder(shares, resources.n_cpus, 1)
    if resources.n_gpus >= n:
        mode = "split"
        gpu_alloc = [float(g) for g in _largest_remainder(shares, resources.n_gpus, 1)]
    elif resources.n_gpus > 0:
        mode = "colocated"
        gpu_alloc = [s * resources.n_gpus for s in shares]
    else:
        mode = "cpu"
        gpu_alloc = [0.0] * n
    allocs = tuple(
        PolicyAllocation(p.name, gpu_alloc[i], cpus[i], p.rollouts_per_step, shares[i])
        for i, p in enumerate(policies)
    )
    return AllocationPlan(mode=mode, allocations=allocs)  # type: ignore[arg-type]
