"""Deterministic experience records for the distributed tests."""

from __future__ import annotations

from shared_interfaces.records import ExperienceRecord, make_record_id


def make_record(policy: str, step: int, prompt: str, index: int, *, version: int | None = None,
                reward: float | None = None) -> ExperienceRecord:
    n = 1 + (index * 7 + step) % 5
    return ExperienceRecord(
        record_id=make_record_id(policy, step, prompt, index), policy_id=policy,
        policy_version=step if version is None else version, step=step, prompt_id=prompt,
        sample_index=index, prompt_text=f"q {prompt}", response_text=f"a {policy} {index}",
        token_ids=tuple(range(index, index + n)), token_logprobs=tuple(-0.1 * (k + 1) / 3 for k in range(n)),
        tokenizer_id="utf8-bytes", reward=float(index % 2) if reward is None else reward, verified=True,
        verifier="arith", finish_reason="stop",
    )
