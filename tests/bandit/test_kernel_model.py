"""The kernel model (bandit_sim.models.KernelModel), the training split, and the kernel fit / prediction."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from bandit_sim.calibrate import Counts
from bandit_sim.config import SimConfig
from bandit_sim.engine import Engine
from bandit_sim.kernel_fit import (
    Curves,
    KernelSettings,
    kernel_config,
    kernel_scenario,
    log_likelihood,
    paired_ties,
    predict_kernel,
    simulate_kernel,
    summarise,
)
from bandit_sim.scenario import Scenario, ScenarioError
from shared_interfaces.config_io import ConfigError

REGIMES = ("grpo", "sgt", "prp_snapshot", "xgrpo")


def _scenario(P=2, C=12, K=6, kernel=None, train=None, seed=0):
    rng = np.random.default_rng(seed)
    init = rng.normal(size=(P, C, K))
    rew = np.zeros((C, K))
    rew[:, 0] = 1.0
    return Scenario(init, rew, tuple(f"p{i}" for i in range(P)), kernel=kernel, train=train)


def _run(sc, model, batch=4, **kw):
    cfg = SimConfig(regimes=REGIMES, steps=12, seeds=3, batch_prompts=batch, lr=0.5, model=model, dtype="float64",
                    record_every=4, **kw)
    return Engine(sc, cfg)


def test_identity_kernel_is_the_tabular_model_under_sgd():
    C = 12
    sc = _scenario(C=C, kernel=np.stack([np.eye(C)] * 2))
    tab, ker = _run(sc, "tabular").run(), _run(sc, "kernel").run()
    for name in tab.metrics:
        np.testing.assert_array_equal(tab.metrics[name], ker.metrics[name])


def test_a_step_moves_other_contexts_by_the_kernel():
    C = 6
    K = np.full((C, C), 0.0)
    np.fill_diagonal(K, 1.0)
    K[0, 5] = K[5, 0] = 0.5  # context 5 (held out) shares half of context 0's step
    K[0, 4] = K[4, 0] = -0.25  # context 4 (held out) is pushed the other way
    train = np.array([True, False, False, False, False, False])
    sc = _scenario(P=1, C=C, kernel=K[None], train=train)
    eng = _run(sc, "kernel", batch=1)
    before = eng.model.logits(0).clone()
    g = torch.zeros(len(REGIMES), 3, 1, 1, sc.n_arms, dtype=torch.float64)
    g[..., 0] = -1.0  # raise the correct arm of the batch context
    eng.model.apply(range(len(REGIMES)), torch.zeros(3, 1, dtype=torch.long), g)
    d = (eng.model.logits(0) - before)[:, 0, :, 0]  # [S, C]
    lr = 0.5 / K.diagonal().mean()
    np.testing.assert_allclose(d[:, 0], lr * 1.0)
    np.testing.assert_allclose(d[:, 5], lr * 0.5)
    np.testing.assert_allclose(d[:, 4], lr * -0.25)
    np.testing.assert_allclose(d[:, 1:4], 0.0)


def test_adam_steps_do_not_grow_with_the_gradient():
    """Adam-normalised: the first step's size is lr x (Kn g) / sqrt(g^T Kn g), the same for g and 10 g."""
    C = 6
    K = np.eye(C) + 0.2
    sc = _scenario(P=1, C=C, kernel=K[None])
    moves = []
    for scale in (1.0, 10.0):
        eng = Engine(sc, SimConfig(regimes=("grpo",), steps=1, seeds=1, batch_prompts=2, lr=0.1, model="kernel",
                                   optimizer="adam", dtype="float64"))
        before = eng.model.logits(0).clone()
        g = torch.zeros(1, 1, 2, 1, sc.n_arms, dtype=torch.float64)
        g[..., 0] = -scale
        eng.model.apply([0], torch.tensor([[0, 1]]), g)
        moves.append((eng.model.logits(0) - before)[0, 0, :, 0])
    np.testing.assert_allclose(moves[0], moves[1], rtol=1e-6)
    kn = K / K.diagonal().mean()
    step = kn[:, :2].sum(1)  # Kn g with g = -1 on contexts 0, 1
    np.testing.assert_allclose(moves[0].numpy(), 0.1 * step / np.sqrt(kn[:2, :2].sum()), rtol=1e-6)


def test_held_out_contexts_are_never_drawn():
    train = np.zeros(12, dtype=bool)
    train[[1, 3, 5, 7]] = True
    eng = _run(_scenario(kernel=np.stack([np.eye(12)] * 2), train=train), "kernel")
    for _ in range(5):
        assert set(eng.draw().ctx.unique().tolist()) <= {1, 3, 5, 7}
    with pytest.raises(ValueError, match="training contexts"):
        Engine(_scenario(train=train), SimConfig(regimes=("grpo",), steps=2, seeds=2, batch_prompts=5))


def test_kernel_model_inputs_are_checked():
    with pytest.raises(ConfigError, match="measured kernel"):
        _run(_scenario(), "kernel")
    with pytest.raises(ConfigError, match="drift"):
        SimConfig(model="kernel", drift=-1.0)
    with pytest.raises(ScenarioError, match=r"\[P, C, C\]"):
        _scenario(kernel=np.eye(12))
    bad = np.stack([np.eye(12)] * 2)
    bad[0, 3, 3] = 0.0
    with pytest.raises(ScenarioError, match="diagonal"):
        _scenario(kernel=bad)
    with pytest.raises(ScenarioError, match="NaN"):
        _scenario(kernel=np.full((2, 12, 12), np.nan))
    with pytest.raises(ScenarioError, match="no context"):
        _scenario(train=np.zeros(12, dtype=bool))
    with pytest.raises(ScenarioError, match="bool mask"):
        _scenario(train=np.ones(5, dtype=bool))


def test_drift_is_the_same_noise_in_every_regime_and_temperature_sharpens_grpo():
    C = 12
    sc = _scenario(C=C, kernel=np.stack([np.eye(C)] * 2))
    eng = Engine(sc, SimConfig(regimes=("grpo", "xgrpo"), steps=1, seeds=2, batch_prompts=4, lr=1e-9, model="kernel",
                               dtype="float64", drift=0.3))
    before = eng.model.all_logits().clone()
    eng.step()
    d = (eng.model.all_logits() - before)[..., 0]  # [R, S, P, C]
    np.testing.assert_allclose(d[0], d[1], atol=1e-6)
    assert 0.15 < float(d.std()) < 0.45
    easy = np.zeros((2, C, 6))
    easy[..., 0] = 1.5  # the correct arm is the mode: GRPO's step raises the inverse temperature
    rew = np.zeros((C, 6))
    rew[:, 0] = 1.0
    sc2 = Scenario(easy, rew, ("a", "b"), kernel=np.stack([np.eye(C)] * 2))
    eng = Engine(sc2, SimConfig(regimes=("grpo",), steps=30, seeds=4, batch_prompts=4, lr=0.1, model="kernel",
                                dtype="float64", temperature_lr=0.01))
    for _ in range(30):
        eng.step()
    assert float(eng.model.beta.mean()) > 1.05


def _curves(P=2, C=8, T=3, seed=0, entropy=True):
    rng = np.random.default_rng(seed)
    n = np.full((P, T, C), 8)
    s = rng.integers(0, 9, size=(P, T, C))
    s[:, 0] = rng.integers(1, 9, size=(P, C))
    s[0, 0, :2] = 0  # never solved by p0 at step 0 ...
    s[1, 0, :2] = 5  # ... while p1 did: p0's rescue set (if trained)
    g = np.zeros((P, T, C))
    train = np.array([True] * (C // 2) + [False] * (C - C // 2))
    fams = tuple(["a", "b"] * (C // 2))
    es = np.arange(0, 20)
    ent = (np.exp(-0.01 * es)[None].repeat(P, 0) + 0.01 * rng.random((P, len(es)))) if entropy else np.zeros((P, 0))
    return Curves(np.array([0, 10, 20][:T]), s, n, g, train, fams, es if entropy else np.zeros(0), ent, 20)


def test_curves_observed_and_their_empty_cases():
    cv = _curves()
    obs = cv.observed()
    assert set(obs) == {"final", "heldout", "heldout_change", "rescue_rate"}
    tr = cv.train
    want = np.mean([cv.successes[p, -1, tr].sum() / cv.samples[p, -1, tr].sum() for p in range(2)])
    assert obs["final"] == pytest.approx(want)
    assert cv.rescue_set()[0, :2].all() and not cv.rescue_set()[1].any()
    ratio, se = cv.entropy_ratio()
    assert np.isfinite(ratio).all() and (ratio < 0).all() and (se > 0).all()
    assert np.isnan(_curves(entropy=False).entropy_ratio()[0]).all()
    cv2 = _curves()
    cv2.successes[1, 0, :2] = 0  # nobody solved the first two prompts: no rescue set
    assert math.isnan(cv2.observed()["rescue_rate"])
    with pytest.raises(ConfigError, match="step-0 evaluation"):
        Curves(np.array([0]), np.zeros((1, 1, 2)), np.ones((1, 1, 2)), np.zeros((1, 1, 2)), np.ones(2, bool), None,
               np.zeros(0), np.zeros((1, 0)), 5)
    with pytest.raises(ConfigError, match="disagree"):
        Curves(np.array([0, 1]), np.zeros((1, 2, 2)), np.ones((1, 2, 3)), np.zeros((1, 2, 3)), np.ones(3, bool), None,
               np.zeros(0), np.zeros((1, 0)), 5)


def _run_settings(steps=20):
    return {"steps": steps, "prompts_per_step": 2, "group_size": 4, "seed": 0, "eval_k": 8,
            "regime": {"name": "grpo", "sgt": {"weight": 0.05}}, "loss": {}}


def test_fit_and_prediction_on_a_small_case():
    cv = _curves()
    C = cv.train.size
    K = np.where(np.equal.outer(np.array(cv.families), np.array(cv.families)), 0.3, -0.05)
    np.fill_diagonal(K, 1.0)
    K = np.stack([K, K])
    counts = Counts(cv.samples[:, 0], cv.successes[:, 0], np.zeros((2, C), bool))
    ks = KernelSettings(0.1, 0.003, 0.02, 1e-3)
    sc = kernel_scenario(counts, K, cv.train, ("p0", "p1"), 6, ks.floor)
    traj = simulate_kernel(sc, kernel_config(_run_settings(), REGIMES, sc, ks, 4), cv.steps, 8)
    assert traj.q.shape == (len(REGIMES), 3, 4, 2, C)
    np.testing.assert_allclose(traj.q[:, 0], traj.q[:1, 0].repeat(len(REGIMES), 0))  # every regime starts alike
    assert math.isfinite(log_likelihood(traj, cv))
    # the entropy term is a penalty (off by default: ENTROPY_WEIGHT), absent when the run recorded no entropy
    assert log_likelihood(traj, cv, entropy_weight=1.0) < log_likelihood(traj, cv, entropy_weight=0.0)
    flat = _curves(entropy=False)
    assert log_likelihood(traj, flat, entropy_weight=1.0) == log_likelihood(traj, flat, entropy_weight=0.0)
    summ = summarise(traj, cv, 8)
    assert set(summ) == set(REGIMES) and summ["grpo"]["final"]["ci95"] > 0
    assert paired_ties(summ, "final", "grpo") is not None
    res = predict_kernel(counts, K, cv, ("p0", "p1"), _run_settings(), REGIMES, seeds=4, arms=6, fit_seeds=2)
    assert res["use"] in REGIMES and res["clear_winner"] == (not res["ties_with_use"])
    with pytest.raises(ConfigError, match="fitted on a GRPO run"):
        predict_kernel(counts, K, cv, ("p0", "p1"), {**_run_settings(), "regime": {"name": "sgt"}}, REGIMES, seeds=2,
                       arms=6, fit_seeds=2)
    with pytest.raises(ConfigError, match="floor"):
        kernel_scenario(counts, K, cv.train, ("p0", "p1"), 6, 0.7)


def test_profile_weights_temper_by_the_dispersion_and_drop_the_negligible():
    from bandit_sim.kernel_fit import MIN_WEIGHT, profile_weights

    a, b, c = (KernelSettings(lr, 0.0, 0.0, 1e-3) for lr in (0.01, 0.1, 1.0))
    assert profile_weights([], 1.0) == []
    assert profile_weights([(a, -math.inf)], 1.0) == []  # every point diverged
    w = dict(profile_weights([(a, -10.0), (b, -11.0), (c, -100.0)], 1.0))
    assert set(w) == {a, b} and math.isclose(sum(w.values()), 1.0)
    assert math.isclose(w[b] / w[a], math.exp(-1.0))
    tempered = dict(profile_weights([(a, -10.0), (b, -11.0)], 2.0))  # quasi-likelihood: ll / phi
    assert math.isclose(tempered[b] / tempered[a], math.exp(-0.5))
    assert profile_weights([(a, -10.0), (b, -11.0)], math.nan) == profile_weights([(a, -10.0), (b, -11.0)], 1.0)
    far = -10.0 + math.log(MIN_WEIGHT) - 1e-6
    assert dict(profile_weights([(a, -10.0), (b, far)], 1.0)) == {a: 1.0}


def _summary(mean_seeds, prompts):
    return {"final": {"mean": float(np.mean(mean_seeds)), "ci95": 0.01, "per_seed": np.asarray(mean_seeds),
                      "per_prompt": np.asarray(prompts)}}


def test_mix_of_one_point_is_that_point_and_the_spread_between_points_widens_it():
    from bandit_sim.kernel_fit import mix

    assert mix([]) == {}
    one = {"grpo": _summary([0.3, 0.31, 0.29], [0.3, 0.3]), "sgt": _summary([0.2, 0.21, 0.19], [0.2, 0.2])}
    m = mix([(1.0, one)])
    assert m["grpo"]["final"]["mean"] == pytest.approx(0.3) and m["grpo"]["final"]["ci95"] == pytest.approx(0.01)
    assert paired_ties(m, "final", "grpo") == paired_ties(one, "final", "grpo") == []
    # a second learning rate, as likely, under which SGT is the better: the mixture cannot separate them
    other = {"grpo": _summary([0.3, 0.31, 0.29], [0.3, 0.3]), "sgt": _summary([0.4, 0.41, 0.39], [0.4, 0.4])}
    both = mix([(0.5, one), (0.5, other)])
    assert both["sgt"]["final"]["mean"] == pytest.approx(0.3)
    assert both["sgt"]["final"]["ci95"] > 0.19  # the points' spread (0.1 either side) dominates
    assert paired_ties(both, "final", "grpo") == ["sgt"]
    missing = {"grpo": {"final": {"mean": None, "ci95": None, "per_seed": None, "per_prompt": None}}}
    assert mix([(1.0, missing)])["grpo"]["final"]["mean"] is None


def test_the_fit_is_the_best_of_a_profile_over_the_learning_rates():
    from bandit_sim.kernel_fit import LR_GRID, dispersion, fit_kernel

    cv = _curves()
    C = cv.train.size
    K = np.stack([np.eye(C), np.eye(C)])
    counts = Counts(cv.samples[:, 0], cv.successes[:, 0], np.zeros((2, C), bool))
    fit = fit_kernel(counts, K, cv, ("p0", "p1"), _run_settings(), arms=6, seeds=2, rounds=1)
    assert [ks.lr for ks, _ in fit["profile"]] == list(LR_GRID)
    assert fit["log_likelihood"] == max(ll for _, ll in fit["profile"])
    assert fit["settings"] == max(fit["profile"], key=lambda p: p[1])[0]
    assert fit["dispersion"] >= 1.0
    ks = fit["settings"]
    sc = kernel_scenario(counts, K, cv.train, ("p0", "p1"), 6, ks.floor)
    traj = simulate_kernel(sc, kernel_config(_run_settings(), ("grpo",), sc, ks, 2), cv.steps, 8)
    assert dispersion(traj, cv) == fit["dispersion"]


def test_dispersion_is_one_when_nothing_after_step_0_was_evaluated():
    from dataclasses import replace as dc_replace

    from bandit_sim.kernel_fit import dispersion

    cv = _curves()
    C = cv.train.size
    K = np.stack([np.eye(C), np.eye(C)])
    counts = Counts(cv.samples[:, 0], cv.successes[:, 0], np.zeros((2, C), bool))
    ks = KernelSettings(0.1, 0.0, 0.0, 1e-3)
    sc = kernel_scenario(counts, K, cv.train, ("p0", "p1"), 6, ks.floor)
    traj = simulate_kernel(sc, kernel_config(_run_settings(), ("grpo",), sc, ks, 2), cv.steps, 8)
    samples = cv.samples.copy()
    samples[:, 1:] = 0
    empty = dc_replace(cv, samples=samples, successes=np.where(samples > 0, cv.successes, 0))
    assert dispersion(traj, empty) == 1.0
    assert dispersion(traj, cv) >= 1.0
