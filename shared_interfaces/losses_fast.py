"""The fast twin of :func:`shared_interfaces.losses.regime_loss`, for the bandit's hot loop.

The same loss, the same numbers, fewer operations: each divisor is computed once (the token count is shared
by the loss, the clip fraction, the KL and ``approx_kl_old``; row counts only for the modes that divide by
them), and the clipped surrogate's min is a select (``torch.where``) instead of ``torch.minimum``, whose
backward is dearer. At a tie (e.g. the snapshot, rho = 1) the select sends the whole gradient through
``surr1`` where ``torch.minimum`` sends half through each; the halves add up exactly. A NaN (an overflowed
ratio times a zero advantage) goes through as ``torch.minimum`` lets it, so a non-finite loss is seen alike.
Pinned equal to the plain version bit for bit — values, diagnostics and gradients, ties and NaN included — by
``tests/core/test_losses_fast_path.py``. Only the bandit engine calls it; the LLM backend calls the plain one.
"""

from __future__ import annotations

import torch

from shared_interfaces.losses import LossNorm, LossOutput, kl_k3, kl_rows, masked_sum, sgt_nll_loss
from shared_interfaces.regimes.config import LossConfig


def _agg_loss(loss_mat: torch.Tensor, mask: torch.Tensor, mode: str, max_len: int, norm: LossNorm | None,
              tokens: torch.Tensor | None) -> torch.Tensor:
    """:func:`~shared_interfaces.losses.agg_loss` on a float ``mask``; ``tokens``: the mask's count
    ``mask.sum(dim=(-2, -1)).clamp(min=1)`` when the caller has it (ignored with ``norm``)."""
    if norm is None:
        if tokens is None and mode == "token-mean":
            tokens = mask.sum(dim=(-2, -1)).clamp(min=1)
    else:
        tokens = torch.as_tensor(max(norm.pg_tokens, 1.0), dtype=loss_mat.dtype)
    if mode == "token-mean":
        return masked_sum(loss_mat, mask) / tokens
    row_tokens = mask.sum(dim=-1)
    if norm is None:
        rows = (row_tokens > 0).to(loss_mat.dtype).sum(dim=-1).clamp(min=1)
    else:
        rows = torch.as_tensor(max(norm.pg_rows, 1.0), dtype=loss_mat.dtype)
    if mode == "seq-mean-token-mean":
        per_row = (loss_mat * mask).sum(dim=-1) / row_tokens.clamp(min=1)
        return per_row.sum(dim=-1) / rows
    if mode == "seq-mean-token-sum-norm":
        return (loss_mat * mask).sum(dim=(-2, -1)) / (rows * max_len)
    raise ValueError(
        f"unknown loss aggregation {mode!r}; use token-mean, seq-mean-token-mean or seq-mean-token-sum-norm"
    )


def regime_loss_fast(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    pg_mask: torch.Tensor,
    cfg: LossConfig,
    *,
    behaviour_coef: torch.Tensor | None = None,
    sample_weight: torch.Tensor | None = None,
    sgt_mask: torch.Tensor | None = None,
    sgt_weight: float = 0.0,
    sgt_scale: torch.Tensor | None = None,
    ref_logp: torch.Tensor | None = None,
    own_mask: torch.Tensor | None = None,
    norm: LossNorm | None = None,
) -> LossOutput:
    """:func:`shared_interfaces.losses.regime_loss`, the same arguments and results (module docstring)."""
    mask_f = pg_mask.to(logp.dtype)
    adv = advantages.to(logp.dtype).unsqueeze(-1)
    ratio = torch.exp(logp - old_logp)
    surr1 = ratio * adv
    surr2 = ratio.clamp(1.0 - cfg.clip_low, 1.0 + cfg.clip_high) * adv
    per_token = -torch.where(surr2 < surr1, surr2, surr1)  # a NaN surr1 stays NaN, as in torch.minimum
    if behaviour_coef is not None:
        per_token = per_token * behaviour_coef.detach().to(logp.dtype)
    if sample_weight is not None:
        per_token = per_token * sample_weight.to(logp.dtype).unsqueeze(-1)
    clipped = (surr2 < surr1).to(logp.dtype)
    tokens = mask_f.sum(dim=(-2, -1)).clamp(min=1)
    pg_loss = _agg_loss(per_token, mask_f, cfg.agg, cfg.dr_grpo_len, norm, tokens)
    clip_frac = (masked_sum(clipped, mask_f) / tokens).detach()
    zero = torch.zeros_like(pg_loss)
    if sgt_mask is not None and sgt_weight > 0:
        sgt = sgt_nll_loss(logp, sgt_mask, sgt_weight, norm=norm, row_scale=sgt_scale)
    else:
        sgt = zero
    if ref_logp is not None and cfg.kl_coef > 0:
        if own_mask is None:
            kl = _agg_loss(kl_k3(logp, ref_logp), mask_f, cfg.agg, cfg.dr_grpo_len, norm, tokens)
        else:
            kl_mask, kl_norm = kl_rows(mask_f, own_mask, norm)
            kl = _agg_loss(kl_k3(logp, ref_logp), kl_mask, cfg.agg, cfg.dr_grpo_len, kl_norm, None)
    else:
        kl = zero
    approx_kl_old = masked_sum((old_logp - logp).detach(), mask_f) / tokens
    return LossOutput(
        loss=pg_loss + sgt + cfg.kl_coef * kl,
        pg_loss=pg_loss.detach(),
        sgt_loss=sgt.detach(),
        kl=kl.detach(),
        clip_fraction=clip_frac,
        approx_kl_old=approx_kl_old,
    )
