"""Engine selection: ``make_engine("hf" | "vllm", ...)``, the one call the trainer config makes.

vLLM is imported only when a ``vllm`` engine is built (importing this module, or building an ``hf``
engine, never imports it); without vLLM installed the error says how to install it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import torch

from mrl_llm.rollout.base import RolloutEngine

EngineKind = Literal["hf", "vllm"]
ENGINE_KINDS = ("hf", "vllm")


def make_engine(
    kind: EngineKind,
    *,
    model: torch.nn.Module | None = None,
    tokenizer=None,
    model_dir: str | Path | None = None,
    **options: Any,
) -> RolloutEngine:
    """Build a rollout engine.

    * ``"hf"``: :class:`~mrl_llm.rollout.hf_engine.HFEngine` over ``model`` and ``tokenizer``
      (``options``: ``max_batch_size``, ``logits_hook``).
    * ``"vllm"``: :class:`~mrl_llm.rollout.vllm_engine.VLLMEngine` over ``model_dir``; without one, ``model``
      and ``tokenizer`` are saved to a temporary directory the engine removes on ``close()``
      (``options``: the engine's keyword arguments — ``dtype``, ``seed``, ``memory``, ``drift`` ...).
    """
    if kind == "hf":
        if model is None or tokenizer is None:
            raise ValueError("the hf engine samples from the trainer's model: pass model= and tokenizer=")
        from mrl_llm.rollout.hf_engine import HFEngine

        return HFEngine(model, tokenizer, **options)
    if kind == "vllm":
        from mrl_llm.rollout.vllm_engine import VLLMEngine, import_vllm

        import_vllm()  # fail with the install hint before saving anything
        if model_dir is not None:
            return VLLMEngine(model_dir, **options)
        if model is None or tokenizer is None:
            raise ValueError("the vllm engine needs model_dir= (a saved checkpoint) or model= and tokenizer=")
        return VLLMEngine.from_model(model, tokenizer, **options)
    raise ValueError(f"unknown rollout engine {kind!r}; choose one of {list(ENGINE_KINDS)}")
