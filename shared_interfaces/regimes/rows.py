"""A learner's rows: the one representation between the regime plan and the loss, for both backends.

A record's way from rollout to the loss, in four representations (the same in both backends)::

    1. rollouts     records (LLM: ExperienceRecord, JSON on the exchange) or rollout tensors (bandit)
                    laid out by prompt, policy and sample
    2. core arrays  rewards / verified / lengths / mask [..., B, P, G] -> RegimePlan [..., B, i, j, g]
                    (:func:`shared_interfaces.regimes.math.regime_plan`; the LLM lays records out with
                    :func:`shared_interfaces.regimes.plan.plan_groups`, the bandit's rollouts already are)
    3. LearnerRows  per row ``[..., N]``: advantages, pg_mask, sample_weight, sgt_mask, own_mask, use_mu,
                    prompt and ``src`` (the row's sample in the layout of 2; the LLM's ``records[src]``)
                    — built by :func:`learner_rows` with array ops, in the row order the backend asks for
    4. loss tensors the rows' fields as they are, beside the forward's log-probs: the bandit stacks the
                    rows of regimes with as many rows (``bandit_sim.groups``, ``[R, S, P, N, T = 1]``); the
                    LLM tokenises each row's record (THL for peer records) and packs micro-batches
                    (``mrl_llm.batch``, ``mrl_llm.update``) — then ``regime_loss`` with the same names

Each row's behaviour correction (PRP's coefficient, :meth:`LearnerRows.behaviour_coef`) depends on its
kind: an own row and a ``prp_snapshot`` peer row have ``mu = pi_old`` (coefficient 1); a ``prp_thl`` peer
row (``use_mu``) has ``mu`` = the peer's trace as THL delivers it, so ``min(pi_old / mu, ratio_cap)``. A row
may be in the policy-gradient batch, an SGT target, or both (a verified peer success under ``prp_*+sgt``);
its SGT tokens enter ``L_SGT`` with the regime's ``sgt_weight``, shared among rescued prompts as
``sgt_normalize`` says (pools: ``prompt``). ``sgt_weight``, ``ratio_cap``, ``denominator`` and
``sgt_normalize`` are the regime's, one per batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace

import numpy as np
import torch

from shared_interfaces.records import ExperienceRecord
from shared_interfaces.regimes.config import RegimeSpec
from shared_interfaces.regimes.math import RegimePlan

#: the per-row fields, ``[..., N]`` (``src``, ``prompt`` and ``own_mask`` may omit the leading dims)
ROW_FIELDS = ("src", "prompt", "advantages", "pg_mask", "sample_weight", "sgt_mask", "own_mask", "use_mu")


@dataclass(frozen=True, eq=False)
class LearnerRows:
    """The rows a learner trains on (module docstring), as tensors ``[..., N]`` (leading dims: the bandit's
    seeds and learners; the LLM has one learner and none).

    * ``src``: the row's sample ``(b * P + j) * G + g`` in the plan's layout ``[..., B, P, G]`` — the index
      back to the records (``records[src]`` in the LLM; the bandit indexes its rollout tensors with it);
    * ``prompt``: the row's prompt ``b`` (SGT's pool under ``normalize: prompt``);
    * ``advantages`` (0 off ``pg_mask``), ``pg_mask``, ``sample_weight`` (1 own, PRP ``peer_weight`` on peer
      rows, 0 off ``pg_mask``), ``sgt_mask`` (the row is an SGT target), ``own_mask`` (the learner's own
      sample), ``use_mu`` (its behaviour correction uses the peer's trace: PRP peer rows under ``thl``);
    * ``sgt_gate [..., B]``: SGT's gate per prompt;
    * ``records``: the layout's records, flat, indexed by ``src`` (None where no sample; empty in the bandit).
    """

    src: torch.Tensor
    prompt: torch.Tensor
    advantages: torch.Tensor
    pg_mask: torch.Tensor
    sample_weight: torch.Tensor
    sgt_mask: torch.Tensor
    own_mask: torch.Tensor
    use_mu: torch.Tensor
    sgt_gate: torch.Tensor
    sgt_weight: float
    ratio_cap: float
    denominator: str | None
    sgt_normalize: str = "batch"
    records: tuple[ExperienceRecord | None, ...] = ()

    def __len__(self) -> int:
        return int(self.src.shape[-1])

    def __eq__(self, other: object) -> bool:
        """Every field equal: tensors in dtype, shape and value; the scalars and records."""
        if not isinstance(other, LearnerRows):
            return NotImplemented
        for f in fields(self):
            a, b = getattr(self, f.name), getattr(other, f.name)
            if isinstance(a, torch.Tensor):
                if not (a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)):
                    return False
            elif a != b:
                return False
        return True

    __hash__ = None  # type: ignore[assignment]

    def row_records(self) -> list[ExperienceRecord]:
        """Each row's record, in row order (rows built from records only)."""
        if not self.records and len(self):
            raise ValueError("these rows were built from rollout tensors, not records; they have no records")
        out = [self.records[n] for n in self.src.tolist()]
        missing = [k for k, r in enumerate(out) if r is None]
        if missing:
            raise ValueError(f"rows {missing[:5]} point at no record; the rows and their records do not match")
        return out  # type: ignore[return-value]

    def behaviour_coef(self, old_logp: torch.Tensor, mu_logp: torch.Tensor) -> torch.Tensor:
        """Per-token behaviour correction ``[..., N, T]`` of the rows (detached): the core's
        ``min(pi_old / mu, ratio_cap)`` on ``use_mu`` rows, exactly 1 on the others."""
        from shared_interfaces.losses import peer_behaviour_coef  # (losses imports this package)

        return peer_behaviour_coef(old_logp, mu_logp, self.use_mu.to(old_logp.device), self.ratio_cap)

    def take(self, idx: torch.Tensor | np.ndarray | Sequence[int]) -> LearnerRows:
        """Rows ``idx`` (last axis), in that order; ``sgt_gate`` and ``records`` are kept whole."""
        i = torch.as_tensor(np.asarray(idx, dtype=np.int64))
        return replace(self, **{f: getattr(self, f).index_select(-1, i) for f in ROW_FIELDS})

    @classmethod
    def empty(cls, spec: RegimeSpec) -> LearnerRows:
        """No rows (a step without records), with ``spec``'s scalars."""
        z = torch.zeros(0, dtype=torch.int64)
        f, b = torch.zeros(0, dtype=torch.float64), torch.zeros(0, dtype=torch.bool)
        return cls(src=z, prompt=z, advantages=f, pg_mask=b, sample_weight=f, sgt_mask=b, own_mask=b, use_mu=b,
                   sgt_gate=b, sgt_weight=spec.sgt.weight if spec.sgt_enabled else 0.0, ratio_cap=spec.prp.ratio_cap,
                   denominator=spec.denominator, sgt_normalize=spec.sgt.normalize)

    @classmethod
    def concat(cls, parts: Sequence[LearnerRows], spec: RegimeSpec) -> LearnerRows:
        """One learner's rows of several plans (``[N]`` each) end to end: ``src`` shifted past the earlier
        parts' records, ``sgt_gate`` concatenated (``prompt`` is the caller's: give each part its own)."""
        if not parts:
            return cls.empty(spec)
        if any(p.src.dim() != 1 for p in parts):
            raise ValueError("LearnerRows.concat joins one learner's rows [N]; these have leading dims")
        offsets = np.cumsum([0] + [len(p.records) for p in parts[:-1]])
        cat = {f: torch.cat([getattr(p, f) for p in parts]) for f in ROW_FIELDS if f != "src"}
        cat["src"] = torch.cat([p.src + int(o) for p, o in zip(parts, offsets, strict=True)])
        return replace(parts[0], **cat, sgt_gate=torch.cat([p.sgt_gate for p in parts]),
                       records=tuple(r for p in parts for r in p.records))


def learner_rows(
    plan: RegimePlan,
    src: np.ndarray,
    *,
    learners: np.ndarray | int | None = None,
    dtype: np.dtype | type = np.float64,
    records: tuple[ExperienceRecord | None, ...] = (),
) -> LearnerRows:
    """The rows of ``plan`` (over ``[..., B, i, j, g]``) that the backend lays out in ``src``.

    ``src [L, N]``: learner ``learners[l]``'s rows as samples ``(b * P + j) * G + g``, in the order the
    backend wants them (``learners`` default: every policy, ``L = P``); an int ``learners`` takes
    ``src [N]`` and gives rows without the learner dim. Each row gets its sample's advantage (0 off the
    learner's ``pg_mask``), the learner's ``pg_mask``, ``sample_weight`` and SGT target flag for it; the
    result's ``src``, ``prompt`` and ``own_mask`` have no leading dims of the plan (they are the same for
    every leading index). Advantages and weights are cast to ``dtype``. Array operations only.
    """
    single = np.ndim(learners) == 0 and learners is not None
    P, G = plan.pg_mask.shape[-2:]
    src = np.atleast_2d(np.asarray(src, dtype=np.int64))
    ls = np.arange(P) if learners is None else np.atleast_1d(np.asarray(learners, dtype=np.int64))
    if src.shape[0] != ls.shape[0]:
        raise ValueError(f"learner_rows: src has rows for {src.shape[0]} learners, learners names {ls.shape[0]}")
    lead = plan.pg_mask.shape[:-4]
    b, jg = src // (P * G), src % (P * G)
    is_peer = jg // G != ls[:, None]
    plan_idx = (b * P + ls[:, None]) * (P * G) + jg  # into [..., B, i, j, g]

    def take(x: np.ndarray, idx: np.ndarray) -> np.ndarray:
        return np.take(x.reshape(lead + (-1,)), idx, axis=-1)  # (much faster than fancy indexing)

    pg_mask = take(plan.pg_mask, plan_idx)
    use_mu = pg_mask & is_peer if plan.denominator == "thl" else np.zeros_like(pg_mask)
    adv = take(plan.advantages, src)  # each row's sample's advantage
    gate = np.take(np.swapaxes(plan.sgt_gate, -1, -2), ls, axis=-2) if learners is not None else \
        np.swapaxes(plan.sgt_gate, -1, -2).copy()  # [..., L, B]
    rows = LearnerRows(
        src=torch.from_numpy(src),
        prompt=torch.from_numpy(b),
        advantages=torch.from_numpy(np.where(pg_mask, adv, 0.0).astype(dtype)),
        pg_mask=torch.from_numpy(pg_mask),
        sample_weight=torch.from_numpy(take(plan.sample_weight, plan_idx).astype(dtype)),
        sgt_mask=torch.from_numpy(take(plan.sgt_targets, plan_idx)),
        own_mask=torch.from_numpy(~is_peer),
        use_mu=torch.from_numpy(use_mu),
        sgt_gate=torch.from_numpy(gate),
        sgt_weight=plan.sgt_weight,
        ratio_cap=plan.ratio_cap,
        denominator=plan.denominator,
        sgt_normalize=plan.sgt_normalize,
        records=records,
    )
    if single:
        rows = replace(rows, **{f.name: getattr(rows, f.name).select(-2, 0) for f in fields(rows)
                                if f.name in ROW_FIELDS or f.name == "sgt_gate"})
    return rows
