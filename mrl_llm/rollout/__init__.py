"""Rollout engines: HF ``generate`` (fallback) and vLLM, behind :class:`RolloutEngine`."""

from mrl_llm.rollout.base import RolloutEngine, Sample, SamplingConfig
from mrl_llm.rollout.hf_engine import HFEngine

__all__ = ["HFEngine", "RolloutEngine", "Sample", "SamplingConfig"]
