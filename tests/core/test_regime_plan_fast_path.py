"""The fast variants of :mod:`shared_interfaces.regimes.fast` (no mask: no no-op ``where`` passes, the
group's max/min by columns; k = 1 SGT selection by argmin) give exactly what the plain functions give,
and the plain functions without a mask exactly what an all-True mask gives."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from shared_interfaces.regimes import group_advantages, parse_regime, pooled_advantages, regime_plan
from shared_interfaces.regimes.fast import group_advantages_fast, regime_plan_fast

REGIMES = ["grpo", "xgrpo", "prp_snapshot", "prp_thl", "sgt", "prp_thl+sgt", "sgt+xgrpo"]
SETTINGS = [{}, {"prp": {"peer_weight": 0.5, "max_peer_samples": 3}, "sgt": {"successes_per_prompt": 2}},
            {"advantage": {"scale_by_std": False, "eps": 1e-3}, "sgt": {"selection": "first"}}]

rewards = st.integers(1, 3).flatmap(lambda p: st.integers(1, 9).flatmap(lambda g: st.integers(1, 4).flatmap(
    lambda lead: arrays(np.float64, (lead, 2, p, g),
                        elements=st.one_of(st.sampled_from([0.0, 1.0]), st.floats(-3, 3, width=32))))))


def _same(a, b):
    assert a.shape == b.shape and a.dtype == b.dtype
    assert np.array_equal(a, b, equal_nan=True)


@settings(max_examples=150, deadline=None)
@given(r=rewards, scale=st.booleans())
def test_advantages_without_mask_equal_all_true_mask(r, scale):
    ones = np.ones(r.shape, bool)
    _same(group_advantages(r, eps=1e-6, scale_by_std=scale), group_advantages(r, ones, eps=1e-6, scale_by_std=scale))
    _same(pooled_advantages(r, scale_by_std=scale), pooled_advantages(r, ones, scale_by_std=scale))
    _same(group_advantages_fast(r, eps=1e-6, scale_by_std=scale), group_advantages(r, eps=1e-6, scale_by_std=scale))


def test_long_groups_and_special_values():
    rng = np.random.default_rng(0)
    r = rng.normal(size=(3, 100))
    r[0] = 2.5  # degenerate
    r[1, 7] = np.inf
    _same(group_advantages_fast(r), group_advantages(r, np.ones(r.shape, bool)))
    r = np.array([[0.0, -0.0, 0.0], [np.nan, 1.0, 1.0], [1.0, 1.0, 1.0]])
    _same(group_advantages_fast(r), group_advantages(r, np.ones(r.shape, bool)))
    _same(group_advantages_fast(np.zeros((2, 0))), group_advantages(np.zeros((2, 0))))  # empty groups


@settings(max_examples=120, deadline=None)
@given(r=rewards, name=st.sampled_from(REGIMES), k=st.integers(0, len(SETTINGS) - 1), seed=st.integers(0, 99))
def test_regime_plan_without_mask_equals_all_true_mask(r, name, k, seed):
    spec = parse_regime(name, SETTINGS[k])
    rng = np.random.default_rng(seed)
    verified = rng.random(r.shape) < 0.8
    lengths = rng.integers(1, 4, size=r.shape)
    a = regime_plan_fast(spec, r, verified, lengths, rng=np.random.default_rng(seed))
    b = regime_plan(spec, r, verified, lengths, np.ones(r.shape, bool), rng=np.random.default_rng(seed))
    c = regime_plan(spec, r, verified, lengths, rng=np.random.default_rng(seed))
    for f in ("advantages", "pg_mask", "sample_weight", "sgt_gate", "sgt_targets"):
        _same(getattr(a, f), getattr(b, f))
        _same(getattr(c, f), getattr(b, f))
    assert (a.denominator, a.sgt_weight, a.ratio_cap) == (b.denominator, b.sgt_weight, b.ratio_cap)
