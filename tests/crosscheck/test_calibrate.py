"""Calibration math: the scenario reproduces the measured rates; floors; the rescue set; P(solved)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bandit_sim.calibrate import (
    CORRECT_ARM,
    CalibrationConfig,
    Counts,
    calibrate,
    correct_logit,
    never_floor,
    rescue_set,
    scenario_from_probabilities,
    solve_probability,
    success_probabilities,
)
from bandit_sim.config import SimConfig
from bandit_sim.engine import Engine


@settings(max_examples=200, deadline=None)
@given(p=st.floats(1e-12, 1 - 1e-9), arms=st.integers(2, 64))
def test_correct_logit_inverts_the_softmax(p, arms):
    z = np.zeros(arms)
    z[CORRECT_ARM] = correct_logit(np.array(p), arms)
    e = np.exp(z - z.max())
    assert math.isclose(e[CORRECT_ARM] / e.sum(), p, rel_tol=1e-9)


def test_scenario_reproduces_the_rates():
    rng = np.random.default_rng(0)
    p = rng.uniform(1e-6, 1 - 1e-6, size=(3, 20))
    sc = scenario_from_probabilities(p, 8, ("a", "b", "c"))
    assert sc.init_logits.shape == (3, 20, 8) and sc.rewards.shape == (20, 8)
    np.testing.assert_allclose(sc.correct_mass(), p, rtol=1e-10)
    assert sc.correct[:, CORRECT_ARM].all() and sc.correct.sum() == 20


def test_never_floor_hand_case():
    # D = 100 steps * 16/64 of the prompts per step * G 8 = 200 draws of each prompt
    assert never_floor(0.01, 100, 16, 64, 8) == pytest.approx(5e-5)
    assert never_floor(0.01, 10, 100, 20, 4) == pytest.approx(0.01 / 40)  # B capped at C


def test_success_probabilities_four_cases():
    n = np.full((1, 5), 4)
    s = np.array([[2, 0, 0, 4, 1]])
    g = np.array([[1, 1, 0, 1, 0]], dtype=bool)
    p = success_probabilities(Counts(n, s, g), p_never=1e-4)
    np.testing.assert_allclose(p, [[0.5, 1 / 8, 1e-4, 1 - 1e-4, 0.25]])


def test_counts_refuse_prompts_without_samples():
    with pytest.raises(ValueError, match="eval.k >= 1"):
        Counts(np.array([[0, 4]]), np.array([[0, 1]]), np.array([[0, 0]], dtype=bool))


def test_rescue_set_hand_case():
    # 3 policies x 4 prompts; solved = a sample success or a correct greedy answer
    s = np.array([[0, 0, 2, 0], [1, 0, 0, 0], [0, 0, 0, 0]])
    g = np.array([[0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 1]], dtype=bool)
    r = rescue_set(Counts(np.full((3, 4), 4), s, g))
    expected = np.array([
        [True, False, False, True],  # prompt 0 solved by policy 1, prompt 3 by policy 2 (greedy)
        [False, False, True, True],
        [True, False, True, False],
    ])
    np.testing.assert_array_equal(r, expected)
    single = rescue_set(Counts(np.full((1, 4), 4), s[:1], g[:1]))
    assert not single.any()


def test_solve_probability_follows_the_eval_protocol():
    k = 4
    z = np.array([[3.0, 0.0, 0.0], [0.0, 1.0, 0.0]])  # greedy correct; greedy wrong
    e = np.exp(z)
    p1 = e[1, 0] / e[1].sum()
    np.testing.assert_allclose(solve_probability(z, k), [1.0, 1 - (1 - p1) ** k])


def test_calibration_starts_the_bandit_at_the_measured_accuracy():
    """The engine's step-0 accuracy of the calibrated scenario equals the mean success probability."""
    n = np.full((2, 6), 4)
    s = np.array([[0, 1, 2, 3, 4, 0], [4, 0, 0, 1, 2, 0]])
    g = s >= 2
    cal = calibrate(Counts(n, s, g), tuple("abcdef"), ("p", "q"), CalibrationConfig(arms=5, alpha=0.01), steps=10,
                    batch_prompts=3, group_size=4)
    assert cal.p_never == pytest.approx(0.01 / (10 * 3 / 6 * 4))
    np.testing.assert_allclose(cal.scenario.correct_mass(), cal.p, rtol=1e-10)
    interior = (s > 0) & (s < 4)
    np.testing.assert_allclose(cal.p[interior], s[interior] / 4)
    eng = Engine(cal.scenario, SimConfig(steps=1, seeds=2, batch_prompts=3, group_size=4, dtype="float64",
                                         regimes=("grpo",)))
    acc = eng.policy_metrics()["accuracy"].numpy()  # [R, S, P]
    np.testing.assert_allclose(acc[0, 0], cal.p.mean(axis=1), rtol=1e-9)
    np.testing.assert_array_equal(cal.rescue, rescue_set(cal.counts))
    assert cal.rescue[0, 0] and not cal.rescue[0, 5]  # prompt f: nobody solved it


def test_floor_must_stay_below_one_half():
    counts = Counts(np.full((2, 2), 4), np.array([[0, 2], [2, 0]]), np.zeros((2, 2), dtype=bool))
    with pytest.raises(ValueError, match="lower --alpha"):
        calibrate(counts, ("a", "b"), ("p", "q"), CalibrationConfig(alpha=5.0), steps=1, batch_prompts=1,
                  group_size=2)
    with pytest.raises(ValueError, match="alpha must be > 0"):
        CalibrationConfig(alpha=0.0)
