"""A learner's rows as token sequences: the tokenised hop between the core's rows and the packed tensors.

:func:`build_batch` takes a learner's :class:`~shared_interfaces.regimes.rows.LearnerRows` (the core's rows
with their records) and gives each row a ``prompt + response`` in the *learner's* tokenizer:

* an own row: the learner's prompt ids (as sampled) and the record's token ids; ``mu`` = its
  recorded behaviour log-probs (used only for the engine/trainer drift metric: its correction is 1);
* a peer row (PRP ``snapshot`` / ``thl``, or an SGT-only target): the peer trace aligned by THL
  (``align(record)``: the learner's prompt ids and the response re-encoded after them, and the
  aligned log-probs, which are ``mu`` for ``use_mu`` rows).

A response longer than the model's context (``max_len - prompt length``) is cut to fit and counted in
``truncated_rows``. Nothing here decides a weight: advantages, weights, masks and the regime's scalars
stay the rows' (``batch.rows``), under the rows' names; :mod:`mrl_llm.update` packs micro-batches of them.

Tensors are in the *response layout* ``[rows, T]``: token ``t`` of a row's response at column ``t``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from mrl_llm.logprobs import PackedBatch
from shared_interfaces.losses import LossNorm, sgt_row_scale
from shared_interfaces.records import ExperienceRecord
from shared_interfaces.regimes.rows import LearnerRows


@dataclass
class TrainBatch:
    """A learner's rows (``rows``, the core's, unchanged) with each row's token sequences: ``prompts``,
    ``responses`` and behaviour log-probs ``mu`` in the learner's tokenizer, ``lengths [N]`` (response
    tokens), the THL residuals of the peer rows, and ``sgt_scale [N]`` (the core's per-row SGT scale under
    ``normalize: prompt``; None under ``batch``)."""

    rows: LearnerRows
    prompts: list[list[int]]
    responses: list[list[int]]
    mu: list[list[float]]
    lengths: torch.Tensor
    residuals: list[Any] = field(default_factory=list)
    truncated_rows: int = 0
    sgt_scale: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self.rows)

    def norm(self, idx: Sequence[int]) -> LossNorm:
        """The :class:`LossNorm` of the rows ``idx`` (one optimizer update's mini-batch)."""
        i = torch.as_tensor(list(idx), dtype=torch.long)
        r, n = self.rows, self.lengths[i]
        pg, own = r.pg_mask[i], r.own_mask[i]
        tokens = lambda m: float(n[m].sum())  # noqa: E731
        return LossNorm(pg_tokens=tokens(pg), pg_rows=float((pg & (n > 0)).sum()), sgt_tokens=tokens(r.sgt_mask[i]),
                        kl_tokens=tokens(pg & own), kl_rows=float((pg & own & (n > 0)).sum()))


def build_batch(
    rows: LearnerRows,
    *,
    prompt_ids: Callable[[str], list[int]],
    align: Callable[[ExperienceRecord], tuple[list[int], list[int], list[float], Any]],
    max_len: int,
) -> TrainBatch:
    """Token sequences for ``rows`` (module docstring). ``prompt_ids(prompt_id)`` gives the learner's
    prompt; ``align(record)`` a peer record's ``(prompt ids, response ids, logprobs, residual)`` in the
    learner's tokenizer."""
    prompts, responses, mus, residuals = [], [], [], []
    truncated = 0
    for rec, own in zip(rows.row_records(), rows.own_mask.tolist(), strict=True):
        if own:
            p = list(prompt_ids(rec.prompt_id))
            ids, lps = list(rec.token_ids), list(rec.token_logprobs)
        else:
            p, ids, lps, residual = align(rec)
            p, ids, lps = list(p), list(ids), list(lps)
            residuals.append(residual)
        room = max(0, max_len - len(p))
        if len(ids) > room:
            ids, lps = ids[:room], lps[:room]
            truncated += 1
        prompts.append(p)
        responses.append(ids)
        mus.append(lps)
    lengths = torch.tensor([len(ids) for ids in responses], dtype=torch.long)
    sgt_scale = None
    if rows.sgt_normalize == "prompt" and bool(rows.sgt_mask.any()):  # pools: the rows' prompts
        sgt_scale = sgt_row_scale(rows.sgt_mask, lengths, rows.prompt)
    return TrainBatch(rows=rows, prompts=prompts, responses=responses, mu=mus, lengths=lengths,
                      residuals=residuals, truncated_rows=truncated, sgt_scale=sgt_scale)


def response_layout(x: torch.Tensor, packed: PackedBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [b, L - 1]`` (shifted log-prob layout of :func:`mrl_llm.logprobs.pack`) -> ``([b, T], mask [b, T])``
    with each row's response tokens at columns ``0 .. len - 1`` (T = longest response, at least 1)."""
    lens = torch.tensor(packed.response_lens, dtype=torch.long)
    starts = torch.tensor(packed.prompt_lens, dtype=torch.long) - 1
    T = max(1, int(lens.max()) if lens.numel() else 1)
    cols = torch.arange(T)
    mask = cols[None, :] < lens[:, None]
    idx = (starts[:, None] + cols[None, :]).clamp(max=x.shape[1] - 1).to(x.device)
    out = x.gather(1, idx)
    return out * mask.to(out.device, out.dtype) if out.is_floating_point() else out, mask.to(x.device)


def pad_rows(values: Sequence[Sequence[float]], T: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Ragged per-row values -> ``[len(values), T]`` (zeros past each row's end)."""
    rows = [list(v[:T]) + [0] * (T - min(len(v), T)) for v in values]  # one tensor call, not one a row
    return torch.tensor(rows, dtype=dtype).reshape(len(values), T)


def pad_tensors(values: Sequence[torch.Tensor], T: int) -> torch.Tensor:
    """Ragged 1-d tensors -> ``[len(values), T]`` (zeros past each row's end; cut at ``T``), their dtype."""
    out = torch.zeros(len(values), T, dtype=values[0].dtype if values else torch.float32)
    for k, v in enumerate(values):
        out[k, : min(len(v), T)] = v[:T]
    return out


def thl_metrics(residuals: Sequence[Any]) -> dict[str, float]:
    """The step's THL residual over the peer records aligned into this policy's tokens
    (:class:`mrl_llm.thl.Residual`): ``thl_residual`` = mean mass moved between words per record,
    ``thl_unaligned_mass`` = mean ``|unaligned mass|``, ``thl_word_mass_error`` = the largest word's
    error, ``thl_boundary_conflicts`` = their count, ``thl_oov_tokens`` = peer ids beyond the peer's tokenizer
    (a padded model's extra rows) dropped with their mass unaligned (0 / absent when no peer record was aligned)."""
    if not residuals:
        return {"thl_residual": 0.0, "thl_records": 0.0}
    return {
        "thl_records": float(len(residuals)),
        "thl_residual": float(np.mean([r.moved_mass for r in residuals])),
        "thl_unaligned_mass": float(np.mean([abs(r.unaligned_mass) for r in residuals])),
        "thl_word_mass_error": float(max(r.word_mass_error for r in residuals)),
        "thl_boundary_conflicts": float(sum(r.n_boundary_conflicts for r in residuals)),
        "thl_oov_tokens": float(sum(r.n_oov_tokens for r in residuals)),
    }
