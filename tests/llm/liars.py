"""A lying policy worker for the peer-check tests: an :class:`~mrl_llm.worker.LLMPolicyWorker` whose
published records claim the opposite of its verifier's rewards (the first one of each step claims
2.0, outside the verifiers' range). Built by name (``tests.llm.liars:build``) so that a Ray actor can
make one."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from mrl_llm.worker import LLMPolicyWorker
from mrl_llm.worker import build as build_honest


def _lie(records: list) -> list:
    out = [replace(r, reward=1.0 - r.reward) for r in records]
    if out:
        out[0] = replace(out[0], reward=2.0)
    return out


def build(name: str, config: Any, seed: int) -> LLMPolicyWorker:
    worker = build_honest(name, config, seed)
    honest_generate = worker.generate
    worker.generate = lambda problems, step: _lie(honest_generate(problems, step))
    return worker
