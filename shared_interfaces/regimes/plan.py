"""Records -> a learner's rows: the record-level face of :func:`regime_plan`.

:func:`group_arrays` lays a :class:`PromptGroup` out as ``[P, G]`` arrays (policies sorted by id, samples in
canonical order). :func:`plan_groups` plans a step's groups and gives one learner's
:class:`~shared_interfaces.regimes.rows.LearnerRows`: groups of one ``[P, G]`` shape go through one
``regime_plan`` call over ``[B, P, G]`` (the math is vectorised over leading dims and per prompt, so this
gives the same plan as one call per group); under SGT's ``random`` selection each group keeps its own call
and generator. The rows come in the LLM's training order — prompt by prompt (``groups`` order), each
prompt's policy-gradient rows in canonical ``(j, g)`` order, then its SGT targets that are not already
rows — with ``prompt`` = the group's position and ``records[src]`` each row's record. A backend turns
them into tensors; it decides nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch

from shared_interfaces.records import ExperienceRecord, PromptGroup
from shared_interfaces.regimes.config import RegimeSpec
from shared_interfaces.regimes.math import regime_plan
from shared_interfaces.regimes.rows import LearnerRows, learner_rows


@dataclass(frozen=True)
class GroupArrays:
    """A prompt group as arrays: ``rewards, verified, lengths, mask [P, G]`` and ``records[p][g]``."""

    policy_ids: tuple[str, ...]
    rewards: np.ndarray
    verified: np.ndarray
    lengths: np.ndarray
    mask: np.ndarray
    records: tuple[tuple[ExperienceRecord, ...], ...]

    def flat_records(self) -> tuple[ExperienceRecord | None, ...]:
        """The records in the flat ``(j, g)`` order of the arrays (None where ``mask`` is False)."""
        P, G = self.mask.shape
        return tuple(row[g] if g < len(row) else None for row in self.records for g in range(G)) if P else ()


def group_arrays(group: PromptGroup, policy_ids: Sequence[str]) -> GroupArrays:
    """Lay ``group`` out over ``sorted(policy_ids)`` (a policy with no records gets an empty row)."""
    pids = tuple(sorted(set(policy_ids)))
    stray = sorted({r.policy_id for r in group.records} - set(pids))
    if stray:
        raise ValueError(f"prompt group {group.prompt_id!r} has records of unknown policies {stray}")
    rows = tuple(group.of_policy(p) for p in pids)
    G = max((len(r) for r in rows), default=0)
    P = len(pids)
    rewards = np.zeros((P, G))
    verified = np.zeros((P, G), dtype=bool)
    lengths = np.zeros((P, G), dtype=np.int64)
    mask = np.zeros((P, G), dtype=bool)
    for p, row in enumerate(rows):
        for g, rec in enumerate(row):
            rewards[p, g] = rec.reward
            verified[p, g] = rec.verified
            lengths[p, g] = len(rec.token_ids)
            mask[p, g] = True
    return GroupArrays(pids, rewards, verified, lengths, mask, rows)


def training_order(pg_mask: np.ndarray, sgt_mask: np.ndarray) -> np.ndarray:
    """One learner's rows of a plan over ``[B, P, G]`` (its ``pg_mask`` and SGT targets, ``[B, P, G]``) as
    samples ``(b * P + j) * G + g``: prompt by prompt, the policy-gradient samples in ``(j, g)`` order, then
    the SGT targets not among them."""
    B = pg_mask.shape[0]
    pg, sgt = pg_mask.reshape(B, -1), sgt_mask.reshape(B, -1)
    n = pg.shape[1]
    rank = np.arange(B)[:, None] * 2 * n + np.where(pg, 0, n) + np.arange(n)  # (b, not in pg, (j, g))
    keep = np.flatnonzero((pg | sgt).ravel())
    return keep[np.argsort(rank.ravel()[keep], kind="stable")]


def plan_groups(
    groups: Sequence[PromptGroup],
    policy_ids: Sequence[str],
    spec: RegimeSpec,
    *,
    learner: str,
    rng: Callable[[], np.random.Generator] | None = None,
) -> LearnerRows:
    """``learner``'s rows of ``groups`` under ``spec`` (module docstring). ``rng()`` makes the generator of
    each group's SGT ``random`` selection (called once per group, in order)."""
    arrs = [group_arrays(g, policy_ids) for g in groups]
    pids = tuple(sorted(set(policy_ids)))
    if learner not in pids:
        raise ValueError(f"learner {learner!r} is not one of the policies {list(pids)}")
    i = pids.index(learner)
    batches: list[list[int]] = []  # group positions planned together
    by_shape: dict[tuple[int, ...], list[int]] = {}
    for k, arr in enumerate(arrs):
        if arr.mask.size == 0:
            continue
        if spec.random_plan:
            batches.append([k])
        else:
            by_shape.setdefault(arr.mask.shape, []).append(k)
    batches += list(by_shape.values())
    gate = torch.zeros(len(groups), dtype=torch.bool)
    parts = []
    for ks in batches:
        stack = [arrs[k] for k in ks]
        plan = regime_plan(spec, *(np.stack([getattr(a, f) for a in stack]) for f in ("rewards", "verified", "lengths")),
                           np.stack([a.mask for a in stack]),
                           rng=rng() if spec.random_plan and rng is not None else None)
        src = training_order(plan.pg_mask[:, i], plan.sgt_targets[:, i])
        rows = learner_rows(plan, src, learners=i, records=tuple(r for a in stack for r in a.flat_records()))
        gate[ks] = rows.sgt_gate
        parts.append(replace(rows, prompt=torch.as_tensor(ks, dtype=torch.int64)[rows.prompt]))
    if not parts:
        return replace(LearnerRows.empty(spec), sgt_gate=gate)
    rows = LearnerRows.concat(parts, spec)
    order = torch.argsort(rows.prompt, stable=True)  # back into the groups' order
    return replace(rows.take(order), sgt_gate=gate)
