"""A step's rollouts: sampling settings, and samples turned into scored experience records.

* :func:`rollout_sampling` — the step's :class:`~mrl_llm.rollout.SamplingConfig`: the policy's temperature,
  top-p and budget, seeded by ``derive_seed(run seed, policy, "rollout", step)``; with ``sampling.seeding:
  sample`` also one seed per (prompt, sample index), so a record does not depend on which rank samples it.
* :func:`make_records` — each sample with its verdict becomes an
  :class:`~shared_interfaces.records.ExperienceRecord` (id ``make_record_id(policy, step, prompt, g)``,
  the policy's version and tokenizer id); a skipped verdict (an unusable gold answer) makes no record and is
  counted. :class:`RolloutStats` counts the samples, tokens, empty and truncated responses and FLOPs
  (``2 N`` per prompt and generated token).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mrl_llm.config import PolicyConfig
from mrl_llm.rank.seeds import derive_seed
from mrl_llm.rollout import Sample, SamplingConfig
from shared_interfaces.records import ExperienceRecord, make_record_id


def rollout_sampling(policy: PolicyConfig, problems: Sequence[Any], *, seed: int, step: int) -> SamplingConfig:
    """The sampling of ``policy``'s rollouts of ``problems`` at ``step`` (module docstring); ``seed``: the run's."""
    s = policy.sampling
    row_seeds = None
    if s.seeding == "sample":  # a record is the same whichever rank samples it
        row_seeds = tuple(derive_seed(seed, policy.name, "rollout", step, p.prompt_id, g)
                          for p in problems for g in range(policy.group_size))
    return SamplingConfig(temperature=s.temperature, top_p=s.top_p, max_new_tokens=s.max_new_tokens,
                          seed=derive_seed(seed, policy.name, "rollout", step), row_seeds=row_seeds)


@dataclass
class RolloutStats:
    """What one step's sampling produced (besides its records)."""

    samples: int = 0
    gen_tokens: int = 0
    prompt_tokens: int = 0
    skipped: int = 0
    empty: int = 0
    truncated: int = 0
    flops: float = 0.0

    def metrics(self, *, generation_s: float, scoring_s: float) -> dict[str, float]:
        """The step's generation row (what the actor reports as ``last_generate``)."""
        return {"generation_s": generation_s, "scoring_s": scoring_s, "samples": float(self.samples),
                "gen_tokens": float(self.gen_tokens), "prompt_tokens": float(self.prompt_tokens),
                "skipped_samples": float(self.skipped),
                "empty_responses": float(self.empty), "truncated_responses": float(self.truncated),
                "gen_flops": self.flops}


def make_records(problems: Sequence[Any], rendered: Sequence[tuple[str, list[int]]], samples: Sequence[list[Sample]],
                 verdicts: Sequence[Any], *, policy: str, version: int, step: int, tok_id: str, group_size: int,
                 flops_params: int) -> tuple[list[ExperienceRecord], RolloutStats]:
    """The records of ``samples`` (one list per problem, ``rendered`` its prompt) and their ``verdicts``
    (one per sample, problem-major), with the step's counts (module docstring)."""
    records: list[ExperienceRecord] = []
    st = RolloutStats()
    it = iter(verdicts)
    for prob, (text, _ids), group in zip(problems, rendered, samples, strict=True):
        for g, s in enumerate(group):
            st.gen_tokens += len(s.token_ids)
            st.empty += int(not s.text.strip())
            st.truncated += int(s.finish_reason == "length")
            verdict = next(it)
            if verdict.skip:
                st.skipped += 1
                continue
            records.append(ExperienceRecord(
                record_id=make_record_id(policy, step, str(prob.prompt_id), g), policy_id=policy,
                policy_version=version, step=step, prompt_id=str(prob.prompt_id), sample_index=g,
                prompt_text=text, response_text=s.text, token_ids=s.token_ids, token_logprobs=s.logprobs,
                tokenizer_id=tok_id, reward=verdict.reward, verified=verdict.verified,
                verifier=str(prob.verifier), finish_reason=s.finish_reason,
            ))
    st.prompt_tokens = sum(len(ids) for _, ids in rendered) * group_size
    st.flops = 2.0 * flops_params * (st.prompt_tokens + st.gen_tokens)
    st.samples = sum(len(o) for o in samples)
    return records, st
