"""Shared pieces of the trainer tests: tiny model configs, a test verifier, problems, a tiny run config."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from mrl_llm.data import Problem


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
        self.calls = 0

    def check_gold(self, gold: str, *, choices: tuple[str, ...] = ()) -> str | None:
        return None if gold != "UNPARSABLE" else "unparsable test gold"

    def score(self, response: str, gold: str, *, finish_reason: str = "stop", choices: tuple[str, ...] = ()):
        self.calls += 1
        if gold == "UNPARSABLE":
            return SimpleNamespace(reward=0.0, verified=False, skip=True)
        ok = 0 < len(response.strip()) <= self.max_chars
        return SimpleNamespace(reward=1.0 if ok else 0.0, verified=True, skip=False)


def install_verifier(monkeypatch, verifier: Any) -> None:
    """Route ``get_verifier(verifier.name)`` to ``verifier`` (other names to the real registry)."""
    import mrl_llm.rewards as rewards

    real = rewards.get_verifier
    monkeypatch.setattr(rewards, "get_verifier", lambda name: verifier if name == verifier.name else real(name))


def problems(n: int, verifier: str = "short", prefix: str = "p") -> list[Problem]:
    return [Problem(prompt_id=f"{prefix}{i}", question=f"What is {i}+{i}?", gold=str(2 * i), verifier=verifier)
            for i in range(n)]
