"""One policy update on a :class:`~mrl_llm.batch.TrainBatch`: micro-batches, the core's loss, the optimizer.

Rows (in the core's order) are cut into mini-batches — all rows, or ``micro_batch * grad_accum`` rows
each — and every mini-batch into micro-batches of ``micro_batch`` rows. Per micro-batch::

    logp      = log pi_theta(y_t | x, y_<t)          (one forward, response layout)
    old       = log pi_old: logp.detach() when the step has a single mini-batch (the weights have not
                moved yet, so this IS the snapshot), else a no-grad pass before the first update
    coef      = rows.behaviour_coef(old, mu)             (core; 1 except on ``use_mu`` = ``thl`` peer rows)
    ref       = log pi_ref (frozen initial weights) when kl_coef > 0 or the KL metric is tracked
    loss      = regime_loss(logp, old, rows.advantages, pg_mask, cfg, behaviour_coef=coef,
                            sample_weight=rows.sample_weight, sgt_mask=..., sgt_weight=rows.sgt_weight,
                            sgt_scale=..., ref_logp=ref, own_mask=rows.own_mask, norm=LossNorm(mini-batch))
                (``rows``: the micro-batch's :class:`~shared_interfaces.regimes.rows.LearnerRows`; the token
                masks ``pg_mask`` / ``sgt_mask`` are the rows' masks on their response tokens)

With ``max_tokens`` (``train.max_tokens_per_micro_batch``) a mini-batch's micro-batches are its token-budget
groups instead (:mod:`mrl_llm.micro_batches`); ``logprob_chunk`` runs the LM head in checkpointed chunks
(:func:`mrl_llm.logprobs.chunked_forward_logprobs`). ``padding_waste`` = padded / real tokens of the step.

Mixed precision (``autocast``, a factory of the compute dtype's context): entered around each micro-batch's
forward and loss (with its reference pass) and around the snapshot pass, never across a backward or an
optimizer step, as verl's actor does. ``torch.autocast`` caches its low-precision casts of the fp32 masters
until its region exits, so one region around the whole update would run every mini-batch after the first
on the start-of-step weights (its ratio to pi_old 1, clipping never engaged).

The micro-batch losses of a mini-batch sum to its loss (``LossNorm``), so the accumulated gradient is
the mini-batch gradient (parameters of an optimizer group with ``sgt: False``, ``train.lr_groups``, take the
gradient of ``loss - lambda L_SGT`` only: the SGT term is back-propagated first and their gradients are put
back, :func:`backward`); then grad-norm clipping and one optimizer step. A non-finite loss or gradient
norm aborts the update: the gradients are dropped, no optimizer step is taken for that mini-batch and
the rest, and the result says so (``nan_skipped``); the caller counts consecutive skips.

:func:`micro_batch_loss` is one micro-batch's forward and loss; :class:`Diagnostics` accumulates the
step's diagnostics apart from it; :func:`run_update` is the loop and its one abort path.

``share`` (a :class:`mrl_llm.parallel.share.RankShare`, k ranks of one policy): the hook of a worker group,
kept apart in the loop (``if share is not None``). Each mini-batch's rows become this rank's token-balanced
share, its ``LossNorm`` the all-reduced global counts, its micro-batch count the ranks' largest (fillers
with loss x 0), a non-finite loss anywhere aborts everywhere, the logged loss terms are summed over ranks and
the clipping norm is the global one, summed with them — two small collectives a mini-batch
(:mod:`mrl_llm.parallel.share`) besides FSDP's; with ``train.grad_sync: mini_batch`` the FSDP2 units of the model
and of the reference stay gathered through each mini-batch (and through the snapshot pass) and only its last
backward reduce-scatters (:meth:`~mrl_llm.parallel.share.RankShare.gathered`, ``sync_grads``). The other
diagnostics are the batch's too (:meth:`Diagnostics.reduce`, one collective a step): token-weighted sums and
counts summed over the ranks, the drift the ranks' largest, PRP's ratio variance over every rank's peer tokens.
Without ``share``: the one-process update.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch

from mrl_llm.batch import TrainBatch, pad_rows, pad_tensors, response_layout
from mrl_llm.logprobs import forward_logprobs, pack, response_logprob_rows
from mrl_llm.micro_batches import micro_batch_groups, token_budget_groups
from shared_interfaces.losses import LossNorm, LossOutput, kl_k3, regime_loss, sgt_nll_loss
from shared_interfaces.regimes.config import LossConfig
from shared_interfaces.regimes.math import ratio_variance

if TYPE_CHECKING:
    from mrl_llm.parallel.group import WorkerGroup
    from mrl_llm.parallel.share import RankShare


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


def minibatches(n: int, micro_batch: int, grad_accum: int | None) -> list[list[int]]:
    """Row indices of each optimizer update's mini-batch (see the module docstring)."""
    size = n if grad_accum is None else micro_batch * grad_accum
    size = max(1, size)
    return [list(range(s, min(n, s + size))) for s in range(0, n, size)]


class Diagnostics:
    """The step's diagnostics, accumulated over micro-batches apart from the loss (all detached): weighted
    sums for the means, the largest engine/trainer log-prob drift on own rows, and the peer rows'
    ``(pi_old, mu)`` log-probs for PRP's ratio variance."""

    def __init__(self) -> None:
        self.s: dict[str, float] = {}
        self.n: dict[str, float] = {}
        self.drift = 0.0
        self.peer_old: list[np.ndarray] = []
        self.peer_mu: list[np.ndarray] = []

    #: what :meth:`micro_batch` adds: token-weighted sums over this rank's rows (:meth:`reduce` sums them over ranks)
    TOKEN_KEYS = ("clip_fraction", "approx_kl_old", "entropy", "kl_to_ref", "prp_coef")

    def add(self, key: str, total: float, count: float) -> None:
        self.s[key] = self.s.get(key, 0.0) + total
        self.n[key] = self.n.get(key, 0.0) + count

    def mean(self, key: str) -> float:
        n = self.n.get(key, 0.0)
        return self.s.get(key, 0.0) / n if n > 0 else float("nan")

    def micro_batch(self, mb: MicroBatch, out: LossOutput, losses: dict[str, float]) -> None:
        """Add one micro-batch's loss terms (to ``losses``, the mini-batch's sums) and diagnostics."""
        losses["loss"] += float(out.loss.detach())
        losses["pg_loss"] += float(out.pg_loss)
        losses["sgt_loss"] += float(out.sgt_loss)
        losses["kl_loss"] += float(out.kl)
        n_pg = float(mb.pg_mask.sum())
        self.add("clip_fraction", float(out.clip_fraction) * n_pg, n_pg)
        self.add("approx_kl_old", float(out.approx_kl_old) * n_pg, n_pg)
        own_mask = mb.mask & mb.own_mask[:, None]
        n_own = float(own_mask.sum())
        self.add("entropy", float((mb.entropy * own_mask).sum()), n_own)
        if mb.ref is not None:
            self.add("kl_to_ref", float((kl_k3(mb.logp.detach(), mb.ref) * own_mask).sum()), n_own)
        if n_own:
            self.drift = max(self.drift, float(((mb.old - mb.mu).abs() * own_mask).max()))
        peer = mb.mask & (~mb.own_mask & mb.rows_pg)[:, None]  # the peer rows' tokens, row by row
        if bool(peer.any()):
            self.peer_old.append(mb.old[peer].float().cpu().numpy())
            self.peer_mu.append(mb.mu[peer].float().cpu().numpy())
        thl_mask = mb.mask & mb.use_mu[:, None] & mb.rows_pg[:, None]
        self.add("prp_coef", float((mb.coef * thl_mask).sum()), float(thl_mask.sum()))

    def reduce(self, group: WorkerGroup) -> None:
        """The batch's diagnostics, on every rank of ``group`` (a collective: every rank calls it, once, after its
        micro-batches): the token-weighted sums and counts of :attr:`TOKEN_KEYS` summed over the ranks (the mean is
        ``sum_r s_r / sum_r n_r``), ``drift`` the ranks' largest, the peer tokens' ``(pi_old, mu)`` log-probs every
        rank's (the ratio variance is over all of them). The loss terms and the gradient norm, global already,
        are not touched. A group of one: nothing changes."""
        if not group.sharded:
            return
        peer = ((np.concatenate(self.peer_old), np.concatenate(self.peer_mu)) if self.peer_old else None)
        mine = ({k: (self.s[k], self.n[k]) for k in self.TOKEN_KEYS if k in self.n}, self.drift, peer)
        got = group.gather_objects(mine)
        for k in self.TOKEN_KEYS:
            parts = [sums[k] for sums, _, _ in got if k in sums]
            if parts:
                self.s[k], self.n[k] = math.fsum(a for a, _ in parts), math.fsum(b for _, b in parts)
        self.drift = max(d for _, d, _ in got)
        peers = [p for _, _, p in got if p is not None]
        self.peer_old, self.peer_mu = [o for o, _ in peers], [m for _, m in peers]

    def metrics(self, *, tracks_ref: bool) -> dict[str, float]:
        m = {k: self.mean(k) for k in ("loss", "pg_loss", "sgt_loss", "kl_loss", "clip_fraction", "approx_kl_old",
                                       "entropy", "grad_norm", "prp_coef")}
        m["kl_to_ref"] = self.mean("kl_to_ref") if tracks_ref else float("nan")
        m["logprob_drift_max"] = self.drift
        if self.peer_old:
            m["prp_ratio_var"] = ratio_variance(np.concatenate(self.peer_old), np.concatenate(self.peer_mu))
        m["nan_skipped"] = 0.0
        return m


@dataclass
class MicroBatch:
    """One micro-batch's tensors in the response layout ``[b, T]``: the forward's ``logp`` (with grad) and
    ``entropy``, the snapshot ``old`` (log pi_old), the behaviour ``mu``, the reference ``ref`` (or None),
    the behaviour correction ``coef``, the token masks (``mask``: real tokens; ``pg_mask``: the rows' on them)
    and the rows' ``rows_pg`` (``pg_mask [b]``), ``own_mask`` and ``use_mu``."""

    logp: torch.Tensor
    entropy: torch.Tensor
    old: torch.Tensor
    mu: torch.Tensor
    ref: torch.Tensor | None
    coef: torch.Tensor
    mask: torch.Tensor
    pg_mask: torch.Tensor
    rows_pg: torch.Tensor
    own_mask: torch.Tensor
    use_mu: torch.Tensor
    sgt_term: torch.Tensor | None = None  # lambda L_SGT with its graph, when asked for (``split_sgt``)


def backward(loss: torch.Tensor, sgt_term: torch.Tensor | None, no_sgt: list[torch.Tensor]) -> None:
    """``loss.backward()``, except that the parameters ``no_sgt`` get the gradient of ``loss - sgt_term`` only:
    ``sgt_term`` (``lambda L_SGT``, a part of ``loss`` with its graph) is back-propagated first, their
    gradients (accumulated over earlier micro-batches) are put back, then the rest. One backward when there
    is nothing to keep apart."""
    if sgt_term is None or not no_sgt or not sgt_term.requires_grad:
        loss.backward()
        return
    kept = [None if p.grad is None else p.grad.clone() for p in no_sgt]
    sgt_term.backward(retain_graph=True)
    for p, g in zip(no_sgt, kept, strict=True):
        p.grad = g
    (loss - sgt_term).backward()


def micro_batch_loss(model: torch.nn.Module, batch: TrainBatch, idx: list[int], snapshot: list[torch.Tensor] | None, *,
                     loss_cfg: LossConfig, temperature: float, pad_id: int, norm: LossNorm,
                     ref_model: torch.nn.Module | None, res: UpdateResult,
                     logprob_chunk: int | None = None, split_sgt: bool = False,
                     share_prefix: bool = False) -> tuple[LossOutput, MicroBatch]:
    """Rows ``idx``: one forward, the core's behaviour correction and loss (module docstring). ``snapshot``:
    the rows' ``log pi_old`` from a pass before the first update, or None (``old = logp.detach()``).
    ``split_sgt``: also return the loss's SGT term with its graph (``MicroBatch.sgt_term``; None when the
    rows hold no SGT token). ``share_prefix``: the forward passes run each distinct prompt once
    (:mod:`mrl_llm.prefix_logprobs`)."""
    device = next(model.parameters()).device
    packed = pack([batch.prompts[i] for i in idx], [batch.responses[i] for i in idx], pad_id)
    logp_full, ent_full = forward_logprobs(model, packed, temperature, with_entropy=True, chunk_size=logprob_chunk,
                                           share_prefix=share_prefix)
    logp, mask = response_layout(logp_full, packed)
    T = logp.shape[1]
    old = logp.detach() if snapshot is None else pad_tensors([snapshot[i] for i in idx], T).to(device, logp.dtype)
    mu = pad_rows([batch.mu[i] for i in idx], T).to(device, logp.dtype)
    rows = batch.rows.take(idx)
    rows_pg, own_mask, use_mu = rows.pg_mask.to(device), rows.own_mask.to(device), rows.use_mu.to(device)
    coef = rows.behaviour_coef(old, mu)
    pg_mask = mask & rows_pg[:, None]
    sgt_mask = mask & rows.sgt_mask.to(device)[:, None]
    ref = None
    if ref_model is not None:
        with torch.no_grad():
            ref_full, _ = forward_logprobs(ref_model, packed, temperature, chunk_size=logprob_chunk,
                                           share_prefix=share_prefix)
        ref = response_layout(ref_full, packed)[0].to(logp.dtype)
        res.ref_seq_tokens += int(packed.attention_mask.sum())
    sgt_scale = None if batch.sgt_scale is None else batch.sgt_scale[idx].to(device)
    out = regime_loss(
        logp, old, rows.advantages.to(device), pg_mask, loss_cfg,
        behaviour_coef=coef, sample_weight=rows.sample_weight.to(device),
        sgt_mask=sgt_mask, sgt_weight=rows.sgt_weight, sgt_scale=sgt_scale,
        ref_logp=ref, own_mask=own_mask, norm=norm,
    )
    sgt_term = None
    if split_sgt and rows.sgt_weight > 0 and bool(sgt_mask.any()):  # the same term regime_loss added
        sgt_term = sgt_nll_loss(logp, sgt_mask, rows.sgt_weight, norm=norm, row_scale=sgt_scale)
    res.tokens += int(mask.sum())
    res.seq_tokens += int(packed.attention_mask.sum())
    res.padded_tokens += packed.input_ids.numel()
    entropy, _ = response_layout(ent_full, packed)
    return out, MicroBatch(logp, entropy, old, mu, ref, coef, mask, pg_mask, rows_pg, own_mask, use_mu, sgt_term)


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
    share_prefix: bool = False,
    share: RankShare | None = None,
    autocast: Callable[[], AbstractContextManager] = nullcontext,
) -> UpdateResult:
    """Apply the step's update (module docstring) and return its diagnostics. ``autocast``: a factory of the
    compute dtype's context (:meth:`mrl_llm.precision.Precision.autocast` bound to the device), entered
    around each forward and loss only (module docstring). ``share_prefix``: every forward runs each distinct
    prompt of a micro-batch once (``train.share_prefix``, :mod:`mrl_llm.prefix_logprobs`)."""
    res = UpdateResult()
    n = len(batch)
    if n == 0:
        return res
    mbs = minibatches(n, micro_batch, grad_accum)
    seq_lens = [len(p) + len(r) for p, r in zip(batch.prompts, batch.responses, strict=True)]
    snapshot: list[torch.Tensor] | None = None  # log pi_old of every row, when the weights move within the step
    if len(mbs) > 1:
        with torch.no_grad(), _gathered(share, model), autocast():  # no graph (under FSDP a forward with grad and no backward breaks the next step)
            snapshot = response_logprob_rows(model, batch.prompts, batch.responses, pad_id=pad_id,
                                             temperature=temperature, micro_batch=micro_batch,
                                             chunk_size=logprob_chunk, share_prefix=share_prefix,
                                             groups=None if max_tokens is None
                                             else token_budget_groups(seq_lens, max_tokens))
        res.old_seq_tokens = sum(seq_lens)
    diag = Diagnostics()
    params = [p for p in model.parameters() if p.requires_grad]
    no_sgt = [p for g in optimizer.param_groups if not g.get("sgt", True) for p in g["params"]]
    sharded = share is not None and share.fsdp  # k > 1 ranks holding FSDP2 shards (else whole models)
    if no_sgt and sharded:
        raise ValueError("train.lr_groups with sgt: false needs a policy on one rank (ranks: 1) or whole replicas "
                         "(train.fsdp_unit: none); a worker group's FSDP2 backward cannot be split into two passes")
    model.train()
    for rows in mbs:
        local = rows if share is None else share.rows(rows, seq_lens)  # worker group: this rank's share
        groups = micro_batch_groups(local, seq_lens, micro_batch=micro_batch, max_tokens=max_tokens)
        if share is None:
            norm, plan = batch.norm(rows), [(g, True) for g in groups]
        else:  # global counts, and as many micro-batches as the busiest rank
            norm, plan = share.plan(batch, local, groups, filler=rows[:1])
        optimizer.zero_grad(set_to_none=True)
        losses = {"loss": 0.0, "pg_loss": 0.0, "sgt_loss": 0.0, "kl_loss": 0.0}
        finite = True
        with _gathered(share, model, ref_model):
            for i, (idx, real) in enumerate(plan):
                with autocast():  # forward and loss only: never across a backward or an optimizer step
                    out, mb = micro_batch_loss(model, batch, idx, snapshot, loss_cfg=loss_cfg,
                                               temperature=temperature, pad_id=pad_id, norm=norm, ref_model=ref_model,
                                               res=res if real else UpdateResult(), logprob_chunk=logprob_chunk,
                                               split_sgt=bool(no_sgt), share_prefix=share_prefix)
                ok = bool(torch.isfinite(out.loss).all())
                finite = finite and ok
                if not finite and share is None:
                    break  # one process: nothing else to run; a rank goes on (its backward passes are collectives)
                if share is not None:  # grad_sync mini_batch: only the last backward reduce-scatters
                    share.sync_grads(model, last=i == len(plan) - 1)
                if real:
                    backward(out.loss, mb.sgt_term, no_sgt)
                else:
                    (out.loss * 0.0).backward()
                if real and ok:
                    diag.micro_batch(mb, out, losses)
        if share is not None:  # the global loss terms and gradient norm; a non-finite loss anywhere aborts everywhere
            losses, finite, total_norm = share.totals(losses, finite, share.grad_sq(params) if sharded and finite else 0.0)
            if finite and share.replicated:  # replicas: the gradient summed over the ranks
                share.reduce_grads(params)
        grad_norm = None
        if finite:
            max_norm = grad_clip if grad_clip is not None else math.inf
            grad_norm = (share.clip(params, max_norm, total_norm) if sharded
                         else torch.nn.utils.clip_grad_norm_(params, max_norm))
        if grad_norm is None or not torch.isfinite(grad_norm):  # the one abort path: no step for this and the rest
            optimizer.zero_grad(set_to_none=True)
            res.nan_skipped = True
            res.metrics = {"nan_skipped": 1.0}
            return res
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        res.optimizer_steps += 1
        diag.add("grad_norm", float(grad_norm), 1.0)
        for k, v in losses.items():
            diag.add(k, v, 1.0)
    if share is not None:  # the batch's diagnostics, not this rank's rows'
        diag.reduce(share.group)
    res.metrics = diag.metrics(tracks_ref=ref_model is not None)
    res.metrics["padding_waste"] = res.padded_tokens / res.seq_tokens if res.seq_tokens else float("nan")
    return res


def _gathered(share: RankShare | None, *models: torch.nn.Module | None) -> AbstractContextManager:
    """The worker group's :meth:`~mrl_llm.parallel.share.RankShare.gathered` over ``models``; nothing for one process."""
    return nullcontext() if share is None else share.gathered(*models)
