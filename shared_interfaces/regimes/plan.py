"""Records -> regime decisions: the record-level face of :func:`regime_plan`.

:func:`plan_prompt_group` lays a :class:`PromptGroup` out as ``[P, G]`` arrays (policies sorted by id,
samples in canonical order), calls :func:`shared_interfaces.regimes.math.regime_plan` and maps the
result back onto records: for each learner, the records in its policy-gradient batch with their
advantage and weight, and its SGT targets. A backend turns these into tensors; it decides nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from shared_interfaces.records import ExperienceRecord, PromptGroup
from shared_interfaces.regimes.config import RegimeSpec
from shared_interfaces.regimes.math import regime_plan


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
    if arr.mask.size == 0:  # no records at all: every learner gets an empty plan
        return {
            p: LearnerPromptPlan(p, group.prompt_id, group.step, (), False, (), 0.0, spec.denominator,
                                 spec.prp.ratio_cap)
            for p in arr.policy_ids
        }
    plan = regime_plan(spec, arr.rewards, arr.verified, arr.lengths, arr.mask, rng=rng)
    out: dict[str, LearnerPromptPlan] = {}
    for i, learner in enumerate(arr.policy_ids):
        items = []
        targets = []
        for j, row in enumerate(arr.records):
            for g, rec in enumerate(row):
                if plan.pg_mask[i, j, g]:
                    items.append(
                        PGItem(
                            record=rec,
                            advantage=float(plan.advantages[j, g]),
                            weight=float(plan.sample_weight[i, j, g]),
                            is_peer=j != i,
                        )
                    )
                if plan.sgt_targets[i, j, g]:
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
        )
    return out
