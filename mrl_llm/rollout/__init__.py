"""Rollout engines: HF (fallback) and vLLM, behind :class:`RolloutEngine`; :func:`make_engine` picks one.

Nothing here imports vLLM: :mod:`mrl_llm.rollout.vllm_engine` does, when a vLLM engine is built.
"""

from mrl_llm.rollout.base import RolloutEngine, Sample, SamplingConfig
from mrl_llm.rollout.drift import DriftConfig, DriftError, DriftReport
from mrl_llm.rollout.factory import ENGINE_KINDS, make_engine
from mrl_llm.rollout.hf_engine import HFEngine

__all__ = [
    "ENGINE_KINDS",
    "DriftConfig",
    "DriftError",
    "DriftReport",
    "HFEngine",
    "RolloutEngine",
    "Sample",
    "SamplingConfig",
    "make_engine",
]
