"""The warm start: a tiny causal LM built from a config, SFT'd on ONE arithmetic family, saved as a policy.

:func:`sft_policy` builds a fresh model (Qwen2- or Llama-style, :func:`arch_config`) for a tokenizer,
trains it by teacher forcing on the training prompts of the given families — prompt = the policy's
template applied to the question (:class:`mrl_llm.templates.PromptTemplate`, exactly what the worker
renders), target = :func:`mrl_llm.rewards.reference_response` + EOS, cross-entropy on the target
tokens only — with AdamW, a short warm-up and a linear decay, then measures greedy accuracy per family
and split with the HF engine and the arithmetic checker, and saves an ordinary HF model directory
(model + tokenizer + ``mrl_policy.json``) that a policy's ``model_dir`` can point at.

The prompt and the target are encoded *jointly* (``prompt + target``, special tokens added) and the
target starts at the first token that ends after the prompt, so the SFT sequences are token for token
what the policy later generates after its rendered prompt. Deterministic for a seed on a fixed
thread count.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from mrl_llm.config import PolicyConfig
from mrl_llm.data.problem import Problem
from mrl_llm.models import build_model, save_policy
from mrl_llm.rewards import ArithmeticTask, arithmetic_reward, reference_response
from mrl_llm.rollout import HFEngine, SamplingConfig
from mrl_llm.templates import PromptTemplate, TemplateConfig
from shared_interfaces.config_io import to_mapping

ARCHS = ("qwen2", "llama", "gpt2")


@dataclass(frozen=True)
class ArchSize:
    """Width and depth of a tiny policy (heads of 16 dims)."""

    hidden: int = 64
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    mlp_mult: int = 4
    max_positions: int = 64


@dataclass(frozen=True)
class SFTConfig:
    """One warm start: ``steps`` AdamW updates of ``batch`` sequences, ``lr`` with ``warmup`` steps of
    linear warm-up and a linear decay to 5 %, grad-norm clip 1."""

    steps: int = 300
    batch: int = 64
    lr: float = 3e-3
    warmup: int = 20
    seed: int = 0


def arch_config(arch: str, size: ArchSize) -> dict[str, Any]:
    """The ``model_config`` of a Qwen2-style (``qwen2``: biased QKV, GQA, RMSNorm, SwiGLU, rotary), a
    Llama-style (``llama``) or a GPT-2-style (``gpt2``: learned absolute positions, LayerNorm, GELU MLP,
    fused biased QKV, dropout off; no GQA, ``kv_heads`` is ignored) causal LM with tied input/output embeddings;
    :func:`mrl_llm.models.build_model` adds the tokenizer's vocabulary size and special-token ids."""
    if arch not in ARCHS:
        raise ValueError(f"unknown demo architecture {arch!r}; choose one of {list(ARCHS)}")
    if arch == "gpt2":
        return {"model_type": "gpt2", "n_embd": size.hidden, "n_inner": size.mlp_mult * size.hidden,
                "n_layer": size.layers, "n_head": size.heads, "n_positions": size.max_positions,
                "tie_word_embeddings": True, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}
    cfg = {"model_type": arch, "hidden_size": size.hidden, "intermediate_size": size.mlp_mult * size.hidden,
           "num_hidden_layers": size.layers, "num_attention_heads": size.heads, "num_key_value_heads": size.kv_heads,
           "max_position_embeddings": size.max_positions, "tie_word_embeddings": True}
    return {**cfg, "use_sliding_window": False} if arch == "qwen2" else cfg


def encode_example(tokenizer: Any, template: PromptTemplate, problem: Problem) -> tuple[list[int], int]:
    """``(ids, n_prompt)``: the joint encoding of prompt + reference response, EOS appended; the first
    ``n_prompt`` ids are the prompt. Raises when a token straddles the prompt/response boundary (the
    tokenizer would then not reproduce its own generations)."""
    prompt = template.render(problem)
    enc = tokenizer(prompt + reference_response(problem), add_special_tokens=template.add_special_tokens,
                    return_offsets_mapping=True)
    ids, offs = list(enc.input_ids), list(enc.offset_mapping)
    cut = next(i for i, (s, e) in enumerate(offs) if e > len(prompt))
    if offs[cut][0] < len(prompt):
        raise ValueError(f"a token straddles the prompt/response boundary of {problem.prompt_id!r}: {offs[cut]}")
    return ids + [int(tokenizer.eos_token_id)], cut


def _batch(examples: Sequence[tuple[list[int], int]], pad_id: int) -> dict[str, torch.Tensor]:
    width = max(len(ids) for ids, _ in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    labels = torch.full_like(ids, -100)
    for i, (seq, cut) in enumerate(examples):
        ids[i, : len(seq)] = torch.tensor(seq)
        mask[i, : len(seq)] = 1
        labels[i, cut : len(seq)] = torch.tensor(seq[cut:])
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def greedy_accuracy(model: Any, tokenizer: Any, template: PromptTemplate, problems: Sequence[Problem],
                    max_new_tokens: int = 12) -> float:
    """Greedy accuracy of ``model`` on ``problems`` under the arithmetic checker (the HF engine)."""
    if not problems:
        return float("nan")
    engine = HFEngine(model, tokenizer, max_batch_size=256)
    prompts = [list(tokenizer(template.render(p), add_special_tokens=template.add_special_tokens).input_ids)
               for p in problems]
    out = engine.generate(prompts, 1, SamplingConfig(max_new_tokens=max_new_tokens, greedy=True))
    return sum(arithmetic_reward(s[0].text, p.gold, finish_reason=s[0].finish_reason)
               for s, p in zip(out, problems, strict=True)) / len(problems)


def _sample(problems: list[Problem], k: int | None, key: str) -> list[Problem]:
    return problems if k is None or len(problems) <= k else random.Random(f"sft-eval:{key}").sample(problems, k)


def sft_policy(*, name: str, arch: str, tokenizer: Any, task: ArithmeticTask, families: Sequence[str],
               out_dir: str | Path, size: ArchSize = ArchSize(), sft: SFTConfig = SFTConfig(),
               template: TemplateConfig | None = None, max_new_tokens: int = 12,
               eval_max: int | None = None) -> dict[str, Any]:
    """Build, SFT on ``families`` and save policy ``name`` to ``out_dir``; returns its report
    (``params``, ``train_s``, ``final_loss`` and ``accuracy[family][split]``: greedy, on at most
    ``eval_max`` problems per cell, a fixed sample)."""
    template = template or TemplateConfig(text="{question}\n")
    tpl = PromptTemplate(template, tokenizer, policy=f"demo policy {name!r}")
    model = build_model(PolicyConfig(name=name, model_config=arch_config(arch, size)), tokenizer, seed=sft.seed)
    examples = [encode_example(tokenizer, tpl, p) for p in task.problems("train", families)]
    if not examples:
        raise ValueError(f"demo policy {name!r}: no training problems in families {list(families)}")
    opt = torch.optim.AdamW(model.parameters(), lr=sft.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / max(1, sft.warmup)) * max(0.05, 1.0 - s / max(1, sft.steps)))
    rng = random.Random(f"sft:{sft.seed}:{name}")
    pad = int(tokenizer.pad_token_id)
    model.train()
    t0 = time.perf_counter()
    loss = torch.tensor(float("nan"))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(sft.seed + 1)  # dropout-free models; kept for any stochastic layer
        for _ in range(sft.steps):
            loss = model(**_batch(rng.choices(examples, k=sft.batch), pad)).loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
    train_s = time.perf_counter() - t0
    model.eval()
    acc = {f: {split: greedy_accuracy(model, tokenizer, tpl, _sample(task.problems(split, [f]), eval_max, f"{f}:{split}"),
                                      max_new_tokens)
               for split in ("train", "eval")} for f in task.family_names}
    report = {"name": name, "arch": arch, "families": list(families), "params": sum(p.numel() for p in model.parameters()),
              "vocab": len(tokenizer), "train_s": train_s, "final_loss": float(loss.item()), "accuracy": acc,
              "size": asdict(size), "sft": asdict(sft)}
    meta = {"name": name, "template": to_mapping(template), "dtype": "fp32",
            "sampling": {"temperature": 1.0, "top_p": 1.0, "max_new_tokens": max_new_tokens}, "version": 0,
            "sft": report}
    save_policy(model, tokenizer, out_dir, meta)
    return report
