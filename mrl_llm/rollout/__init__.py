"""Rollout engines: HF ``generate`` (fallback) and vLLM, behind :class:`RolloutEngine`."""

from mrl_llm.rollout.base import RolloutEngine, Sample, SamplingConfig

__all__ = ["RolloutEngine", "Sample", "SamplingConfig"]
