"""The plan table (:mod:`bandit_sim.plan_table`) gives exactly :func:`plan_batch`'s learner rows."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bandit_sim.batching import plan_batch
from bandit_sim.plan_table import PlanTable, tabulable
from shared_interfaces.regimes import parse_regime

SETTINGS = {"prp": {"peer_weight": 0.5, "ratio_cap": 1.5, "max_peer_samples": 5},
            "sgt": {"weight": 0.7, "successes_per_prompt": 2, "selection": "first"}}
REGIMES = ["grpo", "xgrpo", "prp_snapshot", "prp_thl", "sgt", "prp_thl+sgt", "sgt+xgrpo"]


def _assert_same(a, b):
    for f in ("src", "prompt", "own_mask", "advantages", "pg_mask", "sample_weight", "sgt_mask", "use_mu", "sgt_gate"):
        x, y = getattr(a, f), getattr(b, f)
        assert x.dtype == y.dtype and x.shape == y.shape, f
        assert torch.equal(x, y), f
    assert (a.sgt_weight, a.ratio_cap, a.denominator, a.sgt_normalize) == (b.sgt_weight, b.ratio_cap, b.denominator,
                                                                           b.sgt_normalize)


@pytest.mark.parametrize("name", REGIMES)
@pytest.mark.parametrize("settings", [{}, SETTINGS])
@pytest.mark.parametrize(("P", "G", "dtype"), [(2, 8, np.float32), (3, 4, np.float64), (1, 5, np.float32)])
def test_table_batch_equals_plan_batch(name, settings, P, G, dtype):
    spec = parse_regime(name, settings)
    table = PlanTable(spec, P, G, dtype)
    rng = np.random.default_rng(P * 100 + G)
    for S, B, p in ((4, 6, 0.4), (2, 1, 0.5), (3, 16, 0.3), (3, 16, 0.02)):  # p = 0.02: mostly failed groups
        rewards = (rng.random((S, B, P, G)) < p).astype(dtype)
        _assert_same(table.batch(torch.from_numpy(rewards)), plan_batch(spec, rewards, dtype=dtype))


def test_every_pattern_of_a_prompt():
    """All 2^(P G) outcomes of one prompt, as one batch of prompts and one prompt at a time."""
    spec = parse_regime("prp_thl+sgt")
    P, G = 2, 3
    table = PlanTable(spec, P, G)
    bits = ((np.arange(2 ** (P * G))[:, None] >> np.arange(P * G)) & 1).reshape(1, -1, P, G).astype(np.float32)
    _assert_same(table.batch(torch.from_numpy(bits)), plan_batch(spec, bits, dtype=np.float32))
    for b in range(bits.shape[1]):
        one = bits[:, b : b + 1]
        _assert_same(table.batch(torch.from_numpy(one)), plan_batch(spec, one, dtype=np.float32))


def test_random_selection_and_large_groups_are_not_tabulated():
    assert not tabulable(parse_regime("sgt", {"sgt": {"selection": "random"}}), 2, 4)
    assert not tabulable(parse_regime("grpo"), 2, 16)
    assert tabulable(parse_regime("sgt"), 2, 8)
    with pytest.raises(ValueError, match="use plan_batch"):
        PlanTable(parse_regime("grpo"), 3, 8)
