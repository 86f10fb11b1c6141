"""The fixed eval protocol of one policy (:mod:`mrl_llm.evaluate` runs it for every policy and summarises).

Per problem: one **greedy** answer and, when ``k > 0``, ``k`` samples at ``temperature`` / ``top_p`` with
the given ``seed`` (the caller's ``derive_seed(run seed, policy, "eval", step)``), all with
``max_new_tokens``; every answer is scored by the problem's verifier in one batch. A row is
``{prompt_id, family, skipped, greedy_correct, greedy_response (500 chars), samples, successes}``: a
success has reward >= :data:`~shared_interfaces.records.SUCCESS_THRESHOLD` and was not skipped (an unusable
gold answer skips).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from mrl_llm.rollout import Sample, SamplingConfig
from shared_interfaces.records import SUCCESS_THRESHOLD

#: ``sample(n, sampling)``: ``n`` samples for each of the problems being evaluated, in order
Sampler = Callable[[int, SamplingConfig], list[list[Sample]]]
ScoreMany = Callable[[Sequence[tuple[Any, str, str]]], list[Any]]


def eval_rows(problems: Sequence[Any], *, sample: Sampler, score_many: ScoreMany, k: int, temperature: float,
              top_p: float, max_new_tokens: int, seed: int) -> list[dict[str, Any]]:
    """One row per problem (module docstring); no problems, no rows."""
    greedy = sample(1, SamplingConfig(max_new_tokens=max_new_tokens, greedy=True))
    sampled: list[list[Sample]] = [[] for _ in problems]
    if k > 0:
        sampled = sample(k, SamplingConfig(temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens,
                                           seed=seed))
    rows = []
    batch = [(prob, o.text, o.finish_reason)
             for prob, g, ss in zip(problems, greedy, sampled, strict=True) for o in (g[0], *ss)]
    scored = iter(score_many(batch))
    for prob, g, ss in zip(problems, greedy, sampled, strict=True):
        gv = next(scored)
        verdicts = [next(scored) for _ in ss]
        rows.append({"prompt_id": str(prob.prompt_id), "family": getattr(prob, "family", None),
                     "skipped": bool(gv.skip), "greedy_correct": int(gv.reward >= SUCCESS_THRESHOLD and not gv.skip),
                     "greedy_response": g[0].text[:500], "samples": len(verdicts),
                     "successes": int(sum(v.reward >= SUCCESS_THRESHOLD and not v.skip for v in verdicts))})
    return rows
