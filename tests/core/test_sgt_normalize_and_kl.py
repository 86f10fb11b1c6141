"""SGT's ``normalize: batch | prompt`` and KL on the learner's own rows only (issue 13, items 17-18)."""

from __future__ import annotations

import pytest
import torch

from shared_interfaces.config_io import ConfigError
from shared_interfaces.losses import LossNorm, kl_k3, regime_loss, sgt_nll_loss, sgt_row_scale
from shared_interfaces.regimes import LossConfig, SGTConfig, parse_regime


def test_sgt_row_scale_hand_computed():
    # rows 0, 1 of prompt 0 (3 + 1 tokens), row 2 of prompt 1 (2 tokens), row 3 not SGT, row 4 SGT but empty
    sgt = torch.tensor([True, True, True, False, True])
    tokens = torch.tensor([3, 1, 2, 7, 0])
    pool = torch.tensor([0, 0, 1, 1, 2])
    scale = sgt_row_scale(sgt, tokens, pool)
    assert scale.tolist() == [0.25, 0.25, 0.5, 0.0, 0.0]
    assert scale.dtype == torch.float64
    # leading dims, with a pool broadcast over them
    both = sgt_row_scale(torch.stack([sgt, ~sgt]), tokens.expand(2, 5), pool)
    assert both[0].tolist() == scale.tolist() and both[1].tolist() == [0.0, 0.0, 0.0, 1 / 7, 0.0]


def test_sgt_row_scale_empty_and_malformed():
    empty = torch.zeros(0, dtype=torch.bool)
    assert sgt_row_scale(empty, torch.zeros(0), torch.zeros(0, dtype=torch.int64)).shape == (0,)
    with pytest.raises(ValueError, match="pool indices must be >= 0"):
        sgt_row_scale(torch.tensor([True]), torch.tensor([1]), torch.tensor([-1]))


def _rescued_batch(K: int):
    """K rescued prompts, each with one SGT target of 2 tokens of log-prob -1 and -3."""
    logp = torch.tensor([[-1.0, -3.0]]).repeat(K, 1)
    mask = torch.ones(K, 2, dtype=torch.bool)
    return logp, mask, torch.arange(K)


@pytest.mark.parametrize("K", [1, 2, 5])
def test_batch_shares_lambda_over_the_step_and_prompt_gives_lambda_per_prompt(K):
    """How each scales with the number K of rescued prompts (the SGTConfig docstring): ``batch`` is a
    mean over all SGT tokens (independent of K), ``prompt`` a sum of per-prompt means (K times it)."""
    logp, mask, pool = _rescued_batch(K)
    lam = 0.5
    batch = sgt_nll_loss(logp, mask, lam)
    prompt = sgt_nll_loss(logp, mask, lam, row_scale=sgt_row_scale(mask.any(-1), mask.sum(-1), pool))
    assert batch.item() == pytest.approx(lam * 2.0)  # -lambda * mean(-1, -3)
    assert prompt.item() == pytest.approx(K * lam * 2.0)


def test_prompt_normalisation_weights_prompts_not_tokens():
    """Prompt 0 has a 1-token target, prompt 1 a 3-token one: under ``prompt`` each prompt's mean counts
    once; under ``batch`` the long target's tokens dominate."""
    logp = torch.tensor([[-4.0, 0.0, 0.0], [-1.0, -1.0, -1.0]])
    mask = torch.tensor([[True, False, False], [True, True, True]])
    scale = sgt_row_scale(mask.any(-1), mask.sum(-1), torch.tensor([0, 1]))
    assert sgt_nll_loss(logp, mask, 1.0, row_scale=scale).item() == pytest.approx(4.0 + 1.0)
    assert sgt_nll_loss(logp, mask, 1.0).item() == pytest.approx(7.0 / 4)
    # one pool holding every row is the batch mean again
    one = sgt_row_scale(mask.any(-1), mask.sum(-1), torch.zeros(2, dtype=torch.int64))
    assert sgt_nll_loss(logp, mask, 1.0, row_scale=one).item() == pytest.approx(7.0 / 4)


def test_prompt_scale_micro_batches_sum_to_the_full_batch():
    """The scale is computed once over the whole batch, so micro-batch SGT losses add up."""
    g = torch.Generator().manual_seed(1)
    logp = -torch.rand(6, 4, generator=g, dtype=torch.float64)
    mask = torch.rand(6, 4, generator=g) > 0.3
    mask[:, 0] = True
    pool = torch.tensor([0, 0, 1, 2, 2, 2])
    scale = sgt_row_scale(mask.any(-1), mask.sum(-1), pool)
    full = sgt_nll_loss(logp, mask, 0.7, row_scale=scale)
    parts = sum(sgt_nll_loss(logp[s], mask[s], 0.7, row_scale=scale[s]) for s in (slice(0, 1), slice(1, 4), slice(4, 6)))
    torch.testing.assert_close(parts, full)


def test_sgt_normalize_config():
    assert SGTConfig().normalize == "batch"  # today's rule stays the default
    spec = parse_regime("sgt", {"sgt": {"normalize": "prompt"}})
    assert spec.sgt.normalize == "prompt" and spec.to_dict()["sgt"]["normalize"] == "prompt"
    with pytest.raises(ConfigError, match="sgt.normalize must be 'batch' or 'prompt'"):
        SGTConfig(normalize="token")


def test_regime_plan_carries_the_normalize_rule():
    import numpy as np

    from shared_interfaces.regimes import regime_plan

    r = np.array([[0.0, 0.0], [1.0, 0.0]])
    plan = regime_plan(parse_regime("sgt", {"sgt": {"normalize": "prompt"}}), r, np.ones((2, 2), bool), np.ones((2, 2), int))
    assert plan.sgt_normalize == "prompt" and plan.sgt_targets[0].any()


# -- KL on own rows (item 18) ----------------------------------------------------------------------

def _kl_case():
    g = torch.Generator().manual_seed(3)
    N, T = 5, 3
    logp = torch.log_softmax(torch.randn(N, T, 4, generator=g, dtype=torch.float64), -1)[..., 0]
    ref = torch.log_softmax(torch.randn(N, T, 4, generator=g, dtype=torch.float64), -1)[..., 0]
    mask = torch.ones(N, T, dtype=torch.bool)
    mask[1, 2] = False
    own = torch.tensor([True, True, False, True, False])  # rows 2 and 4: PRP peer samples
    return logp, ref, mask, own


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_kl_is_aggregated_over_own_rows_only(agg):
    logp, ref, mask, own = _kl_case()
    cfg = LossConfig(agg=agg, kl_coef=0.1, max_response_len=3)
    out = regime_loss(logp, logp.detach(), torch.zeros(5), mask, cfg, ref_logp=ref, own_mask=own)
    k = kl_k3(logp, ref)
    own_tokens = mask & own[:, None]
    if agg == "token-mean":
        want = (k * own_tokens).sum() / own_tokens.sum()
    elif agg == "seq-mean-token-mean":
        want = ((k * own_tokens).sum(-1)[own] / own_tokens.sum(-1)[own]).mean()
    else:
        want = (k * own_tokens).sum() / (own.sum() * 3)
    torch.testing.assert_close(out.kl, want)
    # the peer rows' reference log-probs do not matter
    moved = ref.clone()
    moved[~own] -= 5.0
    again = regime_loss(logp, logp.detach(), torch.zeros(5), mask, cfg, ref_logp=moved, own_mask=own)
    torch.testing.assert_close(again.kl, out.kl)
    # without own_mask every row counts (a caller with no peer rows)
    every = regime_loss(logp, logp.detach(), torch.zeros(5), mask, cfg, ref_logp=moved)
    assert not torch.isclose(every.kl, out.kl)


def test_kl_own_rows_with_micro_batches_sums_to_full():
    logp, ref, mask, own = _kl_case()
    cfg = LossConfig(kl_coef=0.1)
    full = regime_loss(logp, logp.detach(), torch.zeros(5), mask, cfg, ref_logp=ref, own_mask=own).loss
    norm = LossNorm.of(mask, None, own)
    assert norm.kl_tokens == float((mask & own[:, None]).sum()) and norm.kl_rows == 3.0
    parts = sum(regime_loss(logp[s], logp[s].detach(), torch.zeros(5)[s], mask[s], cfg, ref_logp=ref[s],
                            own_mask=own[s], norm=norm).loss for s in (slice(0, 2), slice(2, 5)))
    torch.testing.assert_close(parts, full)
    with pytest.raises(ValueError, match="no own-row counts"):
        regime_loss(logp, logp.detach(), torch.zeros(5), mask, cfg, ref_logp=ref, own_mask=own, norm=LossNorm.of(mask))
