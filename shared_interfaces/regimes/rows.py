"""A learner's training rows: its per-prompt plans flattened into what a backend turns into tensors.

:func:`learner_rows` merges a learner's :class:`LearnerPromptPlan` s (one per prompt group) into one list
of :class:`TrainRow`, one per record the learner trains on. A record can be both a policy-gradient row
and an SGT target (a verified peer success under ``prp_*+sgt``): it then appears once, with both roles.
Each row says which denominator ``mu`` its behaviour correction uses:

=============  =====================================================================================
``own``        the learner's own sample; ``mu = pi_old`` (the proximal ratio alone; correction 1)
``snapshot``   a PRP peer sample under ``prp_snapshot``; ``mu = pi_old`` of the learner (correction 1)
``thl``        a PRP peer sample under ``prp_thl``; ``mu`` = the peer's trace aligned by THL, so the
               correction is ``min(pi_old / mu, ratio_cap)``
``none``       an SGT-only row (no policy-gradient term)
=============  =====================================================================================

A backend tokenises each row (THL for peer records), computes ``log pi_old`` at its snapshot, and calls
:func:`shared_interfaces.losses.peer_behaviour_coef` with ``use_mu = [row.behaviour == "thl"]`` and
:func:`shared_interfaces.losses.regime_loss` with ``pg_mask`` from ``in_pg`` and ``sgt_mask`` from ``sgt``.
It decides nothing else.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from shared_interfaces.records import ExperienceRecord
from shared_interfaces.regimes.plan import LearnerPromptPlan

Behaviour = Literal["own", "snapshot", "thl", "none"]


@dataclass(frozen=True)
class TrainRow:
    """One record a learner trains on, with its roles.

    ``advantage`` and ``weight`` are the policy-gradient term's (0 when ``in_pg`` is False);
    ``sgt`` marks an SGT target, whose tokens enter ``L_SGT`` with weight ``sgt_weight``, shared among
    rescued prompts as ``sgt_normalize`` says.
    """

    record: ExperienceRecord
    in_pg: bool
    advantage: float
    weight: float
    is_peer: bool
    behaviour: Behaviour
    ratio_cap: float
    sgt: bool
    sgt_weight: float
    sgt_normalize: str = "batch"

    @property
    def needs_peer_trace(self) -> bool:
        """The row's correction needs the peer's behaviour trace aligned into the learner's tokenizer."""
        return self.behaviour == "thl"


def learner_rows(plans: Sequence[LearnerPromptPlan]) -> list[TrainRow]:
    """Flatten one learner's plans into rows: each plan's policy-gradient items in their order, then its
    SGT targets that are not already rows. Plans must all belong to the same learner."""
    learners = {p.learner for p in plans}
    if len(learners) > 1:
        raise ValueError(f"learner_rows takes one learner's plans, got plans of {sorted(learners)}")
    rows: list[TrainRow] = []
    for plan in plans:
        targets = {r.record_id for r in plan.sgt_targets}
        for it in plan.pg_items:
            if not it.is_peer:
                behaviour: Behaviour = "own"
            else:
                behaviour = "thl" if plan.denominator == "thl" else "snapshot"
            rows.append(
                TrainRow(
                    record=it.record, in_pg=True, advantage=it.advantage, weight=it.weight,
                    is_peer=it.is_peer, behaviour=behaviour, ratio_cap=plan.ratio_cap,
                    sgt=it.record.record_id in targets, sgt_weight=plan.sgt_weight,
                    sgt_normalize=plan.sgt_normalize,
                )
            )
        in_pg = {it.record.record_id for it in plan.pg_items}
        for rec in plan.sgt_targets:
            if rec.record_id in in_pg:
                continue
            rows.append(
                TrainRow(
                    record=rec, in_pg=False, advantage=0.0, weight=0.0, is_peer=True, behaviour="none",
                    ratio_cap=plan.ratio_cap, sgt=True, sgt_weight=plan.sgt_weight,
                    sgt_normalize=plan.sgt_normalize,
                )
            )
    return rows
