"""The gymnasium environment and the vectorised engine draw the same rewards for the same scenario."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from bandit_sim.config import SimConfig
from bandit_sim.engine import Engine
from bandit_sim.env import ENV_ID
from bandit_sim.scenario import ScenarioSpec, generate_scenario, save_scenario


@pytest.fixture(scope="module")
def scenario():
    sc = generate_scenario(ScenarioSpec(n_contexts=12, n_arms=6, n_correct=2, seed=5, correct_reward=0.8,
                                        wrong_reward=0.15))
    return sc


def test_registered_and_one_step_episodes(scenario, tmp_path):
    env = gym.make(ENV_ID, scenario=save_scenario(tmp_path / "s.npz", scenario))
    obs, _ = env.reset(seed=1)
    assert env.observation_space.contains(obs) and env.action_space.n == 6
    _, r, terminated, truncated, info = env.step(2)
    assert terminated and not truncated and r in (0.0, 1.0) and info["reward_prob"] == scenario.rewards[obs, 2]
    with pytest.raises(ValueError, match="not an arm"):
        env.reset()
        env.step(6)


def test_env_and_engine_give_the_same_reward_distribution(scenario):
    """Policy 0's initial policy acting in the env vs the engine's rollouts (no learning), same scenario:
    per-context mean rewards agree within sampling error (chi-square over contexts), and both agree with
    the exact expectation sum_a pi(a|c) rewards[c, a]."""
    C = scenario.n_contexts
    pi = scenario.init_probs()[0]
    exact = (pi * scenario.rewards).sum(-1)
    # the env, with arms drawn from pi_0
    env = gym.make(ENV_ID, scenario=scenario)
    rng = np.random.default_rng(0)
    env_sum, env_n = np.zeros(C), np.zeros(C)
    obs, _ = env.reset(seed=0)
    for _ in range(30_000):
        a = int(rng.choice(6, p=pi[obs]))
        _, r, _, _, _ = env.step(a)
        env_sum[obs] += r
        env_n[obs] += 1
        obs, _ = env.reset()
    # the engine: every context each step, rewards of policy 0's samples
    eng = Engine(scenario, SimConfig(regimes=("grpo",), seeds=50, batch_prompts=C, group_size=20, threads=1))
    eng_sum, eng_n = np.zeros(C), np.zeros(C)
    for _ in range(3):
        d = eng.draw()
        ro = eng.rollout(d)
        r = ro.rewards[0, :, :, 0].sum(-1)  # [S, B]
        np.add.at(eng_sum, d.ctx.numpy().ravel(), r.numpy().ravel())
        np.add.at(eng_n, d.ctx.numpy().ravel(), np.full(r.numel(), 20))
    for s, n in ((env_sum, env_n), (eng_sum, eng_n)):
        z = (s / n - exact) / np.sqrt(exact * (1 - exact) / n)
        assert (z**2).sum() < 40.0, z  # chi-square with 12 dof: p < 1e-4 above 40
    pooled = (env_sum + eng_sum) / (env_n + eng_n)
    se = np.sqrt(pooled * (1 - pooled) * (1 / env_n + 1 / eng_n))
    z2 = ((env_sum / env_n - eng_sum / eng_n) / se) ** 2
    assert z2.sum() < 40.0
