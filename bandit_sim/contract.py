"""The bandit backend of the cross-backend contract (:mod:`shared_interfaces.contract`).

:func:`run_contract_case` lays a case's raw records out the way the engine lays out a step's rollouts —
``[1, B, P, G]`` arrays (prompts by (step, prompt id), policies in the core's canonical sorted order,
samples by sample index) — and sends them through the engine's own batching code path:
:func:`bandit_sim.batching.plan_batch` (the call the engine makes each step) and
:func:`bandit_sim.batching.behaviour_coef`. It then reads each learner's rows back as record ids.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import torch

from bandit_sim.batching import behaviour_coef, plan_batch
from shared_interfaces.contract import ContractCase, ContractOutput, LearnerDecisions
from shared_interfaces.records import ExperienceRecord


def layout_records(records, policy_ids):
    """Records -> ``rewards, verified, lengths, mask [1, B, P, G]``, ``ids[b][p][g]`` (record id or None)
    and the prompt ids in order. Policies are sorted (the core's canonical order); a policy with no
    record for a prompt gets an all-masked row."""
    pids = sorted(set(policy_ids))
    col = {p: i for i, p in enumerate(pids)}
    by_prompt: dict[tuple[int, str], list[ExperienceRecord]] = defaultdict(list)
    for r in records:
        if r.policy_id not in col:
            raise ValueError(f"record {r.record_id!r} is from policy {r.policy_id!r}, not one of {pids}")
        by_prompt[(r.step, r.prompt_id)].append(r)
    keys = sorted(by_prompt)
    rows = [[sorted((r for r in by_prompt[k] if r.policy_id == p), key=lambda r: (r.sample_index, r.record_id))
             for p in pids] for k in keys]
    B, P = len(keys), len(pids)
    G = max((len(row) for prompt in rows for row in prompt), default=0)
    shape = (1, B, P, G)
    rewards, lengths = np.zeros(shape), np.zeros(shape, dtype=np.int64)
    verified, mask = np.zeros(shape, dtype=bool), np.zeros(shape, dtype=bool)
    ids: list[list[list[str | None]]] = [[[None] * G for _ in range(P)] for _ in range(B)]
    for b, prompt in enumerate(rows):
        for p, row in enumerate(prompt):
            for g, rec in enumerate(row):
                rewards[0, b, p, g] = rec.reward
                verified[0, b, p, g] = rec.verified
                lengths[0, b, p, g] = len(rec.token_ids)
                mask[0, b, p, g] = True
                ids[b][p][g] = rec.record_id
    return rewards, verified, lengths, mask, ids, pids, [k[1] for k in keys]


def run_contract_case(case: ContractCase) -> ContractOutput:
    rewards, verified, lengths, mask, ids, pids, prompts = layout_records(case.records, case.policy_ids)
    out: ContractOutput = {p: LearnerDecisions() for p in pids}
    if rewards.size == 0:
        return out
    rows = plan_batch(case.regime, rewards, verified=verified, lengths=lengths, mask=mask)
    _, B, P, G = rewards.shape
    # The peers' traces are their recorded log-probs (summed: the bandit's response is one token). The
    # contract has no learner model, so its snapshot log-probs are 0; the snapshot coefficient does not
    # depend on them (mu = pi_old), which is what the contract checks.
    by_id = {r.record_id: r for r in case.records}
    beh = np.zeros(rewards.shape)
    for b in range(B):
        for p in range(P):
            for g in range(G):
                if ids[b][p][g] is not None:
                    beh[0, b, p, g] = sum(by_id[ids[b][p][g]].token_logprobs)
    mu = torch.from_numpy(beh.reshape(1, -1))[:, rows.src]  # [1, P, N] per learner row
    coef = behaviour_coef(rows, torch.zeros_like(mu), mu)
    for i, learner in enumerate(pids):
        dec = out[learner]
        for b in range(B):
            dec.sgt_gates[prompts[b]] = bool(rows.sgt_gate[0, i, b])
        for row, n in enumerate(rows.src[i].tolist()):
            b, rest = divmod(n, P * G)
            rid = ids[b][rest // G][rest % G]
            if rid is None:
                continue
            if rows.pg_mask[0, i, row]:
                dec.advantages[rid] = float(rows.advantages[0, i, row])
                dec.weights[rid] = float(rows.sample_weight[0, i, row])
                if not rows.own_mask[i, row] and rows.denominator == "snapshot":
                    dec.snapshot_coef[rid] = float(coef[0, i, row])
            if rows.sgt_mask[0, i, row]:
                dec.sgt_targets.add(rid)
        if rows.sgt_normalize == "prompt":
            pools: dict[int, set[str]] = {}
            for row, (n, pool) in enumerate(zip(rows.src[i].tolist(), rows.prompt[i].tolist(), strict=True)):
                rest = n % (P * G)
                rid = ids[pool][rest // G][rest % G]
                if rid is not None and rows.sgt_mask[0, i, row]:
                    pools.setdefault(pool, set()).add(rid)
            dec.sgt_pools.update(frozenset(p) for p in pools.values())
    return out
