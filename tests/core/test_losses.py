"""The torch loss shared by both backends: hand-computed values and properties."""

from __future__ import annotations

import math

import pytest
import torch

from shared_interfaces.losses import (
    agg_loss,
    entropy_from_logits,
    kl_k3,
    policy_gradient_loss,
    regime_loss,
    sgt_nll_loss,
    token_logprobs,
)
from shared_interfaces.regimes import LossConfig


def test_agg_modes_hand_computed():
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    assert agg_loss(loss, mask, "token-mean").item() == pytest.approx(10 / 4)
    assert agg_loss(loss, mask, "seq-mean-token-mean").item() == pytest.approx((2 + 4) / 2)
    assert agg_loss(loss, mask, "seq-mean-token-sum-norm", max_len=5).item() == pytest.approx(10 / (2 * 5))
    with pytest.raises(ValueError, match="unknown loss aggregation"):
        agg_loss(loss, mask, "sum")
    # leading dims are kept
    assert agg_loss(loss.expand(3, 2, 3), mask.expand(3, 2, 3), "token-mean").shape == (3,)


def test_pg_loss_at_snapshot_is_minus_mean_advantage_and_gradient_is_score():
    logp = torch.log(torch.tensor([[0.5], [0.25]])).requires_grad_()
    adv = torch.tensor([1.0, -2.0])
    mask = torch.ones(2, 1)
    loss, clip = policy_gradient_loss(logp, logp.detach(), adv, mask, LossConfig())
    assert loss.item() == pytest.approx(-(1.0 - 2.0) / 2)
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[-0.5], [1.0]]))
    assert clip.item() == 0.0


def test_pg_loss_clipping_separate_low_high():
    cfg = LossConfig(clip_low=0.2, clip_high=0.28)
    old = torch.zeros(4, 1)
    logp = torch.log(torch.tensor([[1.5], [1.5], [0.5], [0.5]]))
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0])
    loss, clip = policy_gradient_loss(logp, old, adv, torch.ones(4, 1), cfg)
    # per token -min(r A, clip(r) A): [-1.28, 1.5, -0.5, 0.8]
    assert loss.item() == pytest.approx((-1.28 + 1.5 - 0.5 + 0.8) / 4)
    assert clip.item() == pytest.approx(0.5)


def test_behaviour_coef_and_sample_weight_scale_rows():
    logp = torch.zeros(2, 1)
    adv = torch.tensor([1.0, 1.0])
    loss, _ = policy_gradient_loss(logp, logp, adv, torch.ones(2, 1), LossConfig(),
                                   behaviour_coef=torch.tensor([[1.0], [0.5]]),
                                   sample_weight=torch.tensor([1.0, 0.5]))
    assert loss.item() == pytest.approx(-(1.0 + 0.25) / 2)


def test_kl_k3_and_entropy():
    logp = torch.log(torch.tensor([0.5, 0.2]))
    ref = torch.log(torch.tensor([0.25, 0.2]))
    q = math.log(0.25 / 0.5)
    torch.testing.assert_close(kl_k3(logp, ref), torch.tensor([math.exp(q) - q - 1, 0.0]))
    assert (kl_k3(torch.randn(100), torch.randn(100)) >= 0).all()
    logits = torch.zeros(3, 4)
    torch.testing.assert_close(entropy_from_logits(logits), torch.full((3,), math.log(4)))


def test_sgt_nll_and_regime_loss_composition():
    logp = torch.log(torch.tensor([[0.5, 0.25], [0.1, 0.1]]))
    sgt_mask = torch.tensor([[1, 1], [0, 0]])
    assert sgt_nll_loss(logp, sgt_mask, 2.0).item() == pytest.approx(-2.0 * (math.log(0.5) + math.log(0.25)) / 2)
    assert sgt_nll_loss(logp, torch.zeros(2, 2), 2.0).item() == 0.0
    pg_mask = torch.tensor([[0, 0], [1, 1]])
    out = regime_loss(logp, logp, torch.tensor([0.0, 1.0]), pg_mask, LossConfig(kl_coef=0.5),
                      sgt_mask=sgt_mask, sgt_weight=2.0, ref_logp=logp)
    assert out.pg_loss.item() == pytest.approx(-1.0)
    assert out.loss.item() == pytest.approx(-1.0 + out.sgt_loss.item())
    assert out.kl.item() == 0.0


def test_token_logprobs_is_log_softmax_over_full_vocab_with_temperature():
    logits = torch.tensor([[2.0, 1.0, 0.0]])
    ids = torch.tensor([1])
    got = token_logprobs(logits, ids, temperature=0.5)
    want = torch.log_softmax(logits / 0.5, -1)[0, 1]
    torch.testing.assert_close(got, want.unsqueeze(0))


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_micro_batches_with_global_norm_sum_to_full_batch_loss_and_gradient(agg):
    """Gradient accumulation: with LossNorm of the whole batch, micro-batch losses sum to the full loss."""
    from shared_interfaces.losses import LossNorm

    g = torch.Generator().manual_seed(0)
    N, T = 6, 5
    logits = torch.randn(N, T, generator=g, dtype=torch.float64)
    old = torch.log_softmax(torch.randn(N, T, 3, generator=g, dtype=torch.float64), -1)[..., 0]
    ref = old - 0.1
    adv = torch.randn(N, generator=g, dtype=torch.float64)
    mask = torch.rand(N, T, generator=g) > 0.3
    mask[:, 0] = True
    sgt = torch.zeros(N, T, dtype=torch.bool)
    sgt[4:] = mask[4:]
    pg = mask.clone()
    pg[5] = False  # an SGT-only row
    cfg = LossConfig(clip_low=0.2, clip_high=0.28, agg=agg, kl_coef=0.01, max_response_len=T)

    def loss_of(sl, norm):
        lp = torch.nn.functional.logsigmoid(theta[sl])
        return regime_loss(lp, old[sl], adv[sl], pg[sl], cfg, sgt_mask=sgt[sl], sgt_weight=0.5,
                           ref_logp=ref[sl], norm=norm).loss

    theta = logits.clone().requires_grad_()
    full = loss_of(slice(None), None)
    (g_full,) = torch.autograd.grad(full, theta)
    norm = LossNorm.of(pg, sgt)
    parts = [loss_of(slice(0, 2), norm), loss_of(slice(2, 5), norm), loss_of(slice(5, 6), norm)]
    total = sum(parts)
    (g_parts,) = torch.autograd.grad(total, theta)
    torch.testing.assert_close(total, full)
    torch.testing.assert_close(g_parts, g_full)


def test_peer_behaviour_coef_is_one_off_thl_rows_and_capped_on_them():
    from shared_interfaces.losses import peer_behaviour_coef

    old = torch.log(torch.tensor([[0.5, 0.5], [0.5, 0.5], [0.5, 0.5]]))
    mu = torch.log(torch.tensor([[0.1, 0.1], [0.25, 1.0], [1.0, 1.0]]))
    use = torch.tensor([False, True, True])
    c = peer_behaviour_coef(old, mu, use, cap=3.0)
    torch.testing.assert_close(c, torch.tensor([[1.0, 1.0], [2.0, 0.5], [0.5, 0.5]]))
