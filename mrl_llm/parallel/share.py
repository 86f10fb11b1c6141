"""This rank's share of an update: the hook :func:`mrl_llm.update.run_update` takes as ``share``.

For each optimizer mini-batch (the same global rows on every rank, each rank holding the whole batch):

* :meth:`RankShare.rows`: this rank's rows, :func:`~mrl_llm.parallel.split.split_by_tokens` of the mini-batch;
* :meth:`RankShare.plan` (one collective): the mini-batch's :class:`LossNorm` from the *global* counts — each
  rank counts its own rows and the counts are all-reduced (summed); every loss term divides by these, so the
  ranks' losses sum to the one-process loss and FSDP's summed gradient (:mod:`mrl_llm.parallel.fsdp`) is its
  gradient — and its micro-batches: every rank runs the same number of forward/backward passes (each is a
  collective under FSDP), a rank with fewer pads with *fillers* (a real row whose loss is multiplied by 0: no
  gradient, no diagnostics);
* :meth:`RankShare.totals` (one collective, after the backward passes): the mini-batch's loss terms summed over
  the ranks (the logged loss is the global one), whether every rank's losses were finite — a non-finite loss
  on any rank aborts the mini-batch on every rank (a rank with a non-finite loss still runs its remaining
  backward passes, collectives under FSDP; the gradients are dropped) — and the global gradient norm
  ``||g|| = sqrt(sum_r ||g_r||^2)`` over the ranks' gradient shards ``g_r`` (:meth:`RankShare.grad_sq`);
* :meth:`RankShare.reduce_grads` (replicas, ``train.fsdp_unit: none``; one collective after :meth:`totals`): every
  rank holds the whole model and its gradient of its rows; the sum over the ranks (one fp32 all-reduce of the
  flattened gradients) is the one-process gradient, which torch's own clipping then scales on every rank alike;
* :meth:`RankShare.gathered` and :meth:`RankShare.sync_grads` (FSDP2 shards with ``train.grad_sync: mini_batch``):
  the mini-batch's units stay gathered from their first all-gather to its end, and only its last backward
  reduce-scatters — the earlier ones accumulate the gradients unsharded, in fp32 (:func:`mrl_llm.parallel.fsdp.gathered`,
  :func:`~mrl_llm.parallel.fsdp.sync_grads`); every rank runs as many backward passes (fillers), so the ranks'
  last ones meet;
* :meth:`RankShare.clip` (FSDP2 shards): ``torch.nn.utils.clip_grad_norm_``'s scaling with that norm, ``g_r <- g_r * min(1,
  max_norm / (||g|| + 1e-6))`` on each rank's shards (no collective; torch's own over FSDP2's DTensor gradients
  all-reduces again and pays DTensor dispatch per tensor).

The counts, the micro-batch counts, the finite flags and the squared gradient norms ride on the fp64 sum of
:meth:`WorkerGroup.sum` (counts are integers far below 2**53; each rank's micro-batch count sits in its own slot,
the largest is read off), so a mini-batch costs two small collectives besides FSDP's, not one per micro-batch.

A group of one gives the one-process update exactly (its share is every row, its counts its own).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from contextlib import ExitStack
from typing import TYPE_CHECKING

import torch
from torch.distributed.tensor import DTensor

from mrl_llm.parallel.fsdp import gathered, sync_grads
from mrl_llm.parallel.group import WorkerGroup
from mrl_llm.parallel.split import split_by_tokens
from shared_interfaces.losses import LossNorm

if TYPE_CHECKING:
    from mrl_llm.batch import TrainBatch


GRAD_SYNCS = ("micro_batch", "mini_batch")


class RankShare:
    """This rank's share of each mini-batch over ``group`` (module docstring)."""

    def __init__(self, group: WorkerGroup, *, replicated: bool = False, grad_sync: str = "micro_batch") -> None:
        if grad_sync not in GRAD_SYNCS:
            raise ValueError(f"grad_sync {grad_sync!r} is not one of {GRAD_SYNCS}")
        self.group = group
        self.replicated = replicated and group.sharded  # every rank holds the whole model (train.fsdp_unit: none)
        self.grad_sync = grad_sync

    @property
    def fsdp(self) -> bool:
        """Whether the ranks hold FSDP2 shards (k > 1, not replicated)."""
        return self.group.sharded and not self.replicated

    @property
    def accumulates(self) -> bool:
        """Whether a mini-batch's FSDP2 units stay gathered and its gradients accumulate unsharded
        (``grad_sync: mini_batch`` over shards)."""
        return self.fsdp and self.grad_sync == "mini_batch"

    def gathered(self, *models: torch.nn.Module | None) -> ExitStack:
        """``grad_sync: mini_batch``: the block keeps ``models``' FSDP2 units gathered from their first all-gather
        to its end, when they reshard (:func:`mrl_llm.parallel.fsdp.gathered`); else nothing."""
        stack = ExitStack()
        for m in models if self.accumulates else ():
            if m is not None:
                stack.enter_context(gathered(m))
        return stack

    def sync_grads(self, model: torch.nn.Module, *, last: bool) -> None:
        """``grad_sync: mini_batch``: the next backward reduce-scatters only when it is the mini-batch's ``last``
        (the others accumulate the gradients unsharded, in fp32); else every backward does (nothing to set)."""
        if self.accumulates:
            sync_grads(model, last)

    def reduce_grads(self, params: Iterable[torch.Tensor]) -> None:
        """Replicas: every rank's gradients summed over the ranks, in place, in one fp32 all-reduce of the
        flattened gradients (a parameter without one takes zeros, so that every rank's buffer lines up)."""
        grads = []
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            grads.append(p.grad)
        if not grads or not self.group.sharded:
            return
        flat = torch.cat([g.reshape(-1).to(torch.float32) for g in grads])
        self.group.sum_(flat)
        offset = 0
        for g in grads:
            g.copy_(flat[offset: offset + g.numel()].view_as(g))
            offset += g.numel()

    def rows(self, rows: Sequence[int], seq_lens: Sequence[int]) -> list[int]:
        return split_by_tokens(list(rows), list(seq_lens), self.group.world_size)[self.group.rank]

    def plan(self, batch: TrainBatch, local: Sequence[int], groups: list[list[int]],
             filler: list[int]) -> tuple[LossNorm, list[tuple[list[int], bool]]]:
        """The mini-batch's global :class:`LossNorm` and this rank's ``(rows, real)`` micro-batches: ``groups``
        (of ``local``, its share) then fillers up to the largest count over the ranks. One collective."""
        n = batch.norm(local)
        k = self.group.world_size
        counts = [0.0] * k
        counts[self.group.rank] = float(len(groups))
        got = self.group.sum([n.pg_tokens, n.pg_rows, n.sgt_tokens, n.kl_tokens or 0.0, n.kl_rows or 0.0, *counts])
        pg_tok, pg_rows, sgt_tok, kl_tok, kl_rows = got[:5]
        most = int(max(got[5:]))
        norm = LossNorm(pg_tokens=pg_tok, pg_rows=pg_rows, sgt_tokens=sgt_tok, kl_tokens=kl_tok, kl_rows=kl_rows)
        return norm, [(g, True) for g in groups] + [(list(filler), False)] * (most - len(groups))

    def totals(self, losses: dict[str, float], finite: bool,
               grad_sq: float = 0.0) -> tuple[dict[str, float], bool, float]:
        """``losses`` summed over the ranks, whether ``finite`` holds on every rank, and the global gradient norm
        ``sqrt(sum_r grad_sq_r)`` (``grad_sq``: this rank's :meth:`grad_sq`). One collective."""
        keys = sorted(losses)
        got = self.group.sum([losses[k] for k in keys] + [0.0 if finite else 1.0, grad_sq])
        return dict(zip(keys, got[:-2], strict=True)), got[-2] == 0.0, math.sqrt(got[-1])

    @staticmethod
    def grad_sq(params: Iterable[torch.Tensor]) -> float:
        """``||g_r||^2``: the squared L2 norm of this rank's gradients (its shards of FSDP2's DTensor gradients);
        0.0 when none has a gradient."""
        grads = _local_grads(params)
        if not grads:
            return 0.0
        return float(torch.stack(torch._foreach_norm(grads)).double().square().sum())

    @staticmethod
    def clip(params: Iterable[torch.Tensor], max_norm: float, total_norm: float) -> torch.Tensor:
        """Scale this rank's gradient shards by ``min(1, max_norm / (total_norm + 1e-6))`` as
        ``torch.nn.utils.clip_grad_norm_`` does, given the global ``total_norm`` (:meth:`totals`); returns it
        as a tensor (NaN or inf: nothing scaled, the caller's abort path)."""
        total = torch.tensor(total_norm, dtype=torch.float32)
        coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        grads = _local_grads(params)
        if grads and bool(coef < 1.0):
            torch._foreach_mul_(grads, coef.to(grads[0].device))
        return total


def _local_grads(params: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    """The gradients of ``params`` that exist, as this rank's local tensors (views: scaling them scales the grads)."""
    return [g.to_local() if isinstance(g, DTensor) else g for p in params if (g := p.grad) is not None]
