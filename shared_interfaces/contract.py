"""The cross-backend contract: what each backend hands its optimizer for the same raw records.

A :class:`ContractCase` is a set of raw rollout records (one or more prompt groups of one step) and a
regime. Each backend exposes ``run_contract_case(case) -> ContractOutput``: it feeds the records
through *its own* grouping and batching (and THL, for the LLM) exactly as in training, and reports,
per learner, the rows of its policy-gradient batch (record id -> advantage, sample weight, behaviour
coefficient at the snapshot) and its SGT targets. ``tests/contract/`` runs every case through every
backend and compares with :func:`reference_output`, so a backend that re-derives or mis-groups
anything fails.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from shared_interfaces.records import ExperienceRecord, PromptGroup
from shared_interfaces.regimes.config import RegimeSpec
from shared_interfaces.regimes.math import regime_plan
from shared_interfaces.regimes.plan import group_arrays


@dataclass(frozen=True)
class ContractCase:
    name: str
    regime: RegimeSpec
    policy_ids: tuple[str, ...]
    records: tuple[ExperienceRecord, ...]


@dataclass
class LearnerDecisions:
    """One learner's batch: ``advantages[record_id]``, ``weights[record_id]`` (sample weight),
    ``snapshot_coef[record_id]`` (behaviour coefficient of a peer row under the snapshot denominator,
    1.0 by definition; only reported for ``prp_snapshot``), ``sgt_targets`` (record ids),
    ``sgt_gates[prompt_id]`` and, under ``sgt.normalize: prompt``, ``sgt_pools``: the SGT targets
    partitioned into the pools whose tokens are averaged together (one per rescued prompt)."""

    advantages: dict[str, float] = field(default_factory=dict)
    weights: dict[str, float] = field(default_factory=dict)
    snapshot_coef: dict[str, float] = field(default_factory=dict)
    sgt_targets: set[str] = field(default_factory=set)
    sgt_gates: dict[str, bool] = field(default_factory=dict)
    sgt_pools: set[frozenset[str]] = field(default_factory=set)


ContractOutput = dict[str, LearnerDecisions]


def groups_of(records: Sequence[ExperienceRecord]) -> list[PromptGroup]:
    """Split records into prompt groups by (prompt id, step), sorted by (step, prompt id)."""
    by_key: dict[tuple[int, str], list[ExperienceRecord]] = defaultdict(list)
    for r in records:
        by_key[(r.step, r.prompt_id)].append(r)
    return [PromptGroup(prompt_id=p, step=s, records=tuple(rs)) for (s, p), rs in sorted(by_key.items())]


def reference_output(case: ContractCase) -> ContractOutput:
    """The core's own decisions for ``case``: :func:`~shared_interfaces.regimes.math.regime_plan` on each
    prompt group's ``[P, G]`` arrays (:func:`~shared_interfaces.regimes.plan.group_arrays`), read back per
    sample."""
    out: ContractOutput = {p: LearnerDecisions() for p in case.policy_ids}
    for group in groups_of(case.records):
        arr = group_arrays(group, case.policy_ids)
        plan = regime_plan(case.regime, arr.rewards, arr.verified, arr.lengths, arr.mask)
        for i, learner in enumerate(arr.policy_ids):
            dec = out[learner]
            dec.sgt_gates[group.prompt_id] = bool(plan.sgt_gate[i])
            targets = set()
            for j, row in enumerate(arr.records):
                for g, rec in enumerate(row):
                    if plan.pg_mask[i, j, g]:
                        dec.advantages[rec.record_id] = float(plan.advantages[j, g])
                        dec.weights[rec.record_id] = float(plan.sample_weight[i, j, g])
                        if j != i and plan.denominator == "snapshot":
                            dec.snapshot_coef[rec.record_id] = 1.0
                    if plan.sgt_targets[i, j, g]:
                        targets.add(rec.record_id)
            dec.sgt_targets.update(targets)
            if targets and case.regime.sgt.normalize == "prompt":
                dec.sgt_pools.add(frozenset(targets))
    return out
