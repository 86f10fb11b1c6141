"""The scenario as a gymnasium environment: one-step episodes, observation = context, action = arm.

``reset`` draws a context uniformly (the observation, ``Discrete(C)``); ``step(a)`` returns
``r ~ Bernoulli(rewards[c, a])`` and ends the episode; ``info`` carries ``correct`` (the arm's reward
probability reaches the success threshold) and ``reward_prob``. Registered as
``bandit_sim/ContextualBandit-v0`` (``gymnasium.make(ENV_ID, scenario=...)``, where ``scenario`` is a
:class:`bandit_sim.scenario.Scenario` or the path of a ``.npz``). The vectorised engine samples from the
same reward model; ``tests/bandit/test_env.py`` checks that both give the same reward distribution.
"""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from bandit_sim.scenario import Scenario, load_scenario

ENV_ID = "bandit_sim/ContextualBandit-v0"


class ContextualBanditEnv(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self, scenario: Scenario | str | Path):
        self.scenario = scenario if isinstance(scenario, Scenario) else load_scenario(scenario)
        self.observation_space = spaces.Discrete(self.scenario.n_contexts)
        self.action_space = spaces.Discrete(self.scenario.n_arms)
        self._context: int | None = None

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self._context = int(self.np_random.integers(self.scenario.n_contexts))
        return self._context, {}

    def step(self, action):
        if self._context is None:
            raise RuntimeError("call reset() before step(): each episode is one context and one arm")
        if not self.action_space.contains(action):
            raise ValueError(f"action {action!r} is not an arm in [0, {self.scenario.n_arms})")
        p = float(self.scenario.rewards[self._context, int(action)])
        reward = float(self.np_random.random() < p)
        info = {"correct": bool(self.scenario.correct[self._context, int(action)]), "reward_prob": p,
                "context": self._context}
        self._context = None
        return 0, reward, True, False, info

    def policy_probs(self, policy: int) -> np.ndarray:
        """The scenario's initial policy ``pi_policy,0 [C, K]`` (for agents that want to act with it)."""
        return self.scenario.init_probs()[policy]


def register() -> None:
    if ENV_ID not in gym.registry:
        gym.register(id=ENV_ID, entry_point="bandit_sim.env:ContextualBanditEnv")


register()
