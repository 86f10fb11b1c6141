"""A step's rollouts -> every learner's rows, through the regime core.

The engine samples rollouts laid out ``[..., B, P, G]`` (B prompts, P policies in scenario order, G
samples each); sample ``(b, j, g)`` has the flat index ``n = (b * P + j) * G + g``. :func:`plan_batch`
hands them to :func:`shared_interfaces.regimes.math.regime_plan` once (vectorised over every leading
dim: seeds, prompts) and takes the core's :class:`~shared_interfaces.regimes.rows.LearnerRows` of every
learner ``[..., P, N]`` in the bandit's row order (:func:`row_layout`): learner i's own samples
``(b, i, g)`` for every b and g, then the peers' samples ``(b, j != i, g)`` — the latter only when some
learner trains on one (a PRP policy-gradient row or an SGT target), so GRPO and XGRPO batches carry
half the rows. :func:`behaviour_coef` turns log-probs into the core's behaviour correction for those
rows. ``bandit_sim.contract`` feeds raw records through these same two functions.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch

from shared_interfaces.regimes import RegimeSpec
from shared_interfaces.regimes.fast import regime_plan_fast
from shared_interfaces.regimes.rows import LearnerRows, learner_rows


@lru_cache(maxsize=32)
def row_layout(B: int, P: int, G: int) -> np.ndarray:
    """For each learner i, its rows own-first: ``src [P, B*P*G]``, the flat sample index ``(b, j, g)`` of
    its own samples, then of its peers' samples, each in ``(b, j, g)`` order."""
    j = np.arange(B * P * G) // G % P
    return np.stack([np.argsort(j != i, kind="stable") for i in range(P)])


def plan_batch(
    spec: RegimeSpec,
    rewards: np.ndarray,
    *,
    verified: np.ndarray | None = None,
    lengths: np.ndarray | None = None,
    mask: np.ndarray | None = None,
    rng: np.random.Generator | None = None,
    dtype: np.dtype | type = np.float64,
) -> LearnerRows:
    """Apply regime ``spec`` to rollouts ``rewards [..., B, P, G]`` (one call of the core's
    :func:`regime_plan`, as its fast variant :func:`~shared_interfaces.regimes.fast.regime_plan_fast`) and
    take every learner's rows ``[..., P, N]`` in :func:`row_layout`'s order (module docstring).

    In the bandit every reward comes from the scenario's verifier (``verified`` all True) and every
    response is one token (``lengths`` all 1); the contract passes the records' own values.
    Advantages and weights are cast to ``dtype`` (the engine's float32; the contract keeps float64).
    """
    r = np.asarray(rewards, dtype=np.float64)
    if r.ndim < 3:
        raise ValueError(f"rollout rewards must be laid out [..., B, P, G], got shape {r.shape}")
    verified = np.ones(r.shape, dtype=bool) if verified is None else verified
    lengths = np.ones(r.shape, dtype=np.int64) if lengths is None else lengths
    plan = regime_plan_fast(spec, r, verified, lengths, mask, rng=rng)
    B, P, G = r.shape[-3:]
    src = row_layout(B, P, G)
    peer = ~np.eye(P, dtype=bool)[:, :, None]  # [i, j, 1]
    peers_used = ((plan.pg_mask | plan.sgt_targets) & peer).any()
    return learner_rows(plan, src if peers_used else src[:, : B * G], dtype=dtype)


def behaviour_coef(rows: LearnerRows, old_logp: torch.Tensor, mu_logp: torch.Tensor) -> torch.Tensor:
    """Per-row behaviour correction ``[..., P, N]`` of one-token rows (detached): the core's
    :meth:`~shared_interfaces.regimes.rows.LearnerRows.behaviour_coef` (``min(pi_old / mu, cap)`` on
    ``use_mu`` rows, exactly 1 on the others: own rows; PRP snapshot rows, whose ``mu`` is ``pi_old``)."""
    return rows.behaviour_coef(old_logp.unsqueeze(-1), mu_logp.unsqueeze(-1)).squeeze(-1)
