"""Rank correlation and exact permutation p-values on hand cases; precision / recall."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bandit_sim.stats import (
    kendall_tau_b,
    permutation_test,
    precision_recall,
    rank_agreement,
    ranks,
    spearman,
)


def test_ranks_average_ties():
    np.testing.assert_allclose(ranks([10, 20, 20, 5]), [2, 3.5, 3.5, 1])


def test_perfect_and_reversed_orders_on_five_items():
    x = [0.1, 0.2, 0.3, 0.4, 0.5]
    res = rank_agreement(x, [1, 2, 3, 4, 5])
    for name in ("spearman", "kendall_tau_b"):
        assert res[name]["statistic"] == pytest.approx(1.0)
        assert res[name]["p_greater"] == pytest.approx(1 / 120)  # only the identity reaches 1
        assert res[name]["p_two_sided"] == pytest.approx(2 / 120)  # identity and reversal
        assert res[name]["exact"] and res[name]["permutations"] == 120
    rev = rank_agreement(x, [5, 4, 3, 2, 1])
    assert rev["spearman"]["statistic"] == pytest.approx(-1.0)
    assert rev["spearman"]["p_greater"] == pytest.approx(1.0)


def test_one_adjacent_swap_on_four_items():
    x, y = [1, 2, 3, 4], [1, 3, 2, 4]
    # rho = 1 - 6 * sum d^2 / (n (n^2 - 1)) = 1 - 12 / 60; tau = (5 - 1) / 6
    assert spearman(x, y) == pytest.approx(0.8)
    assert kendall_tau_b(x, y) == pytest.approx(2 / 3)
    # at least as good: the identity and the 3 adjacent swaps -> 4 of 24 orders, for both statistics
    assert permutation_test(x, y, spearman)["p_greater"] == pytest.approx(4 / 24)
    assert permutation_test(x, y, kendall_tau_b)["p_greater"] == pytest.approx(4 / 24)


def test_kendall_tau_b_with_ties():
    # x = [1, 1, 2, 3], y = [1, 2, 3, 4]: 6 pairs, 1 tied in x; concordant 5, discordant 0
    assert kendall_tau_b([1, 1, 2, 3], [1, 2, 3, 4]) == pytest.approx(5 / math.sqrt(5 * 6))
    assert math.isnan(kendall_tau_b([1, 1, 1], [1, 2, 3]))
    assert math.isnan(spearman([1, 1, 1], [1, 2, 3]))


def test_monte_carlo_above_the_exact_limit():
    x = np.arange(9.0)
    res = permutation_test(x, x, spearman, n_perm=2000, seed=1)
    assert not res["exact"] and res["permutations"] == 2000
    assert res["p_greater"] <= 3 / 2001  # the identity is 1 of 9! orders
    assert res == permutation_test(x, x, spearman, n_perm=2000, seed=1)  # seeded


def test_degenerate_inputs_give_nan_p_values():
    assert math.isnan(permutation_test([1, 2], [2, 1], spearman)["p_greater"])
    assert math.isnan(permutation_test([1, 1, 1], [1, 2, 3], spearman)["p_greater"])
    with pytest.raises(ValueError, match="one length"):
        permutation_test([1, 2, 3], [1, 2], spearman)


def test_precision_recall_hand_case():
    pred = [True, True, False, False, True]
    obs = [True, False, True, False, True]
    r = precision_recall(pred, obs)
    assert (r["tp"], r["fp"], r["fn"]) == (2, 1, 1)
    assert r["precision"] == pytest.approx(2 / 3) and r["recall"] == pytest.approx(2 / 3)
    assert r["f1"] == pytest.approx(2 / 3)
    none_pred = precision_recall([False, False], [True, False])
    assert none_pred["precision"] is None and none_pred["recall"] == 0.0 and none_pred["f1"] is None
    none_obs = precision_recall([True, False], [False, False])
    assert none_obs["precision"] == 0.0 and none_obs["recall"] is None


def test_auc_hand_case():
    from bandit_sim.stats import auc

    # positives 0.9, 0.4; negatives 0.4, 0.1: pairs (0.9>0.4, 0.9>0.1, 0.4=0.4, 0.4>0.1) -> 3.5 / 4
    assert auc([0.9, 0.4, 0.4, 0.1], [True, True, False, False]) == pytest.approx(0.875)
    assert auc([0.1, 0.9], [True, False]) == 0.0
    assert auc([0.1, 0.2], [True, True]) is None
