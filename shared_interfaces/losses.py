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
    L_SGT = - mean over the SGT targets' tokens of log pi_theta                  (sgt.normalize: batch)
          = - sum over rescued prompts p of mean over p's SGT tokens of log pi_theta  (sgt.normalize: prompt)
    KL_k3 = agg over the learner's OWN policy-gradient rows of exp(q) - q - 1, q = log pi_ref - log pi_theta

KL is restricted to own rows: k3 estimates KL(pi_theta || pi_ref) without bias only on samples drawn
from pi_theta (here pi_old, the learner's snapshot); a PRP peer row is a sample of another policy, so
including it would weight the KL by the peer's distribution instead (a different, unbounded quantity
wherever the peer visits what the learner does not).
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
    batch; ``sgt_tokens``: tokens under ``sgt_mask``; ``kl_tokens`` / ``kl_rows``: the same as ``pg_*`` over
    the learner's own rows only (KL's rows; equal to ``pg_*`` when the batch has no peer rows, and None
    means that). With a ``LossNorm`` every aggregate divides by these instead of the micro-batch's own
    counts, so the losses of the micro-batches *sum* to the full-batch loss exactly (what verl calls
    global token normalisation). Build it with :meth:`of`.
    """

    pg_tokens: float
    pg_rows: float
    sgt_tokens: float
    kl_tokens: float | None = None
    kl_rows: float | None = None

    @classmethod
    def of(cls, pg_mask: torch.Tensor, sgt_mask: torch.Tensor | None = None, own_mask: torch.Tensor | None = None) -> LossNorm:
        """Counts over full-batch masks ``[N, T]`` (or any shape ``[..., T]``); ``own_mask [N]`` the own rows."""
        pg = pg_mask.to(torch.float64)
        sgt = 0.0 if sgt_mask is None else float(sgt_mask.to(torch.float64).sum())
        kl_tokens = kl_rows = None
        if own_mask is not None:
            kl = pg * own_mask.to(torch.float64).unsqueeze(-1)
            kl_tokens, kl_rows = float(kl.sum()), float((kl.sum(dim=-1) > 0).sum())
        return cls(pg_tokens=float(pg.sum()), pg_rows=float((pg.sum(dim=-1) > 0).sum()), sgt_tokens=sgt,
                   kl_tokens=kl_tokens, kl_rows=kl_rows)

    def for_kl(self) -> LossNorm:
        """The divisors of the KL term (own rows) in the ``pg_*`` slots."""
        if self.kl_tokens is None:
            return self
        return LossNorm(pg_tokens=self.kl_tokens, pg_rows=float(self.kl_rows or 0.0), sgt_tokens=self.sgt_tokens)


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
    mask = mask.to(loss_mat.dtype)
    row_tokens = mask.sum(dim=-1)
    if norm is None:
        tokens = mask.sum(dim=(-2, -1)).clamp(min=1)
        rows = (row_tokens > 0).to(loss_mat.dtype).sum(dim=-1).clamp(min=1)
    else:
        tokens = torch.as_tensor(max(norm.pg_tokens, 1.0), dtype=loss_mat.dtype)
        rows = torch.as_tensor(max(norm.pg_rows, 1.0), dtype=loss_mat.dtype)
    if mode == "token-mean":
        return masked_sum(loss_mat, mask) / tokens
    if mode == "seq-mean-token-mean":
        return ((loss_mat * mask).sum(dim=-1) / row_tokens.clamp(min=1)).sum(dim=-1) / rows
    if mode == "seq-mean-token-sum-norm":
        return masked_sum(loss_mat, mask) / (rows * max_len)
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
    adv = advantages.to(logp.dtype).unsqueeze(-1)
    ratio = torch.exp(logp - old_logp)
    surr1 = ratio * adv
    surr2 = ratio.clamp(1.0 - cfg.clip_low, 1.0 + cfg.clip_high) * adv
    per_token = -torch.minimum(surr1, surr2)
    if behaviour_coef is not None:
        per_token = per_token * behaviour_coef.detach().to(logp.dtype)
    if sample_weight is not None:
        per_token = per_token * sample_weight.to(logp.dtype).unsqueeze(-1)
    mask_f = mask.to(logp.dtype)
    clip_frac = masked_mean((surr2 < surr1).to(logp.dtype), mask_f).detach()
    return agg_loss(per_token, mask_f, cfg.agg, cfg.dr_grpo_len, norm=norm), clip_frac


def sgt_nll_loss(
    logp: torch.Tensor,
    sgt_mask: torch.Tensor,
    weight: float,
    *,
    norm: LossNorm | None = None,
    row_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """``L_SGT`` -> ``[...]`` (0 where nothing is selected), as :class:`~shared_interfaces.regimes.config.SGTConfig`
    ``normalize`` says:

    * ``batch`` (``row_scale`` None): ``-lambda * mean over the selected successes' tokens of log pi_theta``
      (with ``norm``, the mean is over the whole batch's SGT tokens);
    * ``prompt``: ``-lambda * sum_n row_scale_n * sum_t m_nt log pi_theta(y_nt)`` with ``row_scale [..., N]``
      from :func:`sgt_row_scale` (1 / the SGT tokens of the row's rescued prompt, over the whole batch, so
      it needs no ``norm``): each rescued prompt's mean, summed over prompts.
    """
    mask = sgt_mask.to(logp.dtype)
    if row_scale is not None:
        return -weight * masked_sum(logp * row_scale.to(logp.dtype).unsqueeze(-1), mask)
    if norm is None:
        return -weight * masked_mean(logp, mask)
    return -weight * masked_sum(logp, mask) / max(norm.sgt_tokens, 1.0)


def sgt_row_scale(sgt_rows: torch.Tensor, row_tokens: torch.Tensor, pool: torch.Tensor) -> torch.Tensor:
    """Per-row SGT scale of ``normalize: prompt``: ``1 / sum of the SGT tokens of the rows in the row's pool``
    (its rescued prompt) on SGT rows, 0 on the others. ``sgt_rows [..., N]`` (bool), ``row_tokens [..., N]``
    (tokens of each row's response), ``pool [..., N]`` (int64 >= 0, the row's prompt; broadcastable) ->
    ``[..., N]`` float64. Computed over a learner's whole batch, before it is cut into micro-batches.
    A pool whose SGT rows hold no token gets scale 0 (there is nothing to average)."""
    sgt = sgt_rows.to(torch.bool)
    tokens = torch.where(sgt, row_tokens.to(torch.float64), 0.0)
    pool = pool.to(torch.int64).expand(tokens.shape)
    if pool.numel() and int(pool.min()) < 0:
        raise ValueError("sgt_row_scale: pool indices must be >= 0")
    n_pools = int(pool.max()) + 1 if pool.numel() else 0
    per_pool = torch.zeros(tokens.shape[:-1] + (n_pools,), dtype=torch.float64).scatter_add_(-1, pool, tokens)
    total = per_pool.gather(-1, pool)
    return torch.where(sgt & (total > 0), 1.0 / total.clamp(min=1.0), 0.0)


def peer_behaviour_coef(
    old_logp: torch.Tensor, mu_logp: torch.Tensor, use_mu: torch.Tensor, cap: float
) -> torch.Tensor:
    """Per-token behaviour correction of a batch ``[..., N, T]``: ``min(pi_old / mu, cap)`` on rows with
    ``use_mu [..., N]`` (PRP peer rows under the ``thl`` denominator), exactly 1 elsewhere (own rows and
    ``snapshot`` peer rows, whose denominator *is* ``pi_old``). See
    :func:`shared_interfaces.regimes.math.behaviour_correction`. Detached."""
    coef = behaviour_correction(old_logp.detach(), mu_logp.detach(), cap)
    return torch.where(use_mu.unsqueeze(-1), coef, torch.ones_like(coef))


def kl_rows(pg_mask_f: torch.Tensor, own_mask: torch.Tensor | None,
            norm: LossNorm | None) -> tuple[torch.Tensor, LossNorm | None]:
    """KL's token mask ``[..., N, T]`` (the policy-gradient tokens of own rows; all of them when ``own_mask``
    is None) and its :class:`LossNorm` divisors."""
    if own_mask is None:
        return pg_mask_f, norm
    if norm is not None and norm.kl_tokens is None:
        raise ValueError("regime_loss: own_mask with a LossNorm that has no own-row counts; "
                         "build it with LossNorm.of(pg_mask, sgt_mask, own_mask)")
    return pg_mask_f * own_mask.to(pg_mask_f.dtype).unsqueeze(-1), None if norm is None else norm.for_kl()


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
    sgt_scale: torch.Tensor | None = None,
    ref_logp: torch.Tensor | None = None,
    own_mask: torch.Tensor | None = None,
    norm: LossNorm | None = None,
) -> LossOutput:
    """The full learner loss ``L = L_PG + lambda L_SGT + beta KL_k3`` (module docstring).

    ``pg_mask [..., N, T]`` marks the tokens of rows in the policy-gradient batch; ``sgt_mask`` those
    of SGT target rows (a row may be in both); ``sgt_scale [..., N]`` the per-row scale of SGT's
    ``normalize: prompt`` (:func:`sgt_row_scale`; None: ``batch``). KL is aggregated like ``L_PG`` over the
    policy-gradient rows that are the learner's own, ``own_mask [..., N]`` (None: every row is own).
    ``norm`` (:class:`LossNorm`) makes the loss of a micro-batch its share of the whole batch's loss.
    """
    pg_loss, clip_frac = policy_gradient_loss(logp, old_logp, advantages, pg_mask, cfg, behaviour_coef=behaviour_coef,
                                              sample_weight=sample_weight, norm=norm)
    zero = torch.zeros_like(pg_loss)
    if sgt_mask is not None and sgt_weight > 0:
        sgt = sgt_nll_loss(logp, sgt_mask, sgt_weight, norm=norm, row_scale=sgt_scale)
    else:
        sgt = zero
    pg_mask_f = pg_mask.to(logp.dtype)
    if ref_logp is not None and cfg.kl_coef > 0:
        kl_mask, kl_norm = kl_rows(pg_mask_f, own_mask, norm)
        kl = agg_loss(kl_k3(logp, ref_logp), kl_mask, cfg.agg, cfg.dr_grpo_len, norm=kl_norm)
    else:
        kl = zero
    approx_kl_old = masked_mean((old_logp - logp).detach(), pg_mask_f)
    return LossOutput(
        loss=pg_loss + sgt + cfg.kl_coef * kl,
        pg_loss=pg_loss.detach(),
        sgt_loss=sgt.detach(),
        kl=kl.detach(),
        clip_fraction=clip_frac,
        approx_kl_old=approx_kl_old,
    )
