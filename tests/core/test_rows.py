"""learner_rows: plans -> one row per trained record, with its roles and denominator."""

from __future__ import annotations

import pytest

from shared_interfaces.records import PromptGroup
from shared_interfaces.regimes import parse_regime
from shared_interfaces.regimes.plan import plan_prompt_group
from shared_interfaces.regimes.rows import learner_rows
from tests.contract.cases import group


def _plans(regime: str, records, learner="A", pids=("A", "B")):
    g = PromptGroup(prompt_id=records[0].prompt_id, step=0, records=tuple(records))
    return [plan_prompt_group(g, pids, parse_regime(regime))[learner]]


def test_grpo_rows_are_own_samples_only():
    rows = learner_rows(_plans("grpo", group("A", "p", [1, 0]) + group("B", "p", [1, 1])))
    assert [r.record.policy_id for r in rows] == ["A", "A"]
    assert all(r.behaviour == "own" and r.in_pg and not r.sgt for r in rows)


@pytest.mark.parametrize(("regime", "kind"), [("prp_snapshot", "snapshot"), ("prp_thl", "thl")])
def test_prp_peer_rows_carry_their_denominator(regime, kind):
    rows = learner_rows(_plans(regime, group("A", "p", [1, 0]) + group("B", "p", [0, 1])))
    peers = [r for r in rows if r.is_peer]
    assert len(peers) == 2 and all(r.behaviour == kind for r in peers)
    assert all(r.needs_peer_trace == (kind == "thl") for r in peers)
    assert [r.behaviour for r in rows if not r.is_peer] == ["own", "own"]


def test_sgt_target_is_an_nll_only_row_under_sgt():
    rows = learner_rows(_plans("sgt", group("A", "p", [0, 0]) + group("B", "p", [0, 1])))
    sgt = [r for r in rows if r.sgt]
    assert len(sgt) == 1 and sgt[0].record.policy_id == "B" and not sgt[0].in_pg
    assert sgt[0].behaviour == "none" and sgt[0].weight == 0.0 and sgt[0].sgt_weight == 1.0
    assert all(r.advantage == 0.0 for r in rows)  # the learner's failed group: A = 0


def test_prp_plus_sgt_target_is_one_row_with_both_roles():
    rows = learner_rows(_plans("prp_thl+sgt", group("A", "p", [0, 0]) + group("B", "p", [0, 1])))
    ids = [r.record.record_id for r in rows]
    assert len(ids) == len(set(ids)) == 4
    both = [r for r in rows if r.sgt]
    assert len(both) == 1 and both[0].in_pg and both[0].behaviour == "thl"


def test_rows_refuse_mixed_learners():
    recs = group("A", "p", [0, 1]) + group("B", "p", [0, 1])
    plans = _plans("grpo", recs, "A") + _plans("grpo", recs, "B", )
    with pytest.raises(ValueError, match="one learner"):
        learner_rows(plans)
