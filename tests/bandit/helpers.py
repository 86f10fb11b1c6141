"""Small hand-built scenarios for the analytic tests."""

from __future__ import annotations

import numpy as np

from bandit_sim.scenario import Scenario, default_names


def logits_with_correct_mass(K: int, correct: int, mass: float, rng: np.random.Generator, scale: float = 0.5):
    """Logits over K arms whose softmax puts exactly ``mass`` on arm ``correct``."""
    z = rng.normal(0.0, scale, size=K)
    others = np.delete(np.arange(K), correct)
    log_w = np.logaddexp.reduce(z[others])
    z[correct] = np.log(mass) - np.log1p(-mass) + log_w
    return z


def rescue_scenario(K: int = 4, hard_mass: float = 1e-14, peer_mass: float = 1 - 1e-6, seed: int = 0) -> Scenario:
    """Two policies, four contexts, arm 0 correct everywhere. Contexts 0-1: policy 0 has hard support
    (``pi_0(correct) = hard_mass < 1e-12``) while policy 1 succeeds almost surely; contexts 2-3: both
    policies are moderately competent (``pi(correct) = 0.3``)."""
    rng = np.random.default_rng(seed)
    C = 4
    rewards = np.zeros((C, K))
    rewards[:, 0] = 1.0
    init = np.zeros((2, C, K))
    for c in range(C):
        init[0, c] = logits_with_correct_mass(K, 0, hard_mass if c < 2 else 0.3, rng)
        init[1, c] = logits_with_correct_mass(K, 0, peer_mass if c < 2 else 0.3, rng)
    return Scenario(init, rewards, default_names(2))


def random_scenario(P: int, C: int, K: int, seed: int = 0, divergence: float = 1.0) -> Scenario:
    """Random rewards; policy p's logits = a shared base + ``divergence`` x its own noise."""
    rng = np.random.default_rng(seed)
    base = rng.normal(0, 1, size=(C, K))
    init = np.stack([base + divergence * rng.normal(0, 1, size=(C, K)) for _ in range(P)])
    rewards = (rng.random((C, K)) < 0.3).astype(float)
    rewards[np.arange(C), rng.integers(0, K, size=C)] = 1.0
    return Scenario(init, rewards, default_names(P))
