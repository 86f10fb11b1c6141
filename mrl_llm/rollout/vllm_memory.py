"""MWRA -> vLLM: the memory settings of one policy's vLLM engine, from the placement plan.

The planner (:mod:`mrl_llm.distributed.planner`) has already checked that everything placed on a
device fits in ``usable_fraction`` of it, with ``c = rollout_concurrency`` sequences in flight per
engine. The engine is then told to claim exactly its part of that estimate:

* ``kv_cache_memory_bytes = c * 2 L h_kv e s`` — the planner's KV cache for ``c`` full-length sequences
  (``s = prompt_len + max_response_len``), but at least one sequence rounded up to whole
  :data:`KV_BLOCK_TOKENS`-token blocks (vLLM refuses to start unless one ``max_model_len`` request fits in
  whole blocks). vLLM sizes its cache from this instead of from the utilisation (on CPU it replaces the
  ``VLLM_CPU_KVCACHE_SPACE`` variable, which takes whole GiB; an exported ``VLLM_CPU_KVCACHE_SPACE``
  still wins over it).
* ``gpu_memory_utilization = (N e + KV + 8 V c + overhead) / capacity`` — the engine's whole
  footprint (weights, KV cache, sampling logits, plus the per-process overhead on a GPU) as a fraction
  of the device; on the CPU backend the "device" is the node's RAM. vLLM checks at start-up that this
  much is free, so engines that share a GPU each ask for their own share, never the default 0.9.
* ``max_num_seqs = c``, ``max_model_len = s``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from mrl_llm.distributed.memory import GiB, MemoryModel, PolicyFootprint, kv_bytes_per_sequence, rollout_bytes
from mrl_llm.distributed.planner import PlacementPlan

KV_BLOCK_TOKENS = 256  # the largest KV block any vLLM backend uses


@dataclass(frozen=True)
class VLLMMemory:
    """vLLM's memory settings for one engine (:meth:`engine_args` gives them as ``vllm.LLM`` kwargs)."""

    gpu_memory_utilization: float
    kv_cache_memory_bytes: int
    max_num_seqs: int
    max_model_len: int

    def __post_init__(self) -> None:
        if not (0 < self.gpu_memory_utilization <= 1):
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.kv_cache_memory_bytes < 1 or self.max_num_seqs < 1 or self.max_model_len < 1:
            raise ValueError(f"vLLM memory settings must be positive, got {self}")

    def engine_args(self) -> dict[str, Any]:
        return {
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "kv_cache_memory_bytes": self.kv_cache_memory_bytes,
            "max_num_seqs": self.max_num_seqs,
            "max_model_len": self.max_model_len,
        }


def kv_cache_bytes(fp: PolicyFootprint, concurrency: int) -> int:
    """KV cache for ``concurrency`` full-length sequences, at least one in whole blocks."""
    per_seq = kv_bytes_per_sequence(fp)
    one_in_blocks = per_seq / fp.seq_len * math.ceil(fp.seq_len / KV_BLOCK_TOKENS) * KV_BLOCK_TOKENS
    return math.ceil(max(per_seq * concurrency, one_in_blocks))


def vllm_memory(
    plan: PlacementPlan, fp: PolicyFootprint, device: str | None = None, memory_model: MemoryModel | None = None
) -> VLLMMemory:
    """The settings of ``fp``'s engine on ``device`` (default: its first rollout device) under ``plan``."""
    if fp.engine != "vllm":
        raise ValueError(f"policy {fp.name!r} is planned with engine {fp.engine!r}, not vllm")
    placement = plan.for_policy(fp.name)
    name = device or (placement.rollout_devices[0] if placement.rollout_devices else None)
    if name not in placement.rollout_devices:
        raise ValueError(f"policy {fp.name!r} has no rollout engine on {name!r}; its rollout devices are "
                         f"{list(placement.rollout_devices)}")
    dev = next(d.device for d in plan.devices if d.device.name == name)
    mm = memory_model or plan.cluster.memory_model
    conc = placement.rollout_concurrency
    kv = kv_cache_bytes(fp, conc)
    rb = rollout_bytes(fp, conc, own_weights=True)
    engine = rb.weights + rb.activations + kv + (mm.process_overhead_gib * GiB if dev.kind == "gpu" else 0.0)
    util = engine / dev.capacity_bytes
    if util > mm.usable_fraction:
        raise ValueError(f"policy {fp.name!r}: its vLLM engine needs {engine / GiB:.2f} GiB, more than the "
                         f"usable {mm.usable_fraction:g} of {name} ({dev.capacity_bytes / GiB:.1f} GiB)")
    return VLLMMemory(
        gpu_memory_utilization=math.ceil(util * 1e4) / 1e4,
        kv_cache_memory_bytes=kv,
        max_num_seqs=conc,
        max_model_len=fp.seq_len,
    )
