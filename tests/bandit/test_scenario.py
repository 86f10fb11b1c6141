"""Scenario generator, .npz files and their validation."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bandit_sim.scenario import (
    Scenario,
    ScenarioError,
    ScenarioSpec,
    generate_scenario,
    load_scenario,
    rescue_sets,
    save_scenario,
)
from shared_interfaces.config_io import ConfigError


@settings(max_examples=25, deadline=None)
@given(
    overlap=st.floats(0.0, 0.9),
    hard=st.floats(0.0, 1.0),
    P=st.integers(1, 3),
    seed=st.integers(0, 10_000),
)
def test_generator_regions_and_rescue_set(overlap, hard, P, seed):
    spec = ScenarioSpec(n_contexts=40, n_arms=6, n_policies=P, overlap=overlap, unsolved=0.1 * (1 - overlap),
                        hard_fraction=hard, seed=seed)
    sc = generate_scenario(spec)
    assert sc.init_logits.shape == (P, 40, 6) and sc.rewards.shape == (40, 6)
    mass = sc.correct_mass()
    lo, hi = spec.competent_mass
    every = ((mass >= lo - 1e-9) & (mass <= hi + 1e-9)).all(axis=0)  # contexts all policies are competent on
    assert abs(every.sum() - round(overlap * 40)) <= (0 if P > 1 else 40)
    rescue = rescue_sets(sc)
    if P == 1:
        assert not rescue.any()
    else:
        assert (mass[rescue] < 1e-12).all()  # hard support: exp(-40)
        peer_only = np.array([(mass[np.arange(P) != i] >= lo - 1e-9).any(axis=0) & (mass[i] < lo) for i in range(P)])
        assert abs(rescue.sum() - hard * peer_only.sum()) <= P  # the requested share, per policy rounding


def test_generator_is_deterministic_and_seeded():
    a, b = generate_scenario(ScenarioSpec(seed=3)), generate_scenario(ScenarioSpec(seed=3))
    np.testing.assert_array_equal(a.init_logits, b.init_logits)
    c = generate_scenario(ScenarioSpec(seed=4))
    assert not np.array_equal(a.init_logits, c.init_logits)


def test_npz_round_trip(tmp_path):
    sc = generate_scenario(ScenarioSpec(n_contexts=16, n_arms=5, seed=1))
    sc = Scenario(sc.init_logits, sc.rewards, ("qwen", "llama"), np.ones((16, 5, 3)))
    p = save_scenario(tmp_path / "s.npz", sc)
    back = load_scenario(p)
    np.testing.assert_array_equal(back.init_logits, sc.init_logits)
    np.testing.assert_array_equal(back.rewards, sc.rewards)
    np.testing.assert_array_equal(back.features, sc.features)
    assert back.policy_names == ("qwen", "llama")


def test_npz_with_only_the_two_arrays(tmp_path):
    """A scenario calibrated elsewhere: just init_logits and rewards."""
    np.savez(tmp_path / "m.npz", init_logits=np.zeros((2, 3, 4)), rewards=np.full((3, 4), 0.25))
    sc = load_scenario(tmp_path / "m.npz")
    assert sc.policy_names == ("policy0", "policy1") and not sc.correct.any()


@pytest.mark.parametrize("arrays, msg", [
    (dict(init_logits=np.zeros((3, 4)), rewards=np.zeros((3, 4))), r"shape \[P, C, K\]"),
    (dict(init_logits=np.zeros((2, 3, 4)), rewards=np.zeros((3, 5))), "disagree on"),
    (dict(init_logits=np.zeros((2, 3, 4)), rewards=np.zeros(4)), r"shape \[C, K\]"),
    (dict(init_logits=np.full((2, 3, 4), np.nan), rewards=np.zeros((3, 4))), "NaN or inf"),
    (dict(init_logits=np.zeros((2, 3, 4)), rewards=np.full((3, 4), np.nan)), "NaN or inf"),
    (dict(init_logits=np.zeros((2, 3, 4)), rewards=np.full((3, 4), 1.5)), r"in \[0, 1\]"),
    (dict(init_logits=np.zeros((2, 3, 4)), rewards=np.full((3, 4), -0.1)), r"in \[0, 1\]"),
    (dict(init_logits=np.zeros((2, 3, 4))), "lacks array"),
    (dict(init_logits=np.zeros((2, 3, 4)), rewards=np.zeros((3, 4)), extra=np.zeros(2)), "unknown array"),
    (dict(init_logits=np.zeros((2, 3, 1)), rewards=np.zeros((3, 1))), "K >= 2"),
    (dict(init_logits=np.full((2, 3, 4), 1e39), rewards=np.zeros((3, 4))), r"reach 1e\+39, beyond \+-1e\+06"),
    (dict(init_logits=np.full((2, 3, 4), "a"), rewards=np.zeros((3, 4))), "init_logits must hold real numbers"),
    (dict(init_logits=np.zeros((2, 3, 4), complex), rewards=np.zeros((3, 4))), r"real numbers.*\(complex\)"),
    (dict(init_logits=np.zeros((2, 3, 4)), rewards=np.zeros((3, 4)), policy_names=np.array("ab")), "1-D array"),
    (dict(init_logits=np.zeros((2, 3, 4)), rewards=np.zeros((3, 4)), policy_names=np.array(["a", "a"])),
     "repeat a name"),
])
def test_bad_scenario_files_are_refused(tmp_path, arrays, msg):
    np.savez(tmp_path / "bad.npz", **arrays)
    with pytest.raises(ScenarioError, match=msg):
        load_scenario(tmp_path / "bad.npz")


def test_missing_and_pickled_files(tmp_path):
    with pytest.raises(ScenarioError, match="does not exist"):
        load_scenario(tmp_path / "nope.npz")
    with pytest.raises(ScenarioError, match="is a directory"):
        load_scenario(tmp_path)
    (tmp_path / "empty.npz").write_bytes(b"")
    with pytest.raises(ScenarioError, match="empty.npz is empty; write one with numpy.savez"):
        load_scenario(tmp_path / "empty.npz")
    (tmp_path / "text.npz").write_text("init_logits = 1\n")
    with pytest.raises(ScenarioError, match=r"not an .npz \(a zip archive\)"):
        load_scenario(tmp_path / "text.npz")
    np.savez(tmp_path / "obj.npz", init_logits=np.array([{"a": 1}], dtype=object), rewards=np.zeros((1, 2)))
    with pytest.raises(ScenarioError, match="not a plain .npz"):
        load_scenario(tmp_path / "obj.npz")


@pytest.mark.parametrize("bad", [dict(overlap=1.5), dict(overlap=0.8, unsolved=0.5), dict(n_correct=0),
                                 dict(competent_mass=(0.5, 0.2)), dict(correct_reward=0.4),
                                 dict(competent_mass=(0.5,)), dict(seed=-1), dict(logit_scale=-1.0)])
def test_bad_generator_settings(bad):
    with pytest.raises(ConfigError):
        replace(ScenarioSpec(), **bad)
