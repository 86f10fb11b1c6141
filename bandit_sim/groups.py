"""The learn step's rows: regimes whose learners have as many rows, stacked for one call of the core's loss.

Each regime's plan (the core's :class:`~shared_interfaces.regimes.rows.LearnerRows`, from
:func:`bandit_sim.batching.plan_batch`) gives every learner N rows (own samples, then peers' when used). The core's ``regime_loss`` is vectorised over leading dims and every aggregate
is per (regime, seed, learner), so regimes with the same N go through ONE call on ``[R_g, S, P, N,
T = 1]`` (:class:`RowGroup`, built by :func:`group_rows`). That call gives every row the same gradient
as the regime's own call, bit for bit: a regime without behaviour correction gets coefficient 1
(``x * 1 = x``), and one without SGT targets this step adds ``-lambda * 0`` to its rows' gradients
(``g + (-0) = g``). Only regimes whose SGT targets have different weights or different ``normalize``
rules are kept apart; a ``prompt`` group carries the core's per-row SGT scale (:func:`sgt_row_scale`; one
token per row, pooled by prompt). The engine fills in where each row's log-prob sits and its behaviour
denominators (:meth:`Engine._locate`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from bandit_sim.batching import behaviour_coef
from shared_interfaces.losses import sgt_row_scale
from shared_interfaces.regimes.rows import LearnerRows


@dataclass
class RowGroup:
    """Regimes ``ks`` (positions in the step's regime list, their rows ``rows``) with N rows per learner,
    stacked ``[R_g, S, P, N]``: advantages, sample weights, masks as floats ``[..., N, 1]``, the SGT
    weight. The engine adds ``gidx [R_g, S, P * N]`` (each row's index in the step's flat batch
    log-softmax ``[R', S, B, P, K]``), the behaviour log-prob ``src_logp`` of each row's sample, the PRP
    peer denominator ``mu`` (None when no regime of the group trains on peer samples) and reference
    log-probs ``ref [..., N, 1]`` (KL); epoch 0 the snapshot log-probs ``old`` and behaviour coefficients
    ``coef [..., N, 1]`` (None when no regime of the group has a ``thl`` denominator)."""

    ks: list[int]
    rows: list[LearnerRows]
    advantages: torch.Tensor
    sample_weight: torch.Tensor
    pg_mask: torch.Tensor
    sgt_mask: torch.Tensor
    sgt_weight: float
    sgt_scale: torch.Tensor | None = None
    gidx: torch.Tensor | None = None
    src_logp: torch.Tensor | None = None
    mu: torch.Tensor | None = None
    ref: torch.Tensor | None = None
    old: torch.Tensor | None = None
    coef: torch.Tensor | None = None

    @property
    def src(self) -> torch.Tensor:
        """``[P, N]``: each row's sample ``(b, j, g)`` as a flat index (the same for every regime of the group)."""
        return self.rows[0].src

    def snapshot(self, old: torch.Tensor) -> None:
        """Epoch 0: record ``old [R_g, S, P, N]`` and the behaviour coefficients (the core's correction on
        ``thl`` peer rows, exactly 1 elsewhere)."""
        self.old = old
        if any(r.denominator == "thl" for r in self.rows):
            self.coef = torch.stack([
                behaviour_coef(r, o, mu) if r.denominator == "thl" else torch.ones_like(o)
                for r, o, mu in zip(self.rows, old, self.mu, strict=True)
            ]).unsqueeze(-1)


SGTKey = tuple[float, str]  # (lambda, normalize)


def sgt_weight_needed(rows: LearnerRows) -> SGTKey | None:
    """The weight and ``normalize`` rule the regime's SGT term needs this step; None when it has no target
    (any will do)."""
    if rows.sgt_weight > 0 and bool(rows.sgt_mask.any()):
        return (rows.sgt_weight, rows.sgt_normalize)
    return None


def partition(ks: list[int], n_rows: list[int], weights: list[SGTKey | None]) -> list[tuple[SGTKey, list[int]]]:
    """Regimes ``ks`` -> groups ``((sgt_weight, normalize), members)``: same number of rows, and SGT targets
    (if any) of one weight and rule; a regime without SGT targets this step (None) joins any group of its
    size."""
    by_n: dict[int, list[int]] = {}
    for k, n in zip(ks, n_rows, strict=True):
        by_n.setdefault(n, []).append(k)
    w_of = dict(zip(ks, weights, strict=True))
    parts: list[tuple[SGTKey, list[int]]] = []
    for members in by_n.values():
        weighted: dict[SGTKey, list[int]] = {}
        free = []
        for k in members:
            w = w_of[k]
            (free if w is None else weighted.setdefault(w, [])).append(k)
        split = list(weighted.items()) or [((0.0, "batch"), [])]
        split[0] = (split[0][0], sorted(split[0][1] + free))
        parts += split
    return parts


def group_rows(rows: dict[int, LearnerRows], dtype: torch.dtype) -> list[RowGroup]:
    """Stack the rows of regimes ``k`` (the dict's keys) by :func:`partition` (see the module docstring);
    SGT's ``prompt`` pools are the rows' prompts."""
    ks = sorted(rows)
    parts = partition(ks, [len(rows[k]) for k in ks], [sgt_weight_needed(rows[k]) for k in ks])
    groups = []
    for (w, normalize), members in parts:
        bs = [rows[k] for k in members]
        sgt_mask = _stack([b.sgt_mask for b in bs], dtype)
        scale = None
        if normalize == "prompt":  # one token per row, pooled by prompt
            scale = sgt_row_scale(sgt_mask > 0, torch.ones((), dtype=torch.float64),
                                  bs[0].prompt).to(dtype)
        groups.append(RowGroup(
            ks=members,
            rows=bs,
            advantages=_stack([b.advantages for b in bs], dtype),
            sample_weight=_stack([b.sample_weight for b in bs], dtype),
            pg_mask=_stack([b.pg_mask for b in bs], dtype).unsqueeze(-1),
            sgt_mask=sgt_mask.unsqueeze(-1),
            sgt_weight=w,
            sgt_scale=scale,
        ))
    return groups


def _stack(xs: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    """Stack ``[S, P, N]`` fields as ``dtype``; fields that are all broadcast over the seeds (a plan
    table's outcome-independent rows) stay a broadcast view ``[R_g, S, P, N]``."""
    if all(x.stride(0) == 0 for x in xs):
        return torch.stack([x[0] for x in xs]).to(dtype).unsqueeze(1).expand((len(xs),) + tuple(xs[0].shape))
    return torch.stack(xs).to(dtype)
