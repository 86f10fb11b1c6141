"""The public ``regime_loss`` (its equations) and its fast twin ``regime_loss_fast`` (each divisor once, the
clipped surrogate's min as a select) both equal the loss written out term by term (``torch.minimum``),
bit for bit — values, diagnostics and gradients, at the snapshot (ties) too; and equal each other with
the own-row KL and SGT's per-prompt scale."""

from __future__ import annotations

import pytest
import torch

from shared_interfaces.losses import LossNorm, kl_k3, regime_loss, sgt_row_scale
from shared_interfaces.losses_fast import regime_loss_fast
from shared_interfaces.regimes import LossConfig


def _masked_mean(x, mask):
    return (x * mask).sum(dim=(-2, -1)) / mask.sum(dim=(-2, -1)).clamp(min=1)


def _agg(loss_mat, mask, mode, max_len, norm):
    mask = mask.to(loss_mat.dtype)
    row_tokens = mask.sum(dim=-1)
    if norm is None:
        tokens = mask.sum(dim=(-2, -1)).clamp(min=1)
        rows = (row_tokens > 0).to(loss_mat.dtype).sum(dim=-1).clamp(min=1)
    else:
        tokens = torch.as_tensor(max(norm.pg_tokens, 1.0), dtype=loss_mat.dtype)
        rows = torch.as_tensor(max(norm.pg_rows, 1.0), dtype=loss_mat.dtype)
    if mode == "token-mean":
        return (loss_mat * mask).sum(dim=(-2, -1)) / tokens
    if mode == "seq-mean-token-mean":
        return ((loss_mat * mask).sum(dim=-1) / row_tokens.clamp(min=1)).sum(dim=-1) / rows
    return (loss_mat * mask).sum(dim=(-2, -1)) / (rows * max_len)


def _reference(logp, old, adv, pg, cfg, coef, weight, sgt, lam, ref, norm):
    mask_f = pg.to(logp.dtype)
    ratio = torch.exp(logp - old)
    a = adv.unsqueeze(-1)
    surr1, surr2 = ratio * a, ratio.clamp(1.0 - cfg.clip_low, 1.0 + cfg.clip_high) * a
    per_token = -torch.minimum(surr1, surr2) * coef * weight.unsqueeze(-1)
    pg_loss = _agg(per_token, mask_f, cfg.agg, cfg.dr_grpo_len, norm)
    clip = _masked_mean((surr2 < surr1).to(logp.dtype), mask_f)
    s = sgt.to(logp.dtype)
    if norm is None:
        sgt_loss = -lam * _masked_mean(logp, s)
    else:
        sgt_loss = -lam * (logp * s).sum(dim=(-2, -1)) / max(norm.sgt_tokens, 1.0)
    kl = _agg(kl_k3(logp, ref), mask_f, cfg.agg, cfg.dr_grpo_len, norm)
    return pg_loss + sgt_loss + cfg.kl_coef * kl, clip, _masked_mean(old - logp, mask_f), kl


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
@pytest.mark.parametrize("with_norm", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("at_snapshot", [False, True])  # rho = 1: every unclipped row is a tie of the min
@pytest.mark.parametrize("fn", [regime_loss, regime_loss_fast], ids=["plain", "fast"])
def test_regime_loss_equals_the_term_by_term_loss(agg, with_norm, dtype, at_snapshot, fn):
    g = torch.Generator().manual_seed(7)
    shape = (3, 2, 40, 4)  # [S, P, N, T]
    x = torch.randn(shape, generator=g, dtype=dtype) - 1.0
    old = x + 0.3 * torch.randn(shape, generator=g, dtype=dtype)
    if at_snapshot:
        old = x.clone()
        old[..., :3, :] += 0.5  # and a few clipped rows
    ref = x - 0.2 * torch.rand(shape, generator=g, dtype=dtype)
    adv = torch.randn(shape[:-1], generator=g, dtype=dtype)
    pg = torch.rand(shape, generator=g) < 0.8
    pg[0, 0] = False  # a learner without policy-gradient tokens
    sgt = torch.rand(shape, generator=g) < 0.1
    coef = torch.rand(shape, generator=g, dtype=dtype) * 2
    weight = torch.rand(shape[:-1], generator=g, dtype=dtype)
    cfg = LossConfig(clip_low=0.2, clip_high=0.28, agg=agg, kl_coef=0.05, max_response_len=4)
    norm = LossNorm.of(pg, sgt) if with_norm else None

    a = x.clone().requires_grad_(True)
    out = fn(a, old, adv, pg, cfg, behaviour_coef=coef, sample_weight=weight, sgt_mask=sgt,
             sgt_weight=0.7, ref_logp=ref, norm=norm)
    out.loss.sum().backward()
    b = x.clone().requires_grad_(True)
    loss, clip, approx, kl = _reference(b, old, adv, pg, cfg, coef, weight, sgt, 0.7, ref, norm)
    loss.sum().backward()
    assert torch.equal(out.loss.detach(), loss.detach())
    assert torch.equal(out.clip_fraction, clip.detach())
    assert torch.equal(out.approx_kl_old, approx.detach())
    assert torch.equal(out.kl, kl.detach())
    assert torch.equal(a.grad, b.grad)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
@pytest.mark.parametrize("with_norm", [False, True])
def test_fast_equals_plain_with_own_rows_and_prompt_scale(agg, with_norm):
    g = torch.Generator().manual_seed(11)
    shape = (2, 2, 24, 3)
    x = torch.randn(shape, generator=g, dtype=torch.float32) - 1.0
    old = x + 0.2 * torch.randn(shape, generator=g)
    ref = x - 0.2 * torch.rand(shape, generator=g)
    adv = torch.randn(shape[:-1], generator=g)
    pg = torch.rand(shape, generator=g) < 0.8
    sgt = torch.rand(shape, generator=g) < 0.2
    own = torch.rand(shape[:-1], generator=g) < 0.5
    scale = sgt_row_scale(sgt.any(-1), sgt.sum(-1), torch.arange(24) // 6)
    cfg = LossConfig(agg=agg, kl_coef=0.05, max_response_len=3)
    norm = LossNorm.of(pg, sgt, own) if with_norm else None
    outs, grads = [], []
    for fn in (regime_loss, regime_loss_fast):
        a = x.clone().requires_grad_(True)
        out = fn(a, old, adv, pg, cfg, sgt_mask=sgt, sgt_weight=0.7, sgt_scale=scale, ref_logp=ref, own_mask=own,
                 norm=norm)
        out.loss.sum().backward()
        outs.append(out)
        grads.append(a.grad)
    for f in ("loss", "pg_loss", "sgt_loss", "kl", "clip_fraction", "approx_kl_old"):
        assert torch.equal(getattr(outs[0], f).detach(), getattr(outs[1], f).detach()), f
    assert torch.equal(grads[0], grads[1])


@pytest.mark.parametrize("old", [float("-inf"), -801.0])
def test_fast_and_plain_agree_on_an_overflowed_ratio(old):
    """rho = exp(logp - old) overflows to inf; times A = 0 that is NaN in surr1. torch.minimum passes the NaN
    on, and the select must too (it chose surr2 = 0: a finite fast loss where the plain one is NaN, which the
    LLM's non-finite-step guard keys on)."""
    logp = torch.tensor([[-1.0]], dtype=torch.float64)
    for fn in (regime_loss, regime_loss_fast):
        out = fn(logp, torch.tensor([[old]], dtype=torch.float64), torch.zeros(1), torch.ones(1, 1, dtype=torch.bool),
                 LossConfig())
        assert out.loss.isnan(), fn.__name__
