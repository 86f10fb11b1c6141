"""A learner's training batch: the core's rows turned into token sequences, and their tensors.

:func:`build_batch` takes the rows of :func:`shared_interfaces.regimes.rows.learner_rows` and gives each
row a ``prompt + response`` in the *learner's* tokenizer:

* an own row: the learner's prompt ids (as sampled) and the record's token ids; ``mu`` = its
  recorded behaviour log-probs (used only for the engine/trainer drift metric: its correction is 1);
* a peer row (PRP ``snapshot`` / ``thl``, or an SGT-only target): the peer trace aligned by THL
  (``align(record)``: the learner's prompt ids and the response re-encoded after them, and the
  aligned log-probs, which are ``mu`` for ``thl`` rows).

A response longer than the model's context (``max_len - prompt length``) is cut to fit and counted in
``truncated_rows``. Nothing here decides a weight: advantages, weights, roles and caps are the rows'.

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
from shared_interfaces.regimes.rows import TrainRow


@dataclass
class TrainBatch:
    """Rows as token sequences plus their per-row roles (float64 advantages and weights, as the core
    computed them)."""

    rows: list[TrainRow]
    prompts: list[list[int]]
    responses: list[list[int]]
    mu: list[list[float]]
    advantages: torch.Tensor  # [N] float64
    weights: torch.Tensor  # [N] float64
    in_pg: torch.Tensor  # [N] bool
    sgt: torch.Tensor  # [N] bool
    use_mu: torch.Tensor  # [N] bool: behaviour == "thl"
    own: torch.Tensor  # [N] bool
    sgt_weight: float
    ratio_cap: float
    residuals: list[Any] = field(default_factory=list)  # THL residuals of the peer rows
    truncated_rows: int = 0
    sgt_pool: torch.Tensor | None = None  # [N] int64: each row's rescued prompt, SGT's normalize: prompt
    sgt_scale: torch.Tensor | None = None  # [N] float64: the core's per-row SGT scale (None: normalize: batch)

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def lengths(self) -> list[int]:
        return [len(r) for r in self.responses]

    def norm(self, idx: Sequence[int]) -> LossNorm:
        """The :class:`LossNorm` of the rows ``idx`` (one optimizer update's mini-batch)."""
        pg_tok = sum(len(self.responses[i]) for i in idx if self.in_pg[i])
        pg_rows = sum(1 for i in idx if self.in_pg[i] and self.responses[i])
        sgt_tok = sum(len(self.responses[i]) for i in idx if self.sgt[i])
        kl_tok = sum(len(self.responses[i]) for i in idx if self.in_pg[i] and self.own[i])
        kl_rows = sum(1 for i in idx if self.in_pg[i] and self.own[i] and self.responses[i])
        return LossNorm(pg_tokens=float(pg_tok), pg_rows=float(pg_rows), sgt_tokens=float(sgt_tok),
                        kl_tokens=float(kl_tok), kl_rows=float(kl_rows))


def build_batch(
    rows: Sequence[TrainRow],
    *,
    learner: str,
    prompt_ids: Callable[[str], list[int]],
    align: Callable[[ExperienceRecord], tuple[list[int], list[int], list[float], Any]],
    max_len: int,
) -> TrainBatch:
    """Token sequences for ``rows`` (module docstring). ``prompt_ids(prompt_id)`` gives the learner's
    prompt; ``align(record)`` a peer record's ``(prompt ids, response ids, logprobs, residual)`` in the
    learner's tokenizer."""
    prompts, responses, mus, residuals = [], [], [], []
    truncated = 0
    for row in rows:
        rec = row.record
        if rec.policy_id == learner:
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
    f64 = torch.float64
    sgt = torch.tensor([r.sgt for r in rows], dtype=torch.bool)
    sgt_pool = sgt_scale = None
    if any(r.sgt and r.sgt_normalize == "prompt" for r in rows):  # pools: the rows' prompts
        pools: dict[tuple[int, str], int] = {}
        sgt_pool = torch.tensor([pools.setdefault((r.record.step, r.record.prompt_id), len(pools)) for r in rows])
        sgt_scale = sgt_row_scale(sgt, torch.tensor([len(ids) for ids in responses]), sgt_pool)
    return TrainBatch(
        rows=list(rows),
        prompts=prompts,
        responses=responses,
        mu=mus,
        advantages=torch.tensor([r.advantage for r in rows], dtype=f64),
        weights=torch.tensor([r.weight for r in rows], dtype=f64),
        in_pg=torch.tensor([r.in_pg for r in rows], dtype=torch.bool),
        sgt=sgt,
        use_mu=torch.tensor([r.behaviour == "thl" for r in rows], dtype=torch.bool),
        own=torch.tensor([r.record.policy_id == learner for r in rows], dtype=torch.bool),
        sgt_weight=max((r.sgt_weight for r in rows), default=0.0),
        ratio_cap=max((r.ratio_cap for r in rows), default=1.0),
        residuals=residuals,
        truncated_rows=truncated,
        sgt_pool=sgt_pool,
        sgt_scale=sgt_scale,
    )


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


def thl_metrics(residuals: Sequence[Any]) -> dict[str, float]:
    """The step's THL residual over the peer records aligned into this policy's tokens
    (:class:`mrl_llm.thl.Residual`): ``thl_residual`` = mean mass moved between words per record,
    ``thl_unaligned_mass`` = mean ``|unaligned mass|``, ``thl_word_mass_error`` = the largest word's
    error, ``thl_boundary_conflicts`` = their count (0 / absent when no peer record was aligned)."""
    if not residuals:
        return {"thl_residual": 0.0, "thl_records": 0.0}
    return {
        "thl_records": float(len(residuals)),
        "thl_residual": float(np.mean([r.moved_mass for r in residuals])),
        "thl_unaligned_mass": float(np.mean([abs(r.unaligned_mass) for r in residuals])),
        "thl_word_mass_error": float(max(r.word_mass_error for r in residuals)),
        "thl_boundary_conflicts": float(sum(r.n_boundary_conflicts for r in residuals)),
    }
