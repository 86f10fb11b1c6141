"""Records -> regime decisions: the record-level face of :func:`regime_plan`.

:func:`plan_prompt_group` lays a :class:`PromptGroup` out as ``[P, G]`` arrays (policies sorted by id,
samples in canonical order), calls :func:`shared_interfaces.regimes.math.regime_plan` and maps the
result back onto records: for each learner, the records in its policy-gradient batch with their
advantage and weight, and its SGT targets. A backend turns these into tensors; it decides nothing.

:func:`plan_prompt_groups` does the same for a step's groups at once: groups of one ``[P, G]`` shape
go through one ``regime_plan`` call over ``[B, P, G]`` (the math is vectorised over leading dims and
per prompt), which gives the same plans as one call per group. Under SGT's ``random`` selection each
group keeps its own call and generator.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from shared_interfaces.records import ExperienceRecord, PromptGroup
from shared_interfaces.regimes.config import RegimeSpec
from shared_interfaces.regimes.math import RegimePlan, regime_plan


@dataclass(frozen=True)
class PGItem:
    """One row of a learner's policy-gradient batch."""

    record: ExperienceRecord
    advantage: float
    weight: float
    is_peer: bool


@dataclass(frozen=True)
class LearnerPromptPlan:
    """What learner ``learner`` trains on for one prompt group."""

    learner: str
    prompt_id: str
    step: int
    pg_items: tuple[PGItem, ...]
    sgt_gate: bool
    sgt_targets: tuple[ExperienceRecord, ...]
    sgt_weight: float
    denominator: str | None
    ratio_cap: float
    sgt_normalize: str = "batch"

    @property
    def peer_items(self) -> tuple[PGItem, ...]:
        return tuple(it for it in self.pg_items if it.is_peer)


@dataclass(frozen=True)
class GroupArrays:
    """A prompt group as arrays: ``rewards, verified, lengths, mask [P, G]`` and ``records[p][g]``."""

    policy_ids: tuple[str, ...]
    rewards: np.ndarray
    verified: np.ndarray
    lengths: np.ndarray
    mask: np.ndarray
    records: tuple[tuple[ExperienceRecord, ...], ...]


def group_arrays(group: PromptGroup, policy_ids: Sequence[str]) -> GroupArrays:
    """Lay ``group`` out over ``sorted(policy_ids)`` (a policy with no records gets an empty row)."""
    pids = tuple(sorted(set(policy_ids)))
    stray = sorted({r.policy_id for r in group.records} - set(pids))
    if stray:
        raise ValueError(f"prompt group {group.prompt_id!r} has records of unknown policies {stray}")
    rows = tuple(group.of_policy(p) for p in pids)
    G = max((len(r) for r in rows), default=0)
    P = len(pids)
    rewards = np.zeros((P, G))
    verified = np.zeros((P, G), dtype=bool)
    lengths = np.zeros((P, G), dtype=np.int64)
    mask = np.zeros((P, G), dtype=bool)
    for p, row in enumerate(rows):
        for g, rec in enumerate(row):
            rewards[p, g] = rec.reward
            verified[p, g] = rec.verified
            lengths[p, g] = len(rec.token_ids)
            mask[p, g] = True
    return GroupArrays(pids, rewards, verified, lengths, mask, rows)


def plan_prompt_group(
    group: PromptGroup,
    policy_ids: Sequence[str],
    spec: RegimeSpec,
    *,
    rng: np.random.Generator | None = None,
) -> dict[str, LearnerPromptPlan]:
    """Each learner's plan for ``group`` under ``spec`` (keys: policy ids)."""
    arr = group_arrays(group, policy_ids)
    if arr.mask.size == 0:
        return _empty_plans(group, arr.policy_ids, spec)
    plan = regime_plan(spec, arr.rewards, arr.verified, arr.lengths, arr.mask, rng=rng)
    return _learner_plans(group, arr, plan, arr.policy_ids)


def plan_prompt_groups(
    groups: Sequence[PromptGroup],
    policy_ids: Sequence[str],
    spec: RegimeSpec,
    *,
    learners: Sequence[str] | None = None,
    rng: Callable[[], np.random.Generator] | None = None,
) -> list[dict[str, LearnerPromptPlan]]:
    """:func:`plan_prompt_group` for each of ``groups``, in order, batching groups of one shape into one
    ``regime_plan`` call. ``learners`` limits each result to those policies (default: all);
    ``rng()`` makes the generator of each group's SGT ``random`` selection (called once per group)."""
    arrs = [group_arrays(g, policy_ids) for g in groups]
    keep = tuple(sorted(set(policy_ids))) if learners is None else tuple(learners)
    out: list[dict[str, LearnerPromptPlan] | None] = [None] * len(groups)
    per_group = spec.random_plan
    by_shape: dict[tuple[int, ...], list[int]] = {}
    for k, (g, arr) in enumerate(zip(groups, arrs, strict=True)):
        if arr.mask.size == 0:
            out[k] = {p: v for p, v in _empty_plans(g, arr.policy_ids, spec).items() if p in keep}
        elif per_group:
            plan = regime_plan(spec, arr.rewards, arr.verified, arr.lengths, arr.mask,
                               rng=rng() if rng is not None else None)
            out[k] = _learner_plans(g, arr, plan, keep)
        else:
            by_shape.setdefault(arr.mask.shape, []).append(k)
    for ks in by_shape.values():
        stack = [arrs[k] for k in ks]
        plan = regime_plan(spec, np.stack([a.rewards for a in stack]), np.stack([a.verified for a in stack]),
                           np.stack([a.lengths for a in stack]), np.stack([a.mask for a in stack]))
        for b, k in enumerate(ks):
            out[k] = _learner_plans(groups[k], arrs[k], _slice(plan, b), keep)
    return out  # type: ignore[return-value]


def _slice(plan: RegimePlan, b: int) -> RegimePlan:
    """Prompt ``b`` of a plan over ``[B, ...]``."""
    return replace(plan, advantages=plan.advantages[b], pg_mask=plan.pg_mask[b], sample_weight=plan.sample_weight[b],
                   sgt_gate=plan.sgt_gate[b], sgt_targets=plan.sgt_targets[b])


def _empty_plans(group: PromptGroup, policy_ids: Sequence[str], spec: RegimeSpec) -> dict[str, LearnerPromptPlan]:
    """No records at all: every learner gets an empty plan."""
    return {p: LearnerPromptPlan(p, group.prompt_id, group.step, (), False, (), 0.0, spec.denominator,
                                 spec.prp.ratio_cap) for p in policy_ids}


def _learner_plans(group: PromptGroup, arr: GroupArrays, plan: RegimePlan,
                   learners: Sequence[str]) -> dict[str, LearnerPromptPlan]:
    """Map one group's ``[P, G]`` plan back onto its records, for ``learners``."""
    adv = plan.advantages.tolist()
    out: dict[str, LearnerPromptPlan] = {}
    for learner in learners:
        i = arr.policy_ids.index(learner)
        pg, w, tg = plan.pg_mask[i].tolist(), plan.sample_weight[i].tolist(), plan.sgt_targets[i].tolist()
        items = []
        targets = []
        for j, row in enumerate(arr.records):
            for g, rec in enumerate(row):
                if pg[j][g]:
                    items.append(PGItem(record=rec, advantage=float(adv[j][g]), weight=float(w[j][g]), is_peer=j != i))
                if tg[j][g]:
                    targets.append(rec)
        out[learner] = LearnerPromptPlan(
            learner=learner,
            prompt_id=group.prompt_id,
            step=group.step,
            pg_items=tuple(items),
            sgt_gate=bool(plan.sgt_gate[i]),
            sgt_targets=tuple(targets),
            sgt_weight=plan.sgt_weight,
            denominator=plan.denominator,
            ratio_cap=plan.ratio_cap,
            sgt_normalize=plan.sgt_normalize,
        )
    return out
