"""LearnerRows: a plan -> one row per trained record, with its roles, named as the loss names them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from shared_interfaces.records import PromptGroup
from shared_interfaces.regimes import parse_regime, regime_plan
from shared_interfaces.regimes.plan import plan_groups
from shared_interfaces.regimes.rows import LearnerRows, learner_rows
from tests.contract.cases import group


def _rows(regime: str, records, learner="A", pids=("A", "B")) -> LearnerRows:
    g = PromptGroup(prompt_id=records[0].prompt_id, step=0, records=tuple(records))
    return plan_groups([g], pids, parse_regime(regime), learner=learner)


def _policies(rows: LearnerRows) -> list[str]:
    return [r.policy_id for r in rows.row_records()]


def test_grpo_rows_are_own_samples_only():
    rows = _rows("grpo", group("A", "p", [1, 0]) + group("B", "p", [1, 1]))
    assert _policies(rows) == ["A", "A"]
    assert rows.own_mask.all() and rows.pg_mask.all() and not rows.sgt_mask.any() and not rows.use_mu.any()
    assert rows.advantages.dtype == torch.float64 and rows.advantages.tolist()[0] > 0 > rows.advantages.tolist()[1]


@pytest.mark.parametrize(("regime", "thl"), [("prp_snapshot", False), ("prp_thl", True)])
def test_prp_peer_rows_carry_their_denominator(regime, thl):
    rows = _rows(regime, group("A", "p", [1, 0]) + group("B", "p", [0, 1]))
    peer = ~rows.own_mask
    assert int(peer.sum()) == 2 and rows.denominator == regime.removeprefix("prp_")
    assert rows.use_mu.tolist() == (peer.tolist() if thl else [False] * 4)
    assert rows.pg_mask.all()


def test_sgt_target_is_an_nll_only_row_under_sgt():
    rows = _rows("sgt", group("A", "p", [0, 0]) + group("B", "p", [0, 1]))
    assert _policies(rows) == ["A", "A", "B"]  # the prompt's policy-gradient rows, then its SGT target
    assert rows.sgt_mask.tolist() == [False, False, True] and rows.pg_mask.tolist() == [True, True, False]
    assert rows.sample_weight.tolist() == [1.0, 1.0, 0.0] and rows.sgt_weight == 1.0
    assert rows.advantages.tolist() == [0.0] * 3  # the learner's failed group: A = 0
    assert rows.sgt_gate.tolist() == [True]


def test_prp_plus_sgt_target_is_one_row_with_both_roles():
    rows = _rows("prp_thl+sgt", group("A", "p", [0, 0]) + group("B", "p", [0, 1]))
    ids = [r.record_id for r in rows.row_records()]
    assert len(ids) == len(set(ids)) == 4
    both = rows.sgt_mask & rows.pg_mask
    assert int(rows.sgt_mask.sum()) == 1 and bool(both.any()) and bool(rows.use_mu[both].all())


def test_rows_follow_the_groups_order_prompt_by_prompt():
    groups = [PromptGroup(p, 0, tuple(group("A", p, [0, 0]) + group("B", p, [0, 1]))) for p in ("z", "y")]
    groups.insert(1, PromptGroup("x", 0, tuple(group("A", "x", [1]))))  # another [P, G] shape: its own plan call
    rows = plan_groups(groups, ("A", "B"), parse_regime("sgt"), learner="A")
    assert [r.prompt_id for r in rows.row_records()] == ["z", "z", "z", "x", "y", "y", "y"]
    assert rows.prompt.tolist() == [0, 0, 0, 1, 2, 2, 2] and rows.sgt_gate.tolist() == [True, False, True]


def test_no_records_give_empty_rows_with_the_regime_scalars():
    spec = parse_regime("prp_thl+sgt", {"prp": {"ratio_cap": 3.0}})
    rows = plan_groups([PromptGroup("p", 0, ())], ("A", "B"), spec, learner="A")
    assert len(rows) == 0 and rows.row_records() == [] and rows.sgt_gate.tolist() == [False]
    assert (rows.sgt_weight, rows.ratio_cap, rows.denominator) == (1.0, 3.0, "thl")
    assert len(plan_groups([], ("A", "B"), spec, learner="A")) == 0


def test_bandit_layout_all_learners_equals_each_learner_alone():
    rng = np.random.default_rng(0)
    r = (rng.random((2, 3, 2, 4)) < 0.4).astype(float)  # [S, B, P, G]
    spec = parse_regime("prp_thl+sgt")
    plan = regime_plan(spec, r, np.ones(r.shape, bool), np.ones(r.shape, np.int64))
    src = np.stack([rng.permutation(24)[:10] for _ in range(2)])
    both = learner_rows(plan, src)
    for i in range(2):
        one = learner_rows(plan, src[i], learners=i)
        for f in ("src", "prompt", "own_mask"):
            assert torch.equal(getattr(one, f), getattr(both, f)[i])
        for f in ("advantages", "pg_mask", "sample_weight", "sgt_mask", "use_mu", "sgt_gate"):
            assert torch.equal(getattr(one, f), getattr(both, f)[:, i])
    assert torch.equal(both.prompt, torch.from_numpy(src // 8))


def test_malformed_inputs_are_errors_that_say_what():
    plan = regime_plan(parse_regime("grpo"), np.zeros((1, 2, 2)), np.ones((1, 2, 2), bool), np.ones((1, 2, 2), int))
    with pytest.raises(ValueError, match="src has rows for 2 learners"):
        learner_rows(plan, np.zeros((2, 3), int), learners=np.array([0]))
    with pytest.raises(ValueError, match="not records"):
        learner_rows(plan, np.arange(2), learners=0).row_records()
    g = PromptGroup("p", 0, tuple(group("A", "p", [1])))
    with pytest.raises(ValueError, match="learner 'C' is not one of the policies"):
        plan_groups([g], ("A", "B"), parse_regime("grpo"), learner="C")


def test_behaviour_coef_is_the_cores_on_use_mu_rows_only():
    rows = _rows("prp_thl", group("A", "p", [1, 0]) + group("B", "p", [0, 1]))
    old = torch.zeros(4, 2)
    mu = torch.full((4, 2), -3.0)
    coef = rows.behaviour_coef(old, mu)
    cap = rows.ratio_cap
    assert torch.allclose(coef[rows.use_mu], torch.tensor(min(np.exp(3.0), cap))) and coef[~rows.use_mu].eq(1.0).all()
    assert int(rows.use_mu.sum()) == 2


def test_take_and_concat_keep_the_fields_together():
    a = _rows("prp_thl+sgt", group("A", "p", [0, 0]) + group("B", "p", [0, 1]))
    b = _rows("prp_thl+sgt", group("A", "q", [1, 0]) + group("B", "q", [0, 0]))
    spec = parse_regime("prp_thl+sgt")
    both = LearnerRows.concat([a, b], spec)
    assert [r.record_id for r in both.row_records()] == [r.record_id for r in a.row_records() + b.row_records()]
    assert torch.equal(both.sgt_gate, torch.cat([a.sgt_gate, b.sgt_gate]))
    back = both.take(range(len(a)))
    assert back.row_records() == a.row_records() and torch.equal(back.advantages, a.advantages)
    assert LearnerRows.concat([], spec) == LearnerRows.empty(spec)
    plan = regime_plan(spec, np.zeros((1, 2, 2)), np.ones((1, 2, 2), bool), np.ones((1, 2, 2), int))
    with pytest.raises(ValueError, match="leading dims"):
        LearnerRows.concat([learner_rows(plan, np.zeros((2, 1), int))], spec)
