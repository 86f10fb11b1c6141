"""This rank's share of an update: the hook :func:`mrl_llm.update.run_update` takes as ``share``.

For each optimizer mini-batch (the same global rows on every rank, each rank holding the whole batch):

* :meth:`RankShare.rows`: this rank's rows, :func:`~mrl_llm.parallel.split.split_by_tokens` of the mini-batch;
* :meth:`RankShare.norm`: the mini-batch's :class:`LossNorm` from the *global* counts — each rank counts its
  own rows and the counts are all-reduced (summed). Every loss term divides by these, so the ranks' losses sum
  to the one-process loss and FSDP's summed gradient (:mod:`mrl_llm.parallel.fsdp`) is its gradient;
* :meth:`RankShare.micro_batches`: every rank runs the same number of forward/backward passes (each is a
  collective under FSDP): a rank with fewer micro-batches pads with *fillers* (a real row whose loss is
  multiplied by 0: no gradient, no diagnostics);
* :meth:`RankShare.all_finite`: a non-finite loss on any rank aborts the mini-batch on every rank;
* :meth:`RankShare.sum`: the mini-batch's loss terms summed over the ranks (the logged loss is the global one).

A group of one gives the one-process update exactly (its share is every row, its counts its own).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from mrl_llm.parallel.group import WorkerGroup
from mrl_llm.parallel.split import split_by_tokens
from shared_interfaces.losses import LossNorm

if TYPE_CHECKING:
    from mrl_llm.batch import TrainBatch


class RankShare:
    """This rank's share of each mini-batch over ``group`` (module docstring)."""

    def __init__(self, group: WorkerGroup) -> None:
        self.group = group

    def rows(self, rows: Sequence[int], seq_lens: Sequence[int]) -> list[int]:
        return split_by_tokens(list(rows), list(seq_lens), self.group.world_size)[self.group.rank]

    def norm(self, batch: TrainBatch, local: Sequence[int]) -> LossNorm:
        n = batch.norm(local)
        pg_tok, pg_rows, sgt_tok, kl_tok, kl_rows = self.group.sum(
            [n.pg_tokens, n.pg_rows, n.sgt_tokens, n.kl_tokens or 0.0, n.kl_rows or 0.0])
        return LossNorm(pg_tokens=pg_tok, pg_rows=pg_rows, sgt_tokens=sgt_tok, kl_tokens=kl_tok, kl_rows=kl_rows)

    def micro_batches(self, groups: list[list[int]], filler: list[int]) -> list[tuple[list[int], bool]]:
        """``(rows, real)`` pairs: ``groups`` then fillers up to the largest count over the ranks."""
        n = self.group.max_int(len(groups))
        return [(g, True) for g in groups] + [(list(filler), False)] * (n - len(groups))

    def all_finite(self, ok: bool) -> bool:
        return self.group.all_true(ok)

    def sum(self, values: dict[str, float]) -> dict[str, float]:
        keys = sorted(values)
        return dict(zip(keys, self.group.sum([values[k] for k in keys]), strict=True))
