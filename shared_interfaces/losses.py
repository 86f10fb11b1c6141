"""The policy loss, written once in torch for both backends.

Tensors are ``[..., N, T]``: leading dims (e.g. seeds in the bandit) are kept, N rows (samples) of T
tokens each (T = 1 in the bandit), ``mask`` marks real tokens. Per-row quantities (advantages,
weights) are ``[..., N]``. Every aggregate returns ``[...]``; callers sum or mean it.

The learner's loss for one batch (:func:`regime_loss`)::

    L = L_PG + lambda * L_SGT + beta * KL_k3
    L_PG  = agg_{n,t} [ -w_n * c_nt * min(rho_nt A_n, clip(rho_nt, 1 - eps_low, 1 + eps_high) A_n) ]
    rho   = exp(log pi_theta - log pi_old)            (proximal ratio; PPO clip)
    c     = behaviour correction (1 for own samples; PRP's min(pi_old / mu, cap) for peer samples)
    w     = sample weight (1 own, PRP peer_weight for peer samples)
    L_SGT = - mean over the SGT targets' tokens of log pi_theta
    KL_k3 = agg of exp(q) - q - 1, q = log pi_ref - log pi_theta
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from shared_interfaces.regimes.config import LossConfig
from shared_interfaces.regimes.math import behaviour_correction


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dims: tuple[int, ...] = (-2, -1)) -> torch.Tensor:
    return (x * mask).sum(dim=dims)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dims: tuple[int, ...] = (-2, -1)) -> torch.Tensor:
    """Mean of ``x`` over ``mask`` along ``dims``; 0 where the mask is empty."""
    return masked_sum(x, mask, dims) / mask.sum(dim=dims).clamp(min=1)


@dataclass(frozen=True)
class LossNorm:
    """Divisors of a learner's *whole* batch, for gradient accumulation over micro-batches.

    ``pg_tokens`` / ``pg_rows``: tokens and rows (with at least one token) under ``pg_mask`` in the whole
    batch; ``sgt_tokens``: tokens under ``sgt_mask``. With a ``LossNorm`` every aggregate divides by these
    instead of the micro-batch's own counts, so the losses of the micro-batches *sum* to the full-batch
    loss exactly (what verl calls global token normalisation). Build it with :meth:`of`.
    """

    pg_tokens: float
    pg_rows: float
    sgt_tokens: float

    @classmethod
    def of(cls, pg_mask: torch.Tensor, sgt_mask: torch.Tensor | None = None) -> LossNorm:
        """Counts over full-batch masks ``[N, T]`` (or any shape ``[..., T]``)."""
        pg = pg_mask.to(torch.float64)
        sgt = 0.0 if sgt_mask is None else float(sgt_mask.to(torch.float64).sum())
        return cls(pg_tokens=float(pg.sum()), pg_rows=float((pg.sum(dim=-1) > 0).sum()), sgt_tokens=sgt)


def agg_loss(
    loss_mat: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    max_len: int = 1,
    *,
    norm: LossNorm | None = None,
) -> torch.Tensor:
    """Aggregate a per-token loss ``[..., N, T]`` to ``[...]``.

    * ``token-mean``: ``sum_{n,t} m l / sum_{n,t} m`` (verl/TRL default, DAPO);
    * ``seq-mean-token-mean``: ``mean_n (sum_t m l / sum_t m)`` over rows with at least one token;
    * ``seq-mean-token-sum-norm`` (Dr.GRPO): ``sum_{n,t} m l / (N_rows * max_len)`` with ``max_len``
      a constant (the generation budget), N_rows the rows with at least one token.

    With ``norm`` (a micro-batch of a larger batch) the token and row counts are the whole batch's.
    """
    return _agg_loss(loss_mat, mask.to(loss_mat.dtype), mode, max_len, norm, None)


def _agg_loss(
    loss_mat: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    max_len: int,
    norm: LossNorm | None,
    tokens: torch.Tensor | None,
) -> torch.Tensor:
    """:func:`agg_loss` on a float ``mask``; ``tokens``: the mask's count ``mask.sum(dim=(-2, -1))
    .clamp(min=1)`` when the caller has it (ignored with ``norm``). Each mode computes only its divisors."""
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


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(pi_theta || pi_ref): ``exp(q) - q - 1``, ``q = log pi_ref - log pi_theta``
    (non-negative, unbiased for samples from pi_theta)."""
    q = ref_logp - logp
    return torch.exp(q) - q - 1.0


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Per-position entropy ``H = logsumexp(z) - sum softmax(z) z`` over the last (vocabulary) axis."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(dim=-1)


def token_logprobs(logits: torch.Tensor, token_ids: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Behaviour log-probs, defined once: ``log_softmax(logits / temperature)`` over the full vocabulary,
    gathered at ``token_ids``. ``logits [..., V]``, ``token_ids [...]`` -> ``[...]`` (float32)."""
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    return logp.gather(-1, token_ids.long().unsqueeze(-1)).squeeze(-1)


@dataclass
class LossOutput:
    """The learner's loss ``[...]`` and its parts and diagnostics (detached, ``[...]``)."""

    loss: torch.Tensor
    pg_loss: torch.Tensor
    sgt_loss: torch.Tensor
    kl: torch.Tensor
    clip_fraction: torch.Tensor
    approx_kl_old: torch.Tensor


def policy_gradient_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cfg: LossConfig,
    *,
    behaviour_coef: torch.Tensor | None = None,
    sample_weight: torch.Tensor | None = None,
    norm: LossNorm | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The clipped surrogate ``L_PG`` (see module docstring) and the clip fraction, both ``[...]``.

    ``advantages`` and ``sample_weight`` are per row ``[..., N]``; ``behaviour_coef`` per token
    ``[..., N, T]`` and treated as a constant (detached).
    """
    loss, clip_frac, _ = _policy_gradient_loss(
        logp, old_logp, advantages, mask.to(logp.dtype), cfg, behaviour_coef, sample_weight, norm
    )
    return loss, clip_frac


def _policy_gradient_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask_f: torch.Tensor,
    cfg: LossConfig,
    behaviour_coef: torch.Tensor | None,
    sample_weight: torch.Tensor | None,
    norm: LossNorm | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`policy_gradient_loss` on a float mask; also returns the mask's token count (clamped to >= 1),
    computed once for the loss, the clip fraction and the caller's diagnostics."""
    adv = advantages.to(logp.dtype).unsqueeze(-1)
    ratio = torch.exp(logp - old_logp)
    surr1 = ratio * adv
    surr2 = ratio.clamp(1.0 - cfg.clip_low, 1.0 + cfg.clip_high) * adv
    # min(surr1, surr2) as a select: the same values, and the same gradient (a tie, e.g. at the snapshot
    # where rho = 1, sends it all through surr1 instead of half through each; the halves add up exactly)
    # at a lower cost than torch.minimum's backward
    per_token = -torch.where(surr1 <= surr2, surr1, surr2)
    if behaviour_coef is not None:
        per_token = per_token * behaviour_coef.detach().to(logp.dtype)
    if sample_weight is not None:
        per_token = per_token * sample_weight.to(logp.dtype).unsqueeze(-1)
    clipped = (surr2 < surr1).to(logp.dtype)
    tokens = mask_f.sum(dim=(-2, -1)).clamp(min=1)
    loss = _agg_loss(per_token, mask_f, cfg.agg, cfg.max_response_len, norm, tokens)
    return loss, (masked_sum(clipped, mask_f) / tokens).detach(), tokens


def sgt_nll_loss(
    logp: torch.Tensor, sgt_mask: torch.Tensor, weight: float, *, norm: LossNorm | None = None
) -> torch.Tensor:
    """``L_SGT = -lambda * mean over the selected successes' tokens of log pi_theta`` -> ``[...]``
    (0 where nothing is selected; with ``norm``, the mean is over the whole batch's SGT tokens)."""
    mask = sgt_mask.to(logp.dtype)
    if norm is None:
        return -weight * masked_mean(logp, mask)
    return -weight * masked_sum(logp, mask) / max(norm.sgt_tokens, 1.0)


def peer_behaviour_coef(
    old_logp: torch.Tensor, mu_logp: torch.Tensor, use_mu: torch.Tensor, cap: float
) -> torch.Tensor:
    """Per-token behaviour correction of a batch ``[..., N, T]``: ``min(pi_old / mu, cap)`` on rows with
    ``use_mu [..., N]`` (PRP peer rows under the ``thl`` denominator), exactly 1 elsewhere (own rows and
    ``snapshot`` peer rows, whose denominator *is* ``pi_old``). See
    :func:`shared_interfaces.regimes.math.behaviour_correction`. Detached."""
    coef = behaviour_correction(old_logp.detach(), mu_logp.detach(), cap)
    return torch.where(use_mu.unsqueeze(-1), coef, torch.ones_like(coef))


def regime_loss(
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
    ref_logp: torch.Tensor | None = None,
    norm: LossNorm | None = None,
) -> LossOutput:
    """The full learner loss ``L = L_PG + lambda L_SGT + beta KL_k3`` (module docstring).

    ``pg_mask [..., N, T]`` marks the tokens of rows in the policy-gradient batch; ``sgt_mask`` those
    of SGT target rows (a row may be in both). KL is aggregated over ``pg_mask`` like ``L_PG``.
    ``norm`` (:class:`LossNorm`) makes the loss of a micro-batch its share of the whole batch's loss.
    """
    pg_mask_f = pg_mask.to(logp.dtype)
    pg_loss, clip_frac, pg_tokens = _policy_gradient_loss(
        logp, old_logp, advantages, pg_mask_f, cfg, behaviour_coef, sample_weight, norm
    )
    zero = torch.zeros_like(pg_loss)
    if sgt_mask is not None and sgt_weight > 0:
        sgt = sgt_nll_loss(logp, sgt_mask, sgt_weight, norm=norm)
    else:
        sgt = zero
    if ref_logp is not None and cfg.kl_coef > 0:
        kl = _agg_loss(kl_k3(logp, ref_logp), pg_mask_f, cfg.agg, cfg.max_response_len, norm, pg_tokens)
    else:
        kl = zero
    approx_kl_old = masked_sum((old_logp - logp).detach(), pg_mask_f) / pg_tokens
    return LossOutput(
        loss=pg_loss + sgt + cfg.kl_coef * kl,
        pg_loss=pg_loss.detach(),
        sgt_loss=sgt.detach(),
        kl=kl.detach(),
        clip_fraction=clip_frac,
        approx_kl_old=approx_kl_old,
    )
