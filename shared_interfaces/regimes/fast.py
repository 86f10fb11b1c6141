"""Fast variants of the regime math, for the bandit's per-step plans; equal to the plain functions of
:mod:`shared_interfaces.regimes.math` on every input, bit for bit (``tests/core/test_regime_plan_fast_path.py``,
``tests/core/test_sgt_select_fast_path.py``).

* :func:`group_advantages_fast` — without a mask (every sample real) the mask's no-op ``where`` passes are
  left out and the degenerate test ``max == min`` is done column by column (a max is exact in any order,
  and numpy's last-axis max is slow on short groups);
* :func:`sgt_select_fast` — for ``k = 1`` the first minimum by ``argmin`` (its tie rule is the canonical
  order) instead of a stable sort and ranks;
* :func:`regime_plan_fast` — :func:`~shared_interfaces.regimes.math.regime_plan` with those two.
"""

from __future__ import annotations

import numpy as np

from shared_interfaces.regimes.config import RegimeSpec
from shared_interfaces.regimes.math import (
    RegimePlan,
    group_advantages,
    regime_plan,
    sgt_candidates,
    sgt_select,
)


def group_advantages_fast(
    rewards: np.ndarray, mask: np.ndarray | None = None, *, eps: float = 1e-6, scale_by_std: bool = True
) -> np.ndarray:
    """:func:`~shared_interfaces.regimes.math.group_advantages` (module docstring)."""
    r = np.asarray(rewards, dtype=np.float64)
    if mask is not None or r.ndim < 1 or r.shape[-1] == 0:
        return group_advantages(r, mask, eps=eps, scale_by_std=scale_by_std)
    n = r.shape[-1]
    if n < 2:  # degenerate: a group of one
        return np.zeros(r.shape)
    mean = r.sum(axis=-1, keepdims=True) / n
    dev = r - mean
    var = (dev**2).sum(axis=-1, keepdims=True) / (n - 1)
    if n <= 64:  # columns of a 2-d view: one long strided loop each
        cols = r.reshape(-1, n)
        hi, lo = cols[:, 0], cols[:, 0]
        for g in range(1, n):
            hi, lo = np.maximum(hi, cols[:, g]), np.minimum(lo, cols[:, g])
        spread = (hi != lo).reshape(r.shape[:-1] + (1,))
    else:
        spread = r.max(axis=-1, keepdims=True) != r.min(axis=-1, keepdims=True)
    scale = np.sqrt(var) + eps if scale_by_std else 1.0
    adv = dev / scale
    return np.where(spread, adv, 0.0)


def sgt_select_fast(
    rewards: np.ndarray,
    verified: np.ndarray,
    lengths: np.ndarray,
    mask: np.ndarray | None = None,
    *,
    k: int = 1,
    rule: str = "shortest",
    rng: np.random.Generator | None = None,
) -> np.ndarray:
    """:func:`~shared_interfaces.regimes.math.sgt_select` (module docstring)."""
    if k != 1:
        return sgt_select(rewards, verified, lengths, mask, k=k, rule=rule, rng=rng)
    flat_cand, flat_key, gate, shape = sgt_candidates(rewards, verified, lengths, mask, rule=rule, rng=rng)
    rank0 = np.arange(flat_key.shape[-1]) == np.argmin(flat_key, axis=-1)[..., None]
    return (flat_cand & rank0 & gate[..., None]).reshape(shape)


def regime_plan_fast(
    spec: RegimeSpec,
    rewards: np.ndarray,
    verified: np.ndarray,
    lengths: np.ndarray,
    mask: np.ndarray | None = None,
    *,
    rng: np.random.Generator | None = None,
) -> RegimePlan:
    """:func:`~shared_interfaces.regimes.math.regime_plan` with the fast variants (module docstring)."""
    return regime_plan(spec, rewards, verified, lengths, mask, rng=rng, group_fn=group_advantages_fast,
                       select_fn=sgt_select_fast)
