"""The bandit algorithm written naively: Python loops per regime, seed, policy and prompt, numpy inside.

The reference the vectorised engine is measured against (``bandit_throughput.py``), and a cross-check of
it (``tests/bandit/test_naive_reference.py``: one step of both, from the same draws, gives the same
logits). Same algorithm as :mod:`bandit_sim.engine` for the tabular model, SGD and the token-mean loss:
inverse-CDF sampling, the core's ``regime_plan`` per prompt, the core's behaviour correction, and the
gradient of the clipped surrogate + SGT NLL written out per row:

    dL/dz = (1 / N_pg) sum_rows -w c A rho [rho A <= clip(rho) A] (e_a - pi)  +  (lambda / N_sgt) sum_sgt -(e_a - pi)
"""

from __future__ import annotations

import math

import numpy as np

from shared_interfaces.regimes import RegimeSpec, behaviour_correction, regime_plan


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max())
    return e / e.sum()


def naive_step(theta: np.ndarray, specs: list[RegimeSpec], rewards_table: np.ndarray, ctx: np.ndarray,
               u_arm: np.ndarray, u_reward: np.ndarray, xi: np.ndarray, *, lr: float, epochs: int,
               clip_low: float, clip_high: float, thl_sigma: float, thl_bias: float) -> None:
    """One step, in place on ``theta [R, S, P, C, K]`` (float64). Draws as the engine's: ``ctx [S, B]``,
    ``u_arm, u_reward [S, B, P, G]`` (``u_arm`` in (0, 1]), ``xi [S, P, B * P * G]`` (learner, sample)."""
    R, S, P, C, K = theta.shape
    B, G = ctx.shape[1], u_arm.shape[-1]
    for r, spec in enumerate(specs):
        for s in range(S):
            actions = np.zeros((B, P, G), dtype=np.int64)
            rew = np.zeros((B, P, G))
            beh = np.zeros((B, P, G))
            for p in range(P):
                for b in range(B):
                    pi = _softmax(theta[r, s, p, ctx[s, b]])
                    cdf = np.cumsum(pi)
                    x = np.minimum(u_arm[s, b, p] * cdf[-1], np.nextafter(cdf[-1], 0.0))
                    a = np.minimum(np.searchsorted(cdf, x, side="right"), K - 1)
                    actions[b, p] = a
                    rew[b, p] = u_reward[s, b, p] < rewards_table[ctx[s, b], a]
                    beh[b, p] = np.log(pi[a])
            plans = [regime_plan(spec, rew[b], np.ones((P, G), bool), np.ones((P, G), np.int64)) for b in range(B)]
            for i in range(P):
                n_pg = sum(int(pl.pg_mask[i].sum()) for pl in plans)
                n_sgt = sum(int(pl.sgt_targets[i].sum()) for pl in plans)
                old = np.zeros((B, P, G))
                for b in range(B):
                    old[b] = np.log(_softmax(theta[r, s, i, ctx[s, b]]))[actions[b]]
                for _ in range(epochs):
                    grads = np.zeros((B, K))
                    for b in range(B):
                        pl = plans[b]
                        pi = _softmax(theta[r, s, i, ctx[s, b]])
                        for j in range(P):
                            for g in range(G):
                                a = actions[b, j, g]
                                score = -pi.copy()
                                score[a] += 1.0
                                if pl.pg_mask[i, j, g]:
                                    adv = pl.advantages[j, g]
                                    rho = pi[a] / math.exp(old[b, j, g])
                                    coef = 1.0
                                    if j != i and pl.denominator == "thl":
                                        n = (b * P + j) * G + g
                                        mu = beh[b, j, g] + thl_bias + thl_sigma * xi[s, i, n]
                                        coef = float(behaviour_correction(old[b, j, g], mu, pl.ratio_cap))
                                    clipped = min(max(rho, 1 - clip_low), 1 + clip_high) * adv < rho * adv
                                    if not clipped:
                                        grads[b] -= pl.sample_weight[i, j, g] * coef * adv * rho * score / max(n_pg, 1)
                                if pl.sgt_targets[i, j, g]:  # batch: a mean over the step's targets; prompt: over b's
                                    per = n_sgt if spec.sgt.normalize == "batch" else int(pl.sgt_targets[i].sum())
                                    grads[b] -= pl.sgt_weight * score / max(per, 1)
                    for b in range(B):
                        theta[r, s, i, ctx[s, b]] -= lr * grads[b]


def naive_metrics(theta: np.ndarray, init_logits: np.ndarray, rewards_table: np.ndarray) -> np.ndarray:
    """Accuracy, KL to init and entropy per ``[R, S, P]``, one context at a time."""
    R, S, P, C, K = theta.shape
    out = np.zeros((3, R, S, P))
    for r in range(R):
        for s in range(S):
            for p in range(P):
                for c in range(C):
                    pi, p0 = _softmax(theta[r, s, p, c]), _softmax(init_logits[p, c])
                    out[0, r, s, p] += pi @ rewards_table[c] / C
                    out[1, r, s, p] += pi @ (np.log(pi) - np.log(p0)) / C
                    out[2, r, s, p] -= pi @ np.log(pi) / C
    return out
