"""The regime math: hand-computed cases and properties (hypothesis)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from shared_interfaces.regimes import (
    behaviour_correction,
    group_advantages,
    parse_regime,
    pooled_advantages,
    ratio_variance,
    regime_plan,
    sgt_gate,
    sgt_select,
)


def test_grpo_hand_computed():
    # r = [1, 0, 0, 1]: mean 0.5, unbiased std = sqrt(1/3)
    adv = group_advantages(np.array([1.0, 0, 0, 1]), eps=0.0)
    np.testing.assert_allclose(adv, [np.sqrt(3) / 2, -np.sqrt(3) / 2, -np.sqrt(3) / 2, np.sqrt(3) / 2])
    # Dr.GRPO: no std
    np.testing.assert_allclose(group_advantages(np.array([1.0, 0, 0, 0]), scale_by_std=False),
                               [0.75, -0.25, -0.25, -0.25])


def test_degenerate_groups_are_exactly_zero():
    assert np.all(group_advantages(np.array([0.3, 0.3, 0.3])) == 0.0)
    assert np.all(group_advantages(np.array([1.0])) == 0.0)
    m = np.array([True, False, False])
    out = group_advantages(np.array([1.0, 0.0, 5.0]), m)  # one real sample
    assert np.all(out == 0.0) and not np.isnan(out).any()


def test_masked_entries_do_not_count():
    r = np.array([1.0, 0.0, 7.0, 0.0])
    m = np.array([True, True, False, True])
    np.testing.assert_allclose(group_advantages(r, m), group_advantages(np.array([1.0, 0.0, 0.0]))
                               [[0, 1, 2, 2]] * np.array([1, 1, 0, 1]))


def test_xgrpo_pooled_hand_computed():
    r = np.array([[0.0, 0.0], [1.0, 1.0]])  # learner A all fail, B all succeed
    adv = pooled_advantages(r, eps=0.0)
    s = np.std([0, 0, 1, 1], ddof=1)
    np.testing.assert_allclose(adv, [[-0.5 / s, -0.5 / s], [0.5 / s, 0.5 / s]])


rewards_pg = st.integers(1, 4).flatmap(
    lambda p: st.integers(1, 6).flatmap(
        lambda g: arrays(np.float64, (3, p, g), elements=st.sampled_from([0.0, 1.0, 0.5, 0.25]))
    )
)


@settings(max_examples=200, deadline=None)
@given(r=rewards_pg, data=st.data())
def test_advantages_sum_to_zero_and_are_finite(r, data):
    mask = data.draw(arrays(bool, r.shape))
    for adv in (group_advantages(r, mask), pooled_advantages(r, mask)):
        assert np.isfinite(adv).all()
        assert np.all(adv[~mask] == 0.0)
    np.testing.assert_allclose(group_advantages(r, mask).sum(axis=-1), 0.0, atol=1e-9)
    np.testing.assert_allclose(pooled_advantages(r, mask).sum(axis=(-2, -1)), 0.0, atol=1e-9)


@settings(max_examples=100, deadline=None)
@given(r=arrays(np.float64, (5, 1, 6), elements=st.sampled_from([0.0, 1.0, 0.3])))
def test_xgrpo_with_one_policy_equals_grpo_exactly(r):
    v = np.ones(r.shape, bool)
    L = np.ones(r.shape, int)
    a = regime_plan(parse_regime("grpo"), r, v, L)
    b = regime_plan(parse_regime("xgrpo"), r, v, L)
    assert np.array_equal(a.learner_advantages(), b.learner_advantages())
    assert np.array_equal(a.pg_mask, b.pg_mask)


def test_sgt_gate_full_truth_table():
    # 2 policies, 1 sample each: every combination of (own success, peer success, peer verified).
    for own, peer, peer_ver, own_ver in itertools.product([0.0, 1.0], [0.0, 1.0], [False, True], [False, True]):
        r = np.array([[own], [peer]])
        v = np.array([[own_ver], [peer_ver]])
        gate = sgt_gate(r, v)
        assert gate[0] == (own == 0.0 and peer == 1.0 and peer_ver), (own, peer, peer_ver)
        assert gate[1] == (peer == 0.0 and own == 1.0 and own_ver)


@settings(max_examples=200, deadline=None)
@given(
    r=arrays(np.float64, (3, 4), elements=st.sampled_from([0.0, 1.0])),
    v=arrays(bool, (3, 4)),
    m=arrays(bool, (3, 4)),
    lengths=arrays(np.int64, (3, 4), elements=st.integers(1, 9)),
    k=st.integers(1, 3),
    rule=st.sampled_from(["shortest", "first", "random"]),
)
def test_sgt_selection_properties(r, v, m, lengths, k, rule):
    sel = sgt_select(r, v, lengths, m, k=k, rule=rule, rng=np.random.default_rng(0))
    gate = sgt_gate(r, v, m)
    for i in range(3):
        chosen = sel[i]
        assert not chosen[i].any(), "never the learner's own samples"
        assert np.all(~chosen | (v & m & (r >= 0.5))), "only verified successes"
        if not gate[i]:
            assert not chosen.any()
        else:
            n_cand = sum((v & m & (r >= 0.5))[j].sum() for j in range(3) if j != i)
            assert chosen.sum() == min(k, n_cand)
            if rule == "shortest":
                cand_lengths = [lengths[j, g] for j in range(3) for g in range(4)
                                if j != i and v[j, g] and m[j, g] and r[j, g] >= 0.5]
                assert sorted(lengths[chosen]) == sorted(cand_lengths)[: min(k, n_cand)]


def test_sgt_selection_rules_hand_computed():
    r = np.array([[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    v = np.ones_like(r, bool)
    L = np.array([[1, 1, 1], [5, 2, 2]])
    assert np.argwhere(sgt_select(r, v, L, k=1, rule="shortest")[0]).tolist() == [[1, 1]]  # tie -> canonical
    assert np.argwhere(sgt_select(r, v, L, k=1, rule="first")[0]).tolist() == [[1, 0]]
    assert sgt_select(r, v, L, k=2, rule="shortest")[0].sum() == 2
    with pytest.raises(ValueError, match="seeded"):
        sgt_select(r, v, L, rule="random")


def test_prp_plan_snapshot_peer_equals_learner():
    r = np.array([[1.0, 0.0, 0.0, 1.0], [0.0, 1.0, 1.0, 0.0]])
    plan = regime_plan(parse_regime("prp_snapshot"), r, np.ones_like(r, bool), np.ones_like(r, int))
    assert plan.pg_mask.all() and plan.denominator == "snapshot"
    np.testing.assert_array_equal(plan.learner_advantages()[0], plan.learner_advantages()[1])
    np.testing.assert_allclose(plan.advantages, pooled_advantages(r))
    lp = np.log(np.array([0.2, 0.5, 0.01]))
    assert np.all(behaviour_correction(lp, lp, plan.ratio_cap) == 1.0)


def test_prp_peer_weight_and_cap():
    r = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    spec = parse_regime("prp_thl", {"prp": {"peer_weight": 0.25, "max_peer_samples": 3}})
    plan = regime_plan(spec, r, np.ones_like(r, bool), np.ones_like(r, int))
    for i in range(3):
        assert plan.pg_mask[i, i].all() and np.all(plan.sample_weight[i, i] == 1.0)
        peers = plan.pg_mask[i] & ~np.eye(3, dtype=bool)[i][:, None]
        assert peers.sum() == 3
        assert np.all(plan.sample_weight[i][peers] == 0.25)


def test_behaviour_correction_truncates_and_works_in_torch():
    import torch

    old = np.log(np.array([0.5, 0.5, 0.01]))
    mu = np.log(np.array([0.5, 0.1, 0.5]))
    np.testing.assert_allclose(behaviour_correction(old, mu, 2.0), [1.0, 2.0, 0.02])
    t = behaviour_correction(torch.tensor(old), torch.tensor(mu), 2.0)
    np.testing.assert_allclose(t.numpy(), [1.0, 2.0, 0.02])
    assert ratio_variance(old, old) == 0.0
    assert ratio_variance(old, mu) == pytest.approx(np.var(np.exp(old - mu), ddof=1))


def test_grpo_on_all_fail_rescue_prompt_is_zero_xgrpo_constant_negative():
    r = np.array([[0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 1.0]])
    v = np.ones_like(r, bool)
    L = np.ones_like(r, int)
    g = regime_plan(parse_regime("grpo"), r, v, L).learner_advantages()[0, 0]
    assert np.all(g == 0.0)
    x = regime_plan(parse_regime("xgrpo"), r, v, L).learner_advantages()[0, 0]
    assert np.all(x < 0) and np.allclose(x, x[0])
    s = regime_plan(parse_regime("sgt"), r, v, L)
    assert s.sgt_gate.tolist() == [True, False] and s.sgt_targets[0].sum() == 1 and s.sgt_weight == 1.0
