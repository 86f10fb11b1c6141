"""Calibration: measured per-prompt success counts -> a bandit scenario (contexts = prompts).

Input, per policy ``i`` and prompt ``x`` (pooled over the runs' step-0 evaluations): ``n`` sampled
responses, ``s`` verified successes among them, and whether the greedy answer was correct (``g``).

**Success probability.** ``p[i, x]`` is

* ``s / n`` when ``0 < s < n``;
* ``p_never`` when ``s = 0`` and the greedy answer was wrong: the prompt was **never solved**.
  ``p_never = alpha / D`` with ``D = steps * min(B, C) / C * G`` the number of times the policy
  samples ``x`` during the run in expectation: a success would show up anywhere in the run's draws
  with probability about ``alpha`` (default 0.01). This is the "never sampled in G draws" floor —
  hard support on the bandit's scale, as the scenario generator's ``hard_log_mass`` is;
* ``1/(2n)`` when ``s = 0`` but the greedy answer was right (half a success: the mode is correct);
* ``1 - p_never`` when ``s = n``: never failed, the mirror of the floor (it keeps the scenario's
  initial accuracy equal to the LLM's measured one, up to ``p_never`` per such prompt).

**Arms.** ``K`` arms per context: arm 0 is the correct one (reward 1), arms ``1..K-1`` wrong
(reward 0), the same for every policy (arms are responses; policies share the response space). Policy
``i``'s logits on ``x``: 0 on every wrong arm and ``z = log(p / (1 - p)) + log(K - 1)`` on the correct
arm, so that ``softmax(z)_0 = e^z / (e^z + K - 1) = p`` exactly.

**Rescue set** (the issue's and :mod:`mrl_llm.evaluate`'s peer-exclusive prompts): policy ``i``'s prompts
it never solved at step 0 (``s = 0`` and greedy wrong) while some peer ``j != i`` solved them
(``s > 0`` or greedy right).

**The evaluation protocol in the bandit** (:func:`solve_probability`): the LLM counts a prompt solved
at an evaluation when its greedy answer or any of its ``k`` samples is correct; in the bandit the greedy
answer is the arg-max arm, so ``P(solved) = 1`` when the arg-max arm is correct, else ``1 - (1 - p)^k``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from bandit_sim.scenario import Scenario

CORRECT_ARM = 0


#: The most arms a calibrated scenario has: its [P, C, K] logits are allocated whole.
MAX_ARMS = 4096


@dataclass(frozen=True)
class CalibrationConfig:
    """``arms``: K; ``alpha``: the never-solved floor's expected number of successes over the run
    (module docstring; 0.01 = hard support, 1 = about one success in the whole run)."""

    arms: int = 16
    alpha: float = 0.01

    def __post_init__(self) -> None:
        if self.arms < 2:
            raise ValueError(f"calibration: need at least 2 arms (one correct, one wrong), got {self.arms}")
        if self.arms > MAX_ARMS:
            raise ValueError(f"calibration: {self.arms} arms is beyond {MAX_ARMS} (the wrong arms are alike, the "
                             f"default 16 is enough); give --arms <= {MAX_ARMS}")
        if not self.alpha > 0:
            raise ValueError(f"calibration: alpha must be > 0, got {self.alpha}")


@dataclass(frozen=True)
class Counts:
    """Step-0 counts ``[P, C]``: samples ``n``, successes ``s``, greedy correct ``g`` (bool)."""

    n: np.ndarray
    s: np.ndarray
    g: np.ndarray

    def __post_init__(self) -> None:
        n, s, g = (np.asarray(a) for a in (self.n, self.s, self.g))
        if not (n.shape == s.shape == g.shape and n.ndim == 2):
            raise ValueError(f"counts: n, s, g must share a [P, C] shape, got {n.shape}, {s.shape}, {g.shape}")
        if (n < 1).any():
            raise ValueError("counts: every (policy, prompt) needs at least one sampled response at step 0; "
                             "run the LLM with eval.k >= 1")
        if (s < 0).any() or (s > n).any():
            raise ValueError("counts: successes must lie in [0, samples]")
        object.__setattr__(self, "n", n.astype(np.int64))
        object.__setattr__(self, "s", s.astype(np.int64))
        object.__setattr__(self, "g", g.astype(bool))

    @property
    def solved(self) -> np.ndarray:
        """``[P, C]``: a success among the samples or a correct greedy answer."""
        return (self.s > 0) | self.g


def never_floor(alpha: float, steps: int, batch_prompts: int, n_contexts: int, group_size: int) -> float:
    """``p_never = alpha / D``, ``D = steps * min(B, C) / C * G`` (module docstring)."""
    draws = steps * min(batch_prompts, n_contexts) / n_contexts * group_size
    return alpha / max(draws, 1.0)


def success_probabilities(counts: Counts, p_never: float) -> np.ndarray:
    """``[P, C]`` success probabilities from the counts (the four cases of the module docstring)."""
    n = counts.n.astype(np.float64)
    p = counts.s / n
    p = np.where(counts.s == counts.n, 1.0 - p_never, p)
    p = np.where((counts.s == 0) & counts.g, 0.5 / n, p)
    return np.where((counts.s == 0) & ~counts.g, p_never, p)


def correct_logit(p: np.ndarray, arms: int) -> np.ndarray:
    """The correct arm's logit against ``K - 1`` wrong arms at 0: ``log(p / (1 - p)) + log(K - 1)``."""
    p = np.asarray(p, dtype=np.float64)
    if ((p <= 0) | (p >= 1)).any():
        raise ValueError("correct_logit: probabilities must lie strictly between 0 and 1")
    return np.log(p) - np.log1p(-p) + math.log(arms - 1)


def scenario_from_probabilities(p: np.ndarray, arms: int, policy_names: tuple[str, ...]) -> Scenario:
    """``p [P, C]`` -> a scenario whose policy ``i`` pulls the correct arm on ``x`` with probability
    ``p[i, x]`` (arm :data:`CORRECT_ARM`; module docstring)."""
    P, C = p.shape
    init = np.zeros((P, C, arms))
    init[..., CORRECT_ARM] = correct_logit(p, arms)
    rewards = np.zeros((C, arms))
    rewards[:, CORRECT_ARM] = 1.0
    return Scenario(init, rewards, tuple(policy_names))


def rescue_set(counts: Counts) -> np.ndarray:
    """``[P, C]`` bool: never solved by the policy at step 0, solved by some peer (module docstring)."""
    solved = counts.solved
    P = solved.shape[0]
    out = np.zeros_like(solved)
    for i in range(P):
        peers = np.delete(solved, i, axis=0)
        if peers.size:
            out[i] = ~solved[i] & peers.any(axis=0)
    return out


def solve_probability(logits: np.ndarray, k: int) -> np.ndarray:
    """``logits [..., K]`` (arm :data:`CORRECT_ARM` correct) -> ``P(solved)`` under the LLM's evaluation
    protocol: 1 when the arg-max arm is correct, else ``1 - (1 - p)^k`` (module docstring)."""
    z = np.asarray(logits, dtype=np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    p = e[..., CORRECT_ARM] / e.sum(axis=-1)
    greedy = z.argmax(axis=-1) == CORRECT_ARM
    return np.where(greedy, 1.0, 1.0 - (1.0 - p) ** k)


@dataclass(frozen=True)
class Calibration:
    """One LLM seed's calibrated scenario, with what it was built from."""

    scenario: Scenario
    prompt_ids: tuple[str, ...]
    counts: Counts
    p: np.ndarray
    rescue: np.ndarray
    p_never: float


def calibrate(counts: Counts, prompt_ids: tuple[str, ...], policy_names: tuple[str, ...], cfg: CalibrationConfig,
              *, steps: int, batch_prompts: int, group_size: int) -> Calibration:
    """Counts -> :class:`Calibration` (the floor from the run's budget: :func:`never_floor`)."""
    C = counts.n.shape[1]
    if len(prompt_ids) != C or len(policy_names) != counts.n.shape[0]:
        raise ValueError("calibrate: prompt_ids / policy_names do not match the counts' [P, C] shape")
    p_never = never_floor(cfg.alpha, steps, batch_prompts, C, group_size)
    if p_never >= 0.5:
        raise ValueError(f"calibration: the never-solved floor alpha / D = {p_never:.3g} is not below 0.5 (the run "
                         "samples each prompt too few times for this alpha); lower --alpha")
    p = success_probabilities(counts, p_never)
    return Calibration(scenario_from_probabilities(p, cfg.arms, policy_names), tuple(prompt_ids), counts, p,
                       rescue_set(counts), p_never)
