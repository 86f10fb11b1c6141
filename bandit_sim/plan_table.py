"""The core's plan memoised over binary outcomes: :func:`plan_batch` once on every 0/1 reward pattern of a
prompt, then a step's plan is a table lookup.

In the bandit every reward is 0 or 1 and verified, every response one token long, no sample masked. A
regime's decisions for a prompt (:func:`shared_interfaces.regimes.regime_plan`: advantages, masks,
weights, SGT gate and targets) are then a function of the prompt's ``P * G`` reward bits alone — unless
SGT selects at random, whose draws come from a generator (no table then). :class:`PlanTable` runs
:func:`bandit_sim.batching.plan_batch` (hence the core's ``regime_plan``) ONCE on all ``2^(P G)``
patterns, one prompt each, and :meth:`PlanTable.batch` assembles a step's
:class:`~shared_interfaces.regimes.rows.LearnerRows` from it:
a pattern id per prompt, one gather per field, and ``plan_batch``'s row order (every prompt's own rows
first, then the peers' rows). A field that is the same for every pattern (e.g. the masks and weights
of every regime but SGT) is stored once and broadcast over the seeds (a view). No regime decision is
made here; the result equals ``plan_batch`` on the step's rewards exactly
(``tests/bandit/test_plan_table.py``), because the core's plan of a prompt does not depend on the other
prompts in the call.
"""

from __future__ import annotations

import numpy as np
import torch

from bandit_sim.batching import plan_batch, row_layout
from shared_interfaces.regimes import LearnerRows, RegimeSpec

#: the largest ``P * G`` tabulated (2^16 patterns: a few MB per regime)
MAX_BITS = 16

ROW_FIELDS = ("advantages", "sample_weight", "pg_mask", "sgt_mask", "use_mu")


def tabulable(spec: RegimeSpec, P: int, G: int) -> bool:
    """Whether ``spec``'s plan of a prompt is a function of its ``P * G`` reward bits that fits a table."""
    return P * G <= MAX_BITS and not spec.random_plan


class PlanTable:
    """``spec``'s plan for every reward pattern of one prompt with ``P`` policies x ``G`` samples; the
    pattern id of rewards ``r[j, g]`` is ``sum_k r_k 2^k`` over the flat index ``k = j * G + g``."""

    def __init__(self, spec: RegimeSpec, P: int, G: int, dtype: np.dtype | type = np.float32):
        if not tabulable(spec, P, G):
            raise ValueError(f"regime {spec.name} with P * G = {P * G} cannot be tabulated (random SGT "
                             f"selection, or more than {MAX_BITS} reward bits); use plan_batch")
        self.P, self.G, n = P, G, P * G
        bits = (np.arange(2**n)[:, None] >> np.arange(n)) & 1  # [2^n, P * G]
        b = plan_batch(spec, bits.reshape(-1, 1, P, G).astype(np.float64), dtype=dtype)  # B = 1 per pattern
        self.M = b.src.shape[-1]  # rows per learner and prompt: G own (+ (P - 1) G peer when used at all)
        self.pow2 = 2.0 ** torch.arange(n, dtype=torch.float64)
        # per field [2^n, P, M], or [P, M] when every pattern has the same rows
        self.fields = {f: self._compress(getattr(b, f)) for f in ROW_FIELDS}
        self.peer_used = ((b.pg_mask | b.sgt_mask) & ~b.own_mask).flatten(1).any(-1)  # [2^n]
        self._peer_used_np = self.peer_used.numpy()
        self.gate = self._compress(b.sgt_gate[..., 0])  # [2^n, P] or [P]
        self.sgt_weight, self.ratio_cap, self.denominator = b.sgt_weight, b.ratio_cap, b.denominator
        self.sgt_normalize = b.sgt_normalize
        self._layouts: dict[tuple[int, bool], tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        self._tiled: dict[tuple[str, int, bool], torch.Tensor] = {}

    @staticmethod
    def _compress(x: torch.Tensor) -> torch.Tensor:
        return x[0].clone() if bool((x == x[:1]).all()) else x

    def _layout(self, B: int, peers: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``src``, ``prompt`` and ``own_mask`` ``[P, N]`` of ``B`` prompts' rows (as :func:`plan_batch`)."""
        if (B, peers) not in self._layouts:
            src = row_layout(B, self.P, self.G)
            src = src[:, : src.shape[1] if peers else B * self.G]
            own = src // self.G % self.P == np.arange(self.P)[:, None]
            self._layouts[B, peers] = (torch.from_numpy(src), torch.from_numpy(src // (self.P * self.G)),
                                       torch.from_numpy(own))
        return self._layouts[B, peers]

    def _order(self, x: torch.Tensor, B: int, m: int) -> torch.Tensor:
        """Per-prompt rows ``x [..., B, P, M]`` -> ``[..., P, B * m]`` in plan_batch's order: (b, g) own,
        then (b, j, g) peers (when ``m > G``)."""
        G = self.G
        x = x.transpose(-3, -2)  # [..., P, B, M]
        out = torch.empty(x.shape[:-2] + (B * m,), dtype=x.dtype)
        out[..., : B * G].view(x.shape[:-1] + (G,)).copy_(x[..., :G])
        if m > G:
            out[..., B * G :].view(x.shape[:-1] + (m - G,)).copy_(x[..., G:m])
        return out

    def pattern_ids(self, rewards: torch.Tensor) -> torch.Tensor:
        """``rewards [..., P, G]`` (exactly 0 or 1) -> pattern ids ``[...]`` (int64). Exact: a sum of distinct
        powers of two below 2^16, in float32 or float64."""
        r = rewards.reshape(-1, self.P * self.G)
        return (r @ self.pow2.to(r.dtype)).long().view(rewards.shape[:-2])

    def batch(self, rewards: torch.Tensor, pattern_id: torch.Tensor | None = None) -> LearnerRows:
        """The learners' rows of rollouts ``rewards [S, B, P, G]`` (exactly 0 or 1), as :func:`plan_batch`;
        fields that do not depend on the outcome are views broadcast over the seeds. ``pattern_id``: the
        rollouts' :meth:`pattern_ids`, if at hand."""
        S, B, P, G = rewards.shape
        pattern = (self.pattern_ids(rewards) if pattern_id is None else pattern_id).reshape(S * B)
        peers = self.M > G and bool(self._peer_used_np[pattern.numpy()].any())
        m = self.M if peers else G
        rows = {}
        for f, t in self.fields.items():
            if t.dim() == 2:  # the same rows for every prompt: tile once per (B, peers), view over the seeds
                if (f, B, peers) not in self._tiled:
                    self._tiled[f, B, peers] = self._order(t.expand(B, P, self.M), B, m)
                rows[f] = self._tiled[f, B, peers].expand(S, P, B * m)
            else:
                rows[f] = self._order(t.index_select(0, pattern).view(S, B, P, self.M), B, m)
        if self.gate.dim() == 1:
            gate = self.gate.view(1, P, 1).expand(S, P, B)
        else:
            gate = self.gate.index_select(0, pattern).view(S, B, P).transpose(1, 2).contiguous()
        src, prompt, own_mask = self._layout(B, peers)
        return LearnerRows(src=src, prompt=prompt, own_mask=own_mask, sgt_gate=gate, sgt_weight=self.sgt_weight,
                           ratio_cap=self.ratio_cap, denominator=self.denominator, sgt_normalize=self.sgt_normalize,
                           **rows)
