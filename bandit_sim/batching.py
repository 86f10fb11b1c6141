"""A step's rollouts -> each learner's training batch, through the regime core.

The engine samples rollouts laid out ``[..., B, P, G]`` (B prompts, P policies in scenario order, G
samples each). :func:`plan_batch` hands them to :func:`shared_interfaces.regimes.math.regime_plan` once
(vectorised over every leading dim: seeds, prompts) and lays the plan out as rows: learner i's batch is
``N = B * P * G`` rows ordered ``(b, j, g)`` — sample g of policy j on prompt b — with the advantage,
policy-gradient mask, sample weight and SGT target flag the core decided for it. :func:`behaviour_coef`
turns log-probs into the core's behaviour correction for those rows. ``bandit_sim.contract`` feeds raw
records through these same two functions.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from shared_interfaces.losses import peer_behaviour_coef
from shared_interfaces.regimes import RegimeSpec, regime_plan


@dataclass(frozen=True)
class LearnerBatch:
    """Rows of every learner's batch, ``[..., P_learner, N]`` with ``N = B * P * G`` in ``(b, j, g)`` order.

    ``advantages`` (float64, 0 off ``pg_mask``), ``pg_mask``, ``sample_weight``, ``sgt_mask`` (the row is
    an SGT target), ``use_mu`` (the row's behaviour correction uses the peer's recorded trace: PRP peer
    rows under the ``thl`` denominator), ``is_peer [P, N]`` and ``gate [..., P, B]`` (SGT gate per prompt).
    """

    advantages: torch.Tensor
    pg_mask: torch.Tensor
    sample_weight: torch.Tensor
    sgt_mask: torch.Tensor
    use_mu: torch.Tensor
    is_peer: torch.Tensor
    gate: torch.Tensor
    sgt_weight: float
    ratio_cap: float
    denominator: str | None


def _rows(x: np.ndarray, dtype=None) -> np.ndarray:
    """``[..., B, i, j, g] -> [..., i, B * j * g]`` (one copy, cast to ``dtype`` on the way)."""
    nd = x.ndim
    lead = list(range(nd - 4))
    y = np.transpose(x, lead + [nd - 3, nd - 4, nd - 2, nd - 1])
    return np.ascontiguousarray(y, dtype=dtype).reshape(y.shape[:-3] + (-1,))


def plan_batch(
    spec: RegimeSpec,
    rewards: np.ndarray,
    *,
    verified: np.ndarray | None = None,
    lengths: np.ndarray | None = None,
    mask: np.ndarray | None = None,
    rng: np.random.Generator | None = None,
    dtype: np.dtype | type = np.float64,
) -> LearnerBatch:
    """Apply regime ``spec`` to rollouts ``rewards [..., B, P, G]`` (one call of the core's
    :func:`regime_plan`) and lay the decisions out as learner rows (see :class:`LearnerBatch`).

    In the bandit every reward comes from the scenario's verifier (``verified`` all True) and every
    response is one token (``lengths`` all 1); the contract passes the records' own values.
    Advantages and weights are cast to ``dtype`` (the engine's float32; the contract keeps float64).
    """
    r = np.asarray(rewards, dtype=np.float64)
    if r.ndim < 3:
        raise ValueError(f"rollout rewards must be laid out [..., B, P, G], got shape {r.shape}")
    verified = np.ones(r.shape, dtype=bool) if verified is None else verified
    lengths = np.ones(r.shape, dtype=np.int64) if lengths is None else lengths
    plan = regime_plan(spec, r, verified, lengths, mask, rng=rng)
    P, G = r.shape[-2:]
    eye = np.eye(P, dtype=bool)[:, :, None]
    is_peer = np.broadcast_to(~eye, (P, P, G)).reshape(P, 1, P * G)
    B = r.shape[-3]
    is_peer = np.broadcast_to(is_peer, (P, B, P * G)).reshape(P, B * P * G).copy()
    adv = _rows(plan.learner_advantages(), dtype)
    pg_mask = _rows(plan.pg_mask)
    use_mu = pg_mask & is_peer if plan.denominator == "thl" else np.zeros_like(pg_mask)
    return LearnerBatch(
        advantages=torch.from_numpy(adv),
        pg_mask=torch.from_numpy(pg_mask),
        sample_weight=torch.from_numpy(_rows(plan.sample_weight, dtype)),
        sgt_mask=torch.from_numpy(_rows(plan.sgt_targets)),
        use_mu=torch.from_numpy(use_mu),
        is_peer=torch.from_numpy(is_peer),
        gate=torch.from_numpy(np.swapaxes(plan.sgt_gate, -1, -2).copy()),
        sgt_weight=plan.sgt_weight,
        ratio_cap=plan.ratio_cap,
        denominator=plan.denominator,
    )


def behaviour_coef(batch: LearnerBatch, old_logp: torch.Tensor, mu_logp: torch.Tensor) -> torch.Tensor:
    """Per-row behaviour correction ``[..., P, N]`` (detached): the core's ``min(pi_old / mu, cap)`` on
    ``use_mu`` rows, exactly 1 on the others (own rows; PRP snapshot rows, whose ``mu`` is ``pi_old``)."""
    coef = peer_behaviour_coef(old_logp.unsqueeze(-1), mu_logp.unsqueeze(-1), batch.use_mu, batch.ratio_cap)
    return coef.squeeze(-1)
