"""Metrics of the simulator: per (regime, seed, policy) at a step, then means and 95 % intervals over seeds.

Policy metrics of ``pi = softmax(z)`` over all contexts (:func:`policy_metrics`):

* ``accuracy`` = ``mean_c sum_a pi(a|c) rewards[c, a]`` (the expected verified reward);
* ``rescue_accuracy`` = the same mean over the policy's rescue set (NaN when it is empty);
* ``support`` = share of solvable contexts with ``pi(correct|c) > support_eps``;
* ``kl_to_init`` = ``mean_c KL(pi_t(.|c) || pi_0(.|c))``, and ``kl_outside_rescue`` the same mean over the
  contexts outside the policy's rescue set (rescuing a context from pi_0(correct) = 1e-17 alone costs
  about 40 nats there); ``entropy`` = ``mean_c H(pi_t(.|c))``.

Step diagnostics (:func:`masked_var` for PRP's density ratios; gradient norms, clip fractions and SGT
activations come from the engine). :func:`seed_summary` reduces ``[..., S, ...]`` to mean, 95 % half
width (Student t) and variance over seeds.
"""

from __future__ import annotations

import math

import numpy as np
import torch

POLICY_METRICS = ("accuracy", "rescue_accuracy", "support", "kl_to_init", "kl_outside_rescue", "entropy")
STEP_METRICS = (
    "grad_norm",
    "clip_fraction",
    "ratio_variance",
    "true_ratio_variance",
    "sgt_activations",
    "sgt_activations_total",
)
ALL_METRICS = POLICY_METRICS + STEP_METRICS


def policy_metrics(
    logits: torch.Tensor,
    init_logp: torch.Tensor,
    rewards: torch.Tensor,
    correct: torch.Tensor,
    rescue: torch.Tensor,
    support_eps: float,
) -> dict[str, torch.Tensor]:
    """``logits [..., P, C, K]``, ``init_logp [P, C, K]``, ``rewards/correct [C, K]``, ``rescue [P, C]``
    -> each metric ``[..., P]`` (float64). Written as four inner products over arms (one pass each)."""
    lead = logits.shape[:-3]
    logp = torch.log_softmax(logits.reshape((-1,) + tuple(logits.shape[-3:])), dim=-1)  # [M, P, C, K]
    p = logp.exp()
    exp_reward = (p * rewards).sum(-1)  # [M, P, C]  (flat leading dims: torch broadcasts these fast)
    pc = (p * correct.to(p.dtype)).sum(-1)
    neg_ent = torch.linalg.vecdot(p, logp)
    cross = (p * init_logp).sum(-1)
    acc = exp_reward.mean(-1)
    rmask = rescue.to(exp_reward.dtype)
    n_rescue = rmask.sum(-1)
    rescue_acc = (exp_reward * rmask).sum(-1) / n_rescue.clamp(min=1)
    rescue_acc = torch.where(n_rescue > 0, rescue_acc, torch.full_like(rescue_acc, math.nan))
    solvable = correct.any(-1).to(exp_reward.dtype)  # [C]
    support = ((pc > support_eps).to(exp_reward.dtype) * solvable).sum(-1) / solvable.sum().clamp(min=1)
    kl_c = neg_ent - cross  # [M, P, C]
    kl = kl_c.mean(-1)
    outside = 1.0 - rmask
    kl_out = (kl_c * outside).sum(-1) / outside.sum(-1).clamp(min=1)
    ent = -neg_ent.mean(-1)
    out = {"accuracy": acc, "rescue_accuracy": rescue_acc, "support": support, "kl_to_init": kl,
           "kl_outside_rescue": kl_out, "entropy": ent}
    return {k: v.double().reshape(lead + v.shape[-1:]) for k, v in out.items()}


def masked_var(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Unbiased variance of ``x`` over ``mask`` along the last axis; NaN with fewer than two entries."""
    m = mask.to(x.dtype)
    n = m.sum(-1)
    mean = (x * m).sum(-1) / n.clamp(min=1)
    var = (((x - mean.unsqueeze(-1)) * m) ** 2).sum(-1) / (n - 1).clamp(min=1)
    return torch.where(n > 1, var, torch.full_like(var, math.nan))


_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262,
         10: 2.228, 12: 2.179, 15: 2.131, 20: 2.086, 25: 2.060, 30: 2.042, 40: 2.021, 60: 2.000, 120: 1.980}


def t975(dof: int) -> float:
    """The 97.5 % quantile of Student's t with ``dof`` degrees of freedom (table, then the normal 1.96)."""
    if dof < 1:
        return math.nan
    if dof > max(_T975):
        return 1.96
    return _T975[max(k for k in _T975 if k <= dof)]  # the nearest tabulated dof below: conservative


def seed_summary(x: np.ndarray, axis: int) -> dict[str, np.ndarray]:
    """Mean, 95 % half width (``t * sd / sqrt(n)``) and variance over seeds (``axis``), ignoring NaN
    entries; all-NaN slices give NaN."""
    x = np.asarray(x, dtype=np.float64)
    valid = ~np.isnan(x)
    n = valid.sum(axis=axis)
    safe = np.where(valid, x, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = safe.sum(axis=axis) / n
        dev = np.where(valid, x - np.expand_dims(mean, axis), 0.0)
        var = (dev**2).sum(axis=axis) / (n - 1)
        var = np.where(n > 1, var, np.where(n == 1, 0.0, np.nan))
        tq = np.vectorize(lambda k: t975(int(k - 1)) if k > 1 else math.nan, otypes=[float])(n)
        half = tq * np.sqrt(var / np.maximum(n, 1))
    mean = np.where(n > 0, mean, np.nan)
    return {"mean": mean, "ci95": half, "var": var}
