"""One policy update on a :class:`~mrl_llm.batch.TrainBatch`: micro-batches, the core's loss, the optimizer.

Rows (in the core's order) are cut into mini-batches — all rows, or ``micro_batch * grad_accum`` rows
each — and every mini-batch into micro-batches of ``micro_batch`` rows. Per micro-batch::

    logp      = log pi_theta(y_t | x, y_<t)          (one forward, response layout)
    old       = log pi_old: logp.detach() when the step has a single mini-batch (the weights have not
                moved yet, so this IS the snapshot), else a no-grad pass before the first update
    coef      = peer_behaviour_coef(old, mu, use_mu, cap)      (core; 1 except on ``thl`` peer rows)
    ref       = log pi_ref (frozen initial weights) when kl_coef > 0 or the KL metric is tracked
    loss      = regime_loss(logp, old, A, pg_mask, cfg, behaviour_coef=coef, sample_weight=w,
                            sgt_mask=..., sgt_weight=lambda, ref_logp=ref, norm=LossNorm(mini-batch))

With ``max_tokens`` (``train.max_tokens_per_micro_batch``) a mini-batch's micro-batches are its token-budget
groups instead (:mod:`mrl_llm.micro_batches`); ``logprob_chunk`` runs the LM head in checkpointed chunks
(:func:`mrl_llm.logprobs.chunked_forward_logprobs`). ``padding_waste`` = padded / real tokens of the step.

The micro-batch losses of a mini-batch sum to its loss (``LossNorm``), so the accumulated gradient is
the mini-batch gradient; then grad-norm clipping and one optimizer step. A non-finite loss or gradient
norm aborts the update: the gradients are dropped, no optimizer step is taken for that mini-batch and
the rest, and the result says so (``nan_skipped``); the caller counts consecutive skips.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from mrl_llm.batch import TrainBatch, pad_rows, response_layout
from mrl_llm.logprobs import forward_logprobs, pack, response_logprobs
from mrl_llm.micro_batches import micro_batch_groups, token_budget_groups
from shared_interfaces.losses import kl_k3, peer_behaviour_coef, regime_loss
from shared_interfaces.regimes.config import LossConfig
from shared_interfaces.regimes.math import ratio_variance


@dataclass
class UpdateResult:
    metrics: dict[str, float] = field(default_factory=dict)
    nan_skipped: bool = False
    optimizer_steps: int = 0
    tokens: int = 0  # response tokens forward+backward
    seq_tokens: int = 0  # prompt + response tokens forward+backward
    ref_seq_tokens: int = 0  # tokens through the reference model
    old_seq_tokens: int = 0  # tokens through the snapshot pass
    padded_tokens: int = 0  # prompt + response tokens with padding, forward+backward


class _Acc:
    """Weighted sums for the step's diagnostics."""

    def __init__(self) -> None:
        self.s: dict[str, float] = {}
        self.n: dict[str, float] = {}

    def add(self, key: str, total: float, count: float) -> None:
        self.s[key] = self.s.get(key, 0.0) + total
        self.n[key] = self.n.get(key, 0.0) + count

    def mean(self, key: str) -> float:
        n = self.n.get(key, 0.0)
        return self.s.get(key, 0.0) / n if n > 0 else float("nan")


def minibatches(n: int, micro_batch: int, grad_accum: int | None) -> list[list[int]]:
    """Row indices of each optimizer update's mini-batch (see the module docstring)."""
    size = n if grad_accum is None else micro_batch * grad_accum
    size = max(1, size)
    return [list(range(s, min(n, s + size))) for s in range(0, n, size)]


def run_update(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: TrainBatch,
    *,
    loss_cfg: LossConfig,
    temperature: float,
    micro_batch: int,
    grad_accum: int | None,
    grad_clip: float | None,
    pad_id: int,
    ref_model: torch.nn.Module | None = None,
    max_tokens: int | None = None,
    logprob_chunk: int | None = None,
) -> UpdateResult:
    """Apply the step's update (module docstring) and return its diagnostics."""
    res = UpdateResult()
    n = len(batch)
    if n == 0:
        return res
    device = next(model.parameters()).device
    mbs = minibatches(n, micro_batch, grad_accum)
    seq_lens = [len(p) + len(r) for p, r in zip(batch.prompts, batch.responses, strict=True)]
    old_all: list[list[float]] | None = None
    if len(mbs) > 1:
        old_all = response_logprobs(model, batch.prompts, batch.responses, pad_id=pad_id,
                                    temperature=temperature, micro_batch=micro_batch, chunk_size=logprob_chunk,
                                    groups=None if max_tokens is None else token_budget_groups(seq_lens, max_tokens))
        res.old_seq_tokens = sum(len(p) + len(r) for p, r in zip(batch.prompts, batch.responses, strict=True))
    acc = _Acc()
    peer_old: list[np.ndarray] = []
    peer_mu: list[np.ndarray] = []
    drift = 0.0
    params = [p for p in model.parameters() if p.requires_grad]
    model.train()
    for mb in mbs:
        norm = batch.norm(mb)
        optimizer.zero_grad(set_to_none=True)
        mb_loss = {"loss": 0.0, "pg_loss": 0.0, "sgt_loss": 0.0, "kl_loss": 0.0}
        for idx in micro_batch_groups(mb, seq_lens, micro_batch=micro_batch, max_tokens=max_tokens):
            packed = pack([batch.prompts[i] for i in idx], [batch.responses[i] for i in idx], pad_id)
            logp_full, ent_full = forward_logprobs(model, packed, temperature, with_entropy=True,
                                                   chunk_size=logprob_chunk)
            logp, mask = response_layout(logp_full, packed)
            T = logp.shape[1]
            if old_all is None:
                old = logp.detach()
            else:
                old = pad_rows([old_all[i] for i in idx], T).to(device, logp.dtype)
            mu = pad_rows([batch.mu[i] for i in idx], T).to(device, logp.dtype)
            use_mu = batch.use_mu[idx].to(device)
            coef = peer_behaviour_coef(old, mu, use_mu, batch.ratio_cap)
            pg_mask = mask & batch.in_pg[idx].to(device)[:, None]
            sgt_mask = mask & batch.sgt[idx].to(device)[:, None]
            ref = None
            if ref_model is not None:
                with torch.no_grad():
                    ref_full, _ = forward_logprobs(ref_model, packed, temperature, chunk_size=logprob_chunk)
                ref = response_layout(ref_full, packed)[0].to(logp.dtype)
                res.ref_seq_tokens += int(packed.attention_mask.sum())
            out = regime_loss(
                logp, old, batch.advantages[idx].to(device), pg_mask, loss_cfg,
                behaviour_coef=coef, sample_weight=batch.weights[idx].to(device),
                sgt_mask=sgt_mask, sgt_weight=batch.sgt_weight, ref_logp=ref, norm=norm,
            )
            if not torch.isfinite(out.loss).all():
                optimizer.zero_grad(set_to_none=True)
                res.nan_skipped = True
                res.metrics = {"nan_skipped": 1.0}
                return res
            out.loss.backward()
            # -- diagnostics (detached) ------------------------------------------------------
            mb_loss["loss"] += float(out.loss.detach())
            mb_loss["pg_loss"] += float(out.pg_loss)
            mb_loss["sgt_loss"] += float(out.sgt_loss)
            mb_loss["kl_loss"] += float(out.kl)
            n_pg = float(pg_mask.sum())
            acc.add("clip_fraction", float(out.clip_fraction) * n_pg, n_pg)
            acc.add("approx_kl_old", float(out.approx_kl_old) * n_pg, n_pg)
            own_mask = mask & batch.own[idx].to(device)[:, None]
            n_own = float(own_mask.sum())
            ent, _ = response_layout(ent_full, packed)
            acc.add("entropy", float((ent * own_mask).sum()), n_own)
            if ref is not None:
                acc.add("kl_to_ref", float((kl_k3(logp.detach(), ref) * own_mask).sum()), n_own)
            if n_own:
                drift = max(drift, float(((old - mu).abs() * own_mask).max()))
            peer_rows = ~batch.own[idx]
            for j in torch.nonzero(peer_rows & batch.in_pg[idx]).flatten().tolist():
                m = mask[j]
                peer_old.append(old[j][m].float().cpu().numpy())
                peer_mu.append(mu[j][m].float().cpu().numpy())
            thl_mask = mask & use_mu[:, None] & batch.in_pg[idx].to(device)[:, None]
            acc.add("prp_coef", float((coef * thl_mask).sum()), float(thl_mask.sum()))
            res.tokens += int(mask.sum())
            res.seq_tokens += int(packed.attention_mask.sum())
            res.padded_tokens += packed.input_ids.numel()
        grad_norm = torch.nn.utils.clip_grad_norm_(params, grad_clip if grad_clip is not None else math.inf)
        if not torch.isfinite(grad_norm):
            optimizer.zero_grad(set_to_none=True)
            res.nan_skipped = True
            res.metrics = {"nan_skipped": 1.0}
            return res
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        res.optimizer_steps += 1
        acc.add("grad_norm", float(grad_norm), 1.0)
        for k, v in mb_loss.items():
            acc.add(k, v, 1.0)
    m = {k: acc.mean(k) for k in ("loss", "pg_loss", "sgt_loss", "kl_loss", "clip_fraction", "approx_kl_old",
                                  "entropy", "grad_norm", "prp_coef")}
    m["kl_to_ref"] = acc.mean("kl_to_ref") if ref_model is not None else float("nan")
    m["logprob_drift_max"] = drift
    m["padding_waste"] = res.padded_tokens / res.seq_tokens if res.seq_tokens else float("nan")
    if peer_old:
        m["prp_ratio_var"] = ratio_variance(np.concatenate(peer_old), np.concatenate(peer_mu))
    m["nan_skipped"] = 0.0
    res.metrics = m
    return res
