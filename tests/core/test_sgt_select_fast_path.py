"""``sgt_select_fast``'s k = 1 path (argmin) selects exactly what the plain stable-rank ``sgt_select`` selects."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from shared_interfaces.regimes import sgt_gate, sgt_select
from shared_interfaces.regimes.fast import sgt_select_fast


def _reference_k1(rewards, verified, key):
    """The general rule spelled out: among verified peer successes, the smallest key, ties in canonical
    (j, g) order; only where the gate is open."""
    P, G = rewards.shape[-2:]
    gate = sgt_gate(rewards, verified)
    out = np.zeros(rewards.shape[:-2] + (P, P, G), dtype=bool)
    for idx in np.ndindex(rewards.shape[:-2]):
        r, v, kk = rewards[idx], verified[idx], key[idx]
        for i in range(P):
            if not gate[idx][i]:
                continue
            cands = [(kk[j, g], j, g) for j in range(P) for g in range(G) if j != i and v[j, g] and r[j, g] >= 0.5]
            if cands:
                _, j, g = min(cands)
                out[idx + (i, j, g)] = True
    return out


@settings(max_examples=60, deadline=None)
@given(
    P=st.integers(1, 3), G=st.integers(1, 5), lead=st.integers(1, 4), seed=st.integers(0, 2**31 - 1),
    rule=st.sampled_from(["shortest", "first"]),
)
def test_k1_matches_the_stable_rank_rule(P, G, lead, seed, rule):
    rng = np.random.default_rng(seed)
    rewards = (rng.random((lead, P, G)) < 0.4).astype(float)
    verified = rng.random((lead, P, G)) < 0.8
    lengths = rng.integers(1, 4, size=(lead, P, G))  # ties on purpose
    got = sgt_select_fast(rewards, verified, lengths, k=1, rule=rule)
    key = lengths if rule == "shortest" else np.zeros_like(lengths)
    np.testing.assert_array_equal(got, _reference_k1(rewards, verified, key))
    np.testing.assert_array_equal(got, sgt_select(rewards, verified, lengths, k=1, rule=rule))
    np.testing.assert_array_equal(sgt_select_fast(rewards, verified, lengths, k=2, rule=rule),
                                  sgt_select(rewards, verified, lengths, k=2, rule=rule))
