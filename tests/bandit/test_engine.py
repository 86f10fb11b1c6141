"""The engine against the naive per-seed/policy/prompt loop, sharding, models, diagnostics."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from bandit_sim.config import SimConfig
from bandit_sim.engine import Engine
from bandit_sim.runner import run_config
from experiments.bench.naive_bandit import naive_metrics, naive_step
from shared_interfaces.regimes import PRPConfig, SGTConfig
from tests.bandit.helpers import random_scenario, rescue_scenario

REGIMES = ("grpo", "xgrpo", "prp_snapshot", "prp_thl", "sgt", "prp_thl+sgt")


def _cfg(**kw) -> SimConfig:
    base = dict(regimes=REGIMES, steps=4, seeds=3, batch_prompts=5, group_size=4, lr=3.0, epochs=3,
                thl_sigma=0.7, thl_bias=0.1, dtype="float64", threads=1, record_every=2,
                prp=PRPConfig(peer_weight=0.5, ratio_cap=1.5))
    return SimConfig(**{**base, **kw})


def test_engine_step_equals_naive_loop():
    """Same draws -> the same logits after a step (3 epochs, so clipping and PRP ratios matter)."""
    sc = random_scenario(P=2, C=8, K=5, seed=2, divergence=1.0)
    eng = Engine(sc, _cfg())
    theta = eng.model.all_logits().numpy().copy()
    for _ in range(2):
        stats = eng.step()
        d = eng.last_draw
        naive_step(theta, eng.specs, sc.rewards, d.ctx.numpy(), d.u_arm.numpy(), d.u_reward.numpy(),
                   d.xi.numpy(), lr=3.0, epochs=3, clip_low=0.2, clip_high=0.2, thl_sigma=0.7, thl_bias=0.1)
    np.testing.assert_allclose(eng.model.all_logits().numpy(), theta, rtol=1e-9, atol=1e-9)
    assert not np.allclose(theta, sc.init_logits[None, None])
    assert stats["clip_fraction"].max() > 0  # clipping was exercised
    m = eng.policy_metrics()
    acc, kl, ent = naive_metrics(theta, sc.init_logits, sc.rewards)
    np.testing.assert_allclose(m["accuracy"].numpy(), acc, rtol=1e-9)
    np.testing.assert_allclose(m["kl_to_init"].numpy(), kl, rtol=1e-7, atol=1e-12)
    np.testing.assert_allclose(m["entropy"].numpy(), ent, rtol=1e-9)


@pytest.mark.parametrize("selection", ["shortest", "random"])  # seed shards; regime shards
def test_sharding_over_workers_is_exact(selection):
    sc = random_scenario(P=2, C=10, K=6, seed=4)
    cfg = _cfg(regimes=("grpo", "prp_thl", "prp_snapshot", "sgt"), steps=6, seeds=5, dtype="float32",
               sgt=SGTConfig(selection=selection))
    one = run_config(cfg, sc, workers=1)
    two = run_config(cfg, sc, workers=2)
    assert one.regimes == two.regimes
    for key in one.metrics:
        np.testing.assert_array_equal(one.metrics[key], two.metrics[key], err_msg=key)


def test_a_regime_runs_the_same_alone_or_with_others():
    """Alone, a regime's loss is its own call; beside others it shares one with the regimes that have as
    many rows (bandit_sim.groups). Bit for bit the same run, with and without the plan tables."""
    sc = random_scenario(P=2, C=10, K=6, seed=4)
    for table in (True, False):
        cfg = _cfg(regimes=REGIMES, dtype="float32", plan_table=table)
        together = Engine(sc, cfg).run()
        for r, name in enumerate(REGIMES):
            alone = Engine(sc, replace(cfg, regimes=(name,))).run()
            for key in together.metrics:
                np.testing.assert_array_equal(together.metrics[key][:, r], alone.metrics[key][:, 0], err_msg=key)


def test_plan_tables_give_the_same_run_as_the_core_call_per_step():
    sc = random_scenario(P=2, C=10, K=6, seed=4)
    cfg = _cfg(regimes=REGIMES, dtype="float32", steps=8)  # P * G = 8 bits: every regime is tabulated
    runs = [Engine(sc, replace(cfg, plan_table=t)) for t in (True, False)]
    assert all(t is not None for t in runs[0].tables) and all(t is None for t in runs[1].tables)
    a, b = (e.run() for e in runs)
    for key in a.metrics:
        np.testing.assert_array_equal(a.metrics[key], b.metrics[key], err_msg=key)
    np.testing.assert_array_equal(runs[0].model.all_logits().numpy(), runs[1].model.all_logits().numpy())


def test_loglinear_learning_on_one_prompt_moves_others():
    sc = random_scenario(P=2, C=12, K=6, seed=6)
    cfg = _cfg(regimes=("grpo",), model="loglinear", batch_prompts=1, steps=1, epochs=1, lr=50.0, seeds=8)
    eng = Engine(sc, cfg)
    eng.step()
    moved = ~np.isclose(eng.model.all_logits().numpy(), sc.init_logits[None, None]).all(axis=-1)  # [R, S, P, C]
    learned = moved.any(axis=-1)  # seeds/policies whose batch had a non-degenerate group
    assert learned.any()
    assert (moved.sum(axis=-1)[learned] > 1).all()  # ... moved more contexts than the one trained on
    tab = Engine(sc, replace(cfg, model="tabular"))
    tab.step()
    moved_t = ~np.isclose(tab.model.all_logits().numpy(), sc.init_logits[None, None]).all(axis=-1)
    assert moved_t.sum(axis=-1).max() == 1  # tabular: only the trained context


def test_adam_optimizer_runs_and_learns():
    sc = random_scenario(P=2, C=10, K=6, seed=7)
    res = Engine(sc, _cfg(regimes=("grpo", "sgt"), optimizer="adam", lr=0.1, steps=20, record_every=10)).run()
    acc = res.metrics["accuracy"]
    assert np.nanmean(acc[-1]) > np.nanmean(acc[0])


def test_diagnostics_apply_where_they_should():
    sc = random_scenario(P=2, C=10, K=6, seed=8)
    res = Engine(sc, _cfg(regimes=("grpo", "xgrpo", "prp_snapshot", "prp_thl", "sgt"), dtype="float32")).run()
    rv = res.metrics["ratio_variance"][-1]  # [R, S, P]
    assert np.isnan(rv[[0, 1, 4]]).all() and np.isfinite(rv[[2, 3]]).all()
    assert np.nanmax(res.metrics["sgt_activations_total"][-1, :4]) == 0
    assert np.isfinite(res.metrics["grad_norm"][1:]).all()


def test_a_run_whose_logits_become_non_finite_is_an_error_naming_it():
    """An lr too large for the dtype made the log-linear weights NaN: the run went on and reported accuracy null
    (``bandit_sim run`` then failed formatting it; a sweep wrote the nulls as results)."""
    from bandit_sim.engine import DivergedError

    sc = random_scenario(P=2, C=10, K=6, seed=8)
    cfg = _cfg(regimes=("grpo", "sgt"), model="loglinear", dtype="float32", lr=1e30, steps=6, record_every=3)
    with pytest.raises(DivergedError, match=r"regime (grpo|sgt), seed \d, policy \w+: the loglinear model's logits "
                                            r"became non-finite between step 0 and step 3 .*lr 1e\+30.*lower lr"):
        Engine(sc, cfg).run()
    res = Engine(sc, replace(cfg, lr=0.5)).run()  # the same run at a sane lr is finite throughout
    assert np.isfinite(res.metrics["accuracy"]).all()


@pytest.mark.parametrize("bad, msg", [
    (dict(batch_prompts=99), "exceeds the scenario's"),
    # the log-linear features [C, K, D] were not in the estimate: numpy's MemoryError traceback instead
    (dict(model="loglinear", feature_dim=10**11), "this run would need about .* or feature_dim"),
])
def test_engine_rejects_bad_settings(bad, msg):
    with pytest.raises(ValueError, match=msg):
        Engine(random_scenario(P=2, C=10, K=6), _cfg(**bad))


def test_sgt_prompt_normalisation_equals_naive_loop():
    """``sgt.normalize: prompt`` (lambda per rescued prompt) through the engine's grouped loss and plan
    tables equals the naive loop; and it differs from ``batch`` when several prompts are rescued."""
    sc = rescue_scenario(K=5)  # contexts 0-1: policy 0 rescued by policy 1
    runs = {}
    for normalize in ("batch", "prompt"):
        cfg = _cfg(regimes=("sgt", "prp_thl+sgt", "grpo"), batch_prompts=4,
                   sgt=SGTConfig(weight=0.7, successes_per_prompt=2, normalize=normalize))
        eng = Engine(sc, cfg)
        theta = eng.model.all_logits().numpy().copy()
        for _ in range(3):
            stats = eng.step()
            d = eng.last_draw
            naive_step(theta, eng.specs, sc.rewards, d.ctx.numpy(), d.u_arm.numpy(), d.u_reward.numpy(),
                       d.xi.numpy(), lr=3.0, epochs=3, clip_low=0.2, clip_high=0.2, thl_sigma=0.7, thl_bias=0.1)
            assert stats["sgt_activations"][0].max() >= 2  # several rescued prompts in a step
        np.testing.assert_allclose(eng.model.all_logits().numpy(), theta, rtol=1e-9, atol=1e-9)
        runs[normalize] = theta
    assert not np.allclose(runs["batch"][0], runs["prompt"][0])
    np.testing.assert_array_equal(runs["batch"][2], runs["prompt"][2])  # grpo has no SGT term


def test_regimes_with_different_sgt_rules_are_kept_apart():
    from bandit_sim.groups import partition

    parts = partition([0, 1, 2, 3], [4, 4, 4, 4], [(1.0, "batch"), (1.0, "prompt"), None, (1.0, "batch")])
    assert parts == [((1.0, "batch"), [0, 2, 3]), ((1.0, "prompt"), [1])]
    assert partition([], [], []) == []


def test_kl_reaches_only_own_rows(monkeypatch):
    """The engine hands the core's loss the own-row mask (KL on own rows, item 18)."""
    import bandit_sim.engine as engine_mod

    seen = []
    real = engine_mod.regime_loss_fast

    def spy(*args, **kw):
        seen.append(kw["own_mask"])
        return real(*args, **kw)

    monkeypatch.setattr(engine_mod, "regime_loss_fast", spy)
    sc = random_scenario(P=2, C=8, K=5, seed=2)
    from shared_interfaces.regimes import LossConfig

    Engine(sc, _cfg(regimes=("prp_snapshot",), loss=LossConfig(kl_coef=0.1))).step()
    own = seen[0]
    assert own.dtype == torch.bool and own.shape[-1] == 2 * 5 * 4 and own.any() and not own.all()
