"""A step's rollouts -> each learner's training batch, through the regime core.

The engine samples rollouts laid out ``[..., B, P, G]`` (B prompts, P policies in scenario order, G
samples each); sample ``(b, j, g)`` has the flat index ``n = (b * P + j) * G + g``. :func:`plan_batch`
hands them to :func:`shared_interfaces.regimes.math.regime_plan` once (vectorised over every leading
dim: seeds, prompts) and lays the plan out as learner rows: learner i's rows are its own samples
``(b, i, g)`` for every b and g, then the peers' samples ``(b, j != i, g)`` — the latter only when some
learner trains on one (a PRP policy-gradient row or an SGT target), so GRPO and XGRPO batches carry
half the rows. Each row has the advantage, policy-gradient mask, sample weight and SGT target flag the
core decided for it. :func:`behaviour_coef` turns log-probs into the core's behaviour correction for
those rows. ``bandit_sim.contract`` feeds raw records through these same two functions.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch

from shared_interfaces.losses import peer_behaviour_coef
from shared_interfaces.regimes import RegimeSpec
from shared_interfaces.regimes.fast import regime_plan_fast


@dataclass(frozen=True)
class LearnerBatch:
    """Rows of every learner's batch, ``[..., P_learner, N]`` (``N = B * G`` own rows, plus ``B * (P - 1) * G``
    peer rows when any learner uses one).

    ``src [P, N]``: each row's sample index ``n = (b * P + j) * G + g``; ``is_peer [P, N]``;
    ``advantages`` (0 off ``pg_mask``), ``pg_mask``, ``sample_weight``, ``sgt_mask`` (the row is an SGT
    target), ``use_mu`` (the row's behaviour correction uses the peer's recorded trace: PRP peer rows
    under the ``thl`` denominator) and ``gate [..., P, B]`` (SGT gate per prompt).
    """

    src: torch.Tensor
    is_peer: torch.Tensor
    advantages: torch.Tensor
    pg_mask: torch.Tensor
    sample_weight: torch.Tensor
    sgt_mask: torch.Tensor
    use_mu: torch.Tensor
    gate: torch.Tensor
    sgt_weight: float
    ratio_cap: float
    denominator: str | None
    sgt_normalize: str = "batch"


@lru_cache(maxsize=32)
def row_layout(B: int, P: int, G: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each learner i, its rows own-first: ``plan_idx [P, B*P*G]`` (flat index into the plan's
    ``[B, i, j, g]``), ``src [P, B*P*G]`` (flat sample index ``(b, j, g)``) and ``is_peer``."""
    b, j, g = np.meshgrid(np.arange(B), np.arange(P), np.arange(G), indexing="ij")  # [B, P, G]
    plan_idx, src, peer = [], [], []
    for i in range(P):
        order = np.argsort(j.ravel() != i, kind="stable")  # own samples first, then peers, (b, j, g) order
        bb, jj, gg = b.ravel()[order], j.ravel()[order], g.ravel()[order]
        plan_idx.append(((bb * P + i) * P + jj) * G + gg)
        src.append((bb * P + jj) * G + gg)
        peer.append(jj != i)
    return np.stack(plan_idx), np.stack(src), np.stack(peer)


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
    :func:`regime_plan`, as its fast variant :func:`~shared_interfaces.regimes.fast.regime_plan_fast`) and
    lay the decisions out as learner rows (see :class:`LearnerBatch`).

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
    lead = r.shape[:-3]
    plan_idx, src, is_peer = row_layout(B, P, G)
    flat = lambda x: x.reshape(lead + (-1,))  # noqa: E731 - [..., B, i, j, g] -> [..., B*i*j*g]
    pg_all, sgt_all = flat(plan.pg_mask), flat(plan.sgt_targets)
    take = lambda x, idx: np.take(x, idx, axis=-1)  # noqa: E731 - (much faster than fancy indexing)
    peers_used = take(pg_all | sgt_all, plan_idx[is_peer]).any()
    n = plan_idx.shape[1] if peers_used else B * G
    plan_idx, src, is_peer = plan_idx[:, :n], src[:, :n], is_peer[:, :n]
    pg_mask = take(pg_all, plan_idx)
    use_mu = pg_mask & is_peer if plan.denominator == "thl" else np.zeros_like(pg_mask)
    adv = take(plan.advantages.reshape(lead + (-1,)), src)  # each row's sample's advantage
    return LearnerBatch(
        src=torch.from_numpy(src),
        is_peer=torch.from_numpy(is_peer),
        advantages=torch.from_numpy(np.where(pg_mask, adv, 0.0).astype(dtype)),
        pg_mask=torch.from_numpy(pg_mask),
        sample_weight=torch.from_numpy(take(flat(plan.sample_weight), plan_idx).astype(dtype)),
        sgt_mask=torch.from_numpy(take(sgt_all, plan_idx)),
        use_mu=torch.from_numpy(use_mu),
        gate=torch.from_numpy(np.swapaxes(plan.sgt_gate, -1, -2).copy()),
        sgt_weight=plan.sgt_weight,
        ratio_cap=plan.ratio_cap,
        denominator=plan.denominator,
        sgt_normalize=plan.sgt_normalize,
    )


def behaviour_coef(batch: LearnerBatch, old_logp: torch.Tensor, mu_logp: torch.Tensor) -> torch.Tensor:
    """Per-row behaviour correction ``[..., P, N]`` (detached): the core's ``min(pi_old / mu, cap)`` on
    ``use_mu`` rows, exactly 1 on the others (own rows; PRP snapshot rows, whose ``mu`` is ``pi_old``)."""
    coef = peer_behaviour_coef(old_logp.unsqueeze(-1), mu_logp.unsqueeze(-1), batch.use_mu, batch.ratio_cap)
    return coef.squeeze(-1)
