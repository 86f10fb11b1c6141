"""Policy footprints the planning tests use (the paper pair and the CPU demo).

The paper pair uses issue 5's preset settings (G = 8, bf16, gradient checkpointing, k3 KL) with a
verl-like MATH workload: 128 prompts per step, prompts up to 1,024 tokens, responses up to 3,072,
training micro-batch 4, vLLM rollouts. The CPU demo is two tiny fp32 policies of different families
sampled with the HF engine.
"""

from __future__ import annotations

from pathlib import Path

from mrl_llm.distributed.memory import KNOWN_SHAPES, ModelShape, PolicyFootprint

CLUSTERS = Path(__file__).resolve().parents[2] / "experiments" / "configs" / "clusters"


def paper_pair() -> list[PolicyFootprint]:
    common = dict(dtype="bf16", rollouts_per_step=128 * 8, prompt_len=1024, max_response_len=3072,
                  micro_batch=4, grad_checkpointing=True, kl_coef=0.001, engine="vllm",
                  logprob_chunk=1024)  # the trainer's default chunk, which the config adapter assumes
    return [
        PolicyFootprint(name="qwen2.5-math-1.5b", shape=KNOWN_SHAPES["Qwen2.5-Math-1.5B"], **common),
        PolicyFootprint(name="qwen3-1.7b-base", shape=KNOWN_SHAPES["Qwen3-1.7B-Base"], **common),
    ]


def cpu_demo() -> list[PolicyFootprint]:
    common = dict(dtype="fp32", rollouts_per_step=8 * 4, prompt_len=48, max_response_len=24, micro_batch=8,
                  engine="hf")
    return [
        PolicyFootprint(name="qwen-tiny", shape=ModelShape(2, 64, 4, 2, 128, 2000, tie_embeddings=True), **common),
        PolicyFootprint(name="llama-tiny", shape=ModelShape(2, 64, 4, 4, 128, 1500), **common),
    ]
