"""Per-device memory estimates for one policy's trainer and rollout engine (the MWRA planner's input).

Everything is in bytes; ``e`` is the bytes per element of the policy's dtype (fp32: 4, bf16/fp16: 2),
``b`` the training micro-batch, ``s = prompt_len + max_response_len``, ``h`` the hidden size,
``h_q = n_heads * head_dim``, ``h_kv = n_kv_heads * head_dim``, ``I`` the MLP width, ``L`` the layers,
``V`` the vocabulary and ``N`` the parameter count (:attr:`ModelShape.n_params`).

Training state, sharded FSDP-style over ``k`` devices (``k = 1``: unsharded):

* weights ``N w / k`` (+ the gathered FSDP units when ``k > 1``: a layer and the root unit ``(N_layer + N_root) e``
  (the root, ``N_root = N - L N_layer``: embeddings, final norm and LM head, stays gathered through each forward
  and backward, :mod:`mrl_llm.parallel.fsdp`), or the whole model
  ``N e`` with ``fsdp_unit: model`` or ``grad_sync: mini_batch``; ``fsdp_unit: none``, replicas: ``k = 1`` for all of the state), where ``w = 4`` under mixed
  precision (``e < 4`` and ``master_weights``: the trainable weights ARE the fp32 master copy and forward
  and backward run under autocast, :mod:`mrl_llm.precision`), else ``w = e``;
* gradients ``N w / k`` (they land on the weights: fp32 under mixed precision; + ``4 N``, the whole gradient
  accumulated unsharded in fp32, with ``k > 1`` and ``grad_sync: mini_batch``);
* optimizer ``8 N / k`` for AdamW (fp32 first and second moments), nothing for SGD;
* a frozen reference model for the k3 KL (``kl_coef > 0``): ``N e / k`` (a copy in the compute dtype; + ``N e``,
  kept gathered, with ``k > 1`` and ``grad_sync: mini_batch``).

Training activations, per device (Korthikanti et al. 2022, "Reducing Activation Recomputation",
re-derived for what a Hugging Face decoder layer saves for its backward with attention in a fused kernel, so no
``s^2`` term, no dropout, gated MLPs; counted from ``saved_tensors_hooks`` on a Qwen2 layer). In one precision
(``e`` throughout) one layer stores ``A = e s b (7h + 2h_q + 2h_kv + 4I)``: per norm its input and normalised
output (``2h`` each), the inputs of QKV and of the MLP (``h`` each; the ``3h`` of the norms' residual stream),
Q/K/V and the attention output, the MLP's gate/up/act/product (``4I`` -> ``2I`` for ungated MLPs: GPT-2). Under
mixed precision the residual stream stays fp32 (autocast leaves adds and norms in fp32), so the norms' tensors are
fp32 and every projection saves its own bf16 cast of its input:
``A = s b (16h + e (5h + 2h_q + 2h_kv + 4I))``. Without gradient checkpointing all ``L`` layers keep ``A``; with it
each keeps only its input, ``r s b h`` (``r = 4`` under mixed precision: the fp32 residual stream, else ``e``), and
one layer's ``A`` is live during recomputation. The LM head adds the logits ``e c V`` and their fp32 log-softmax
with its gradient ``2 * 4 c V`` over ``c`` positions: all ``b s`` of the micro-batch unchunked, or one chunk
``c = min(logprob_chunk, b s)`` when log-probs are computed in checkpointed chunks
(:func:`mrl_llm.logprobs.forward_logprobs`). ``b s`` is ``micro_batch * s``, or the token budget
``max_tokens_per_micro_batch`` when one is set. Under mixed precision autocast keeps a compute-dtype cast of every
weight a matmul reads for the region of a micro-batch's forward (its backward holds them too) and of an HF engine's
``generate`` call: ``N_c e`` (:func:`autocast_cache_bytes`; ``N_c``: ``N`` less an untied input embedding, which is
looked up, not multiplied). The backward adds one layer's activation gradients (about ``A``) and the LM head's
weight gradient as it arrives, before it is added to the accumulated one (:func:`backward_grad_bytes`). AdamW's
multi-tensor step allocates ``sqrt(v)`` for every parameter, ``4 N / k``, while the gradients are alive and the
activations are gone: the activations term is ``max(casts + (L + 1) A + logits + head gradient, 4 N / k)``
(:func:`training_bytes`).

A whole model in one process, ``N w`` (:func:`full_model_bytes`): with ``k > 1`` FSDP ranks every trainer rank keeps one
beside its shards — the unsharded rollout copy the gathered weights land in after each update
(:attr:`mrl_llm.rank.model.PolicyModel.rollout_model`): on the device when the rank's engine samples from
it (``hf``) or reloads out of it (``vllm``), in host RAM on a split policy's trainer ranks, which have no
engine and hand it to the rollout actors — and a split policy's rollout actor holds one (its whole policy,
in fp32 like a trainer's masters). The HF engine samples from a fp32 copy under autocast: its casts, ``N_c e``,
are counted with the engine when the copy is not the trained model (:mod:`mrl_llm.distributed.planner`).

Rollout engine: its own weights copy ``N e`` unless it samples from a model of the same process (the
``hf`` engine), the KV cache ``2 L h_kv e (prompt_len + max_response_len)`` per sequence in
flight, and the sampling logits per sequence (:func:`sampling_bytes_per_sequence`): vLLM's ``2 * 4 V``; the HF
engine's step logits at the last position ``e V`` and three fp32 ``[V]`` working tensors (tempered logits,
log-softmax, the draw's) ``12 V``, plus its prefill's transients over the prompt (one layer's MLP in the compute
dtype and the fp32 residual stream, ``prompt_len (3 e I + 8 h)``). A ``vllm`` engine beside its trainer (colocated,
or a CPU slot) also gets, at each sync, the trainer's whole state dict cast to the engine's dtype, ``N e`` when
``e < 4``. Each process adds a fixed runtime overhead (CUDA context, allocator slack, Python + torch),
:attr:`MemoryModel.process_overhead_gib`.

Host RAM: a checkpoint of ``k > 1`` FSDP ranks gathers the optimizer state to rank 0 alone
(:mod:`mrl_llm.parallel.checkpoint`): ``8 N`` (AdamW) on rank 0's node (:func:`checkpoint_host_bytes`).

Not counted: the CUDA caching allocator's fragmentation beyond the overhead, NCCL's buffers, a vLLM engine's CUDA
graphs and its own activations (inside its ``gpu_memory_utilization`` share), K and V repeated to the query heads
where a padded micro-batch keeps SDPA from its native grouped-query path (``2 e h_q`` more per token and layer), the HF
prefill's logits at every prompt position (an engine that asks for them needs ``B P V e`` more), and host copies of a
sync's buckets.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Literal

GiB = 1024**3
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}

Dtype = Literal["fp32", "bf16", "fp16"]


#: The ``config.json`` keys :meth:`ModelShape.from_hf_config` reads as integers.
SIZE_KEYS = ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "intermediate_size",
             "vocab_size", "head_dim", "n_embd", "n_layer", "n_head", "n_inner", "n_positions")


class ShapeError(ValueError):
    """A model shape could not be determined; the message says what to pass instead."""


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a decoder-only transformer that decide its memory (llama/qwen/mistral/phi/gpt2)."""

    n_layers: int
    hidden_size: int
    n_heads: int
    n_kv_heads: int
    intermediate_size: int
    vocab_size: int
    head_dim: int = 0  # 0: hidden_size // n_heads
    tie_embeddings: bool = False
    attention_bias: bool = False
    gated_mlp: bool = True
    learned_positions: int = 0  # GPT-2's position table rows
    qk_norm: bool = False  # per-head RMSNorm of q and k (Gemma-3): 2 * head_dim weights a layer
    sandwich_norms: bool = False  # RMSNorm before and after attention and the MLP (Gemma-3): 4 a layer, not 2

    def __post_init__(self) -> None:
        for f in ("n_layers", "hidden_size", "n_heads", "n_kv_heads", "intermediate_size", "vocab_size"):
            if getattr(self, f) < 1:
                raise ShapeError(f"model shape: {f} must be >= 1, got {getattr(self, f)}")
        if self.head_dim == 0:
            object.__setattr__(self, "head_dim", self.hidden_size // self.n_heads)
        if self.head_dim < 1:
            raise ShapeError(f"model shape: head_dim must be >= 1, got {self.head_dim} (hidden_size "
                             f"{self.hidden_size} // {self.n_heads} heads); give head_dim or fewer attention heads")

    @property
    def q_width(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.n_kv_heads * self.head_dim

    @property
    def layer_params(self) -> int:
        h, hq, hkv, inter = self.hidden_size, self.q_width, self.kv_width, self.intermediate_size
        attn = h * hq + 2 * h * hkv + hq * h
        if self.attention_bias:
            attn += hq + 2 * hkv + (h if not self.gated_mlp else 0)
        mlp = (3 * h * inter) if self.gated_mlp else (2 * h * inter + inter + h)
        norms = (4 if self.sandwich_norms else 2) * h if self.gated_mlp else 4 * h  # RMSNorm; LayerNorm w + b
        return attn + mlp + norms + (2 * self.head_dim if self.qk_norm else 0)

    @property
    def n_params(self) -> int:
        h = self.hidden_size
        embed = self.vocab_size * h + self.learned_positions * h
        head = 0 if self.tie_embeddings else self.vocab_size * h
        final_norm = h if self.gated_mlp else 2 * h
        return embed + head + self.n_layers * self.layer_params + final_norm

    @classmethod
    def from_hf_config(cls, cfg: Mapping[str, Any], *, where: str = "config.json") -> ModelShape:
        """From a Hugging Face ``config.json`` mapping (llama-like keys, or GPT-2's ``n_embd`` ...)."""
        try:
            if cfg.get("model_type") == "gpt2" or "n_embd" in cfg:
                h = int(cfg["n_embd"])
                return cls(
                    n_layers=int(cfg["n_layer"]), hidden_size=h, n_heads=int(cfg["n_head"]),
                    n_kv_heads=int(cfg["n_head"]), intermediate_size=int(cfg.get("n_inner") or 4 * h),
                    vocab_size=int(cfg["vocab_size"]), tie_embeddings=True, attention_bias=True,
                    gated_mlp=False, learned_positions=int(cfg.get("n_positions", 1024)),
                )
            n_heads = int(cfg["num_attention_heads"])
            gemma3 = cfg.get("model_type") == "gemma3_text"
            return cls(
                n_layers=int(cfg["num_hidden_layers"]), hidden_size=int(cfg["hidden_size"]), n_heads=n_heads,
                n_kv_heads=int(cfg.get("num_key_value_heads") or n_heads),
                intermediate_size=int(cfg["intermediate_size"]), vocab_size=int(cfg["vocab_size"]),
                head_dim=int(cfg.get("head_dim") or 0), tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                attention_bias=bool(cfg.get("attention_bias", cfg.get("model_type") == "qwen2")),
                qk_norm=gemma3, sandwich_norms=gemma3,
            )
        except KeyError as err:
            raise ShapeError(f"{where}: missing key {err.args[0]!r} needed for the memory estimate") from err
        except (TypeError, ValueError) as err:
            if isinstance(err, ShapeError):
                raise
            optional = ("num_key_value_heads", "head_dim", "n_inner")  # null: the default
            bad = {k: v for k, v in cfg.items() if k in SIZE_KEYS and not (isinstance(v, int) and not isinstance(v, bool))
                   and not (v is None and k in optional)}
            raise ShapeError(f"{where}: the model's sizes must be integers, got {bad or err}; fix them in the "
                             "config") from err

    @classmethod
    def from_model_dir(cls, path: str | Path) -> ModelShape:
        p = Path(path) / "config.json"
        if not p.is_file():
            raise ShapeError(
                f"model directory {Path(path)} has no config.json; create the model there first, or give "
                "the policy a known architecture name (one of "
                f"{sorted(KNOWN_SHAPES)}) or an explicit shape in the plan"
            )
        return cls.from_hf_config(json.loads(p.read_text(encoding="utf-8")), where=str(p))


#: Public ``config.json`` values of the paper's models, so a cluster can be planned before the
#: weights are on disk. Keys are the Hugging Face repo names (without the organisation).
KNOWN_SHAPES: dict[str, ModelShape] = {
    "Qwen2.5-Math-1.5B": ModelShape(28, 1536, 12, 2, 8960, 151936, tie_embeddings=True, attention_bias=True),
    "Qwen3-1.7B-Base": ModelShape(28, 2048, 16, 8, 6144, 151936, head_dim=128, tie_embeddings=True),
    "Llama-2-7b-hf": ModelShape(32, 4096, 32, 32, 11008, 32000),
    "Mistral-7B-v0.1": ModelShape(32, 4096, 32, 8, 14336, 32000),
    "phi-4": ModelShape(40, 5120, 40, 10, 17920, 100352),
    # the real CPU pair (python -m mrl_llm models prepare writes models/<these names, lower-cased>)
    "SmolLM2-135M-Instruct": ModelShape(30, 576, 9, 3, 1536, 49152, tie_embeddings=True),
    "gemma-3-270m": ModelShape(18, 640, 4, 1, 2048, 262144, head_dim=256, tie_embeddings=True, qk_norm=True,
                               sandwich_norms=True),
}


def known_shape(name: str) -> ModelShape | None:
    """The shape of a known model whose name (or a path ending in it) matches, case-insensitively."""
    base = Path(str(name).rstrip("/")).name.lower()
    for key, shape in KNOWN_SHAPES.items():
        if key.lower() == base:
            return shape
    return None


@dataclass(frozen=True)
class PolicyFootprint:
    """What one policy needs, as the planner sees it (built from the policy's config)."""

    name: str
    shape: ModelShape
    dtype: Dtype = "bf16"
    rollouts_per_step: int = 8  # prompts per step x group size
    prompt_len: int = 256
    max_response_len: int = 256
    micro_batch: int = 1
    grad_checkpointing: bool = False
    optimizer: Literal["adamw", "sgd"] = "adamw"
    master_weights: bool = True
    kl_coef: float = 0.0
    logprob_chunk: int = 0  # positions per checkpointed LM-head chunk (0: unchunked)
    max_tokens_per_micro_batch: int = 0  # padded tokens per micro-batch (0: micro_batch rows of seq_len)
    engine: Literal["hf", "vllm"] = "vllm"
    max_num_seqs: int = 256  # the engine's cap on sequences in flight
    tokenizer_id: str = ""
    ranks: int = 1  # CPU mode: the policy's worker-group size (one CPU slot per rank)
    fsdp_unit: Literal["layer", "model", "none"] = "layer"  # what one FSDP2 all-gather holds; none: whole replicas
    grad_sync: Literal["micro_batch", "mini_batch"] = "micro_batch"  # mini_batch: units kept gathered, fp32 grads unsharded

    def __post_init__(self) -> None:
        for f in ("rollouts_per_step", "max_response_len", "micro_batch", "max_num_seqs", "ranks"):
            if getattr(self, f) < 1:
                raise ValueError(f"policy {self.name!r}: {f} must be >= 1, got {getattr(self, f)}")
        if self.dtype not in DTYPE_BYTES:
            raise ValueError(f"policy {self.name!r}: dtype {self.dtype!r} is not one of {sorted(DTYPE_BYTES)}")
        if self.fsdp_unit not in ("layer", "model", "none"):
            raise ValueError(f"policy {self.name!r}: fsdp_unit {self.fsdp_unit!r} is not 'layer', 'model' or 'none'")
        if self.grad_sync not in ("micro_batch", "mini_batch"):
            raise ValueError(f"policy {self.name!r}: grad_sync {self.grad_sync!r} is not 'micro_batch' or 'mini_batch'")

    @property
    def n_params(self) -> int:
        return self.shape.n_params

    @property
    def seq_len(self) -> int:
        return self.prompt_len + self.max_response_len

    @property
    def micro_tokens(self) -> int:
        """``b s``: padded tokens of one training micro-batch (the token budget when one is set)."""
        return self.max_tokens_per_micro_batch or self.micro_batch * self.seq_len

    @property
    def logits_positions(self) -> int:
        """Positions whose full-vocabulary logits are alive at once (one chunk when chunked)."""
        return min(self.logprob_chunk, self.micro_tokens) if self.logprob_chunk else self.micro_tokens

    @property
    def step_cost(self) -> float:
        """``N * rollouts * seq_len``: the split key of :func:`shared_interfaces.mwra.plan_proportional`."""
        return float(self.n_params) * self.rollouts_per_step * self.seq_len


@dataclass(frozen=True)
class MemoryModel:
    """The planner's constants (documented choices, overridable from the cluster file)."""

    usable_fraction: float = 0.9  # of each GPU / node RAM, the rest is headroom (vLLM's default 0.9)
    process_overhead_gib: float = 1.0  # CUDA context + allocator slack per process on a GPU
    host_process_gib: float = 0.5  # Python + torch per actor process in host RAM

    def __post_init__(self) -> None:
        if not (0 < self.usable_fraction <= 1):
            raise ValueError(f"usable_fraction must be in (0, 1], got {self.usable_fraction}")
        for f in ("process_overhead_gib", "host_process_gib"):
            if not (0 <= getattr(self, f) < float("inf")):
                raise ValueError(f"{f} must be a finite number >= 0 (GiB per process), got {getattr(self, f)}")


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes one policy puts on one device, by kind (the plan's per-GPU table)."""

    weights: float = 0.0
    gradients: float = 0.0
    optimizer: float = 0.0
    activations: float = 0.0
    kv_cache: float = 0.0
    overhead: float = 0.0

    @property
    def total(self) -> float:
        return sum(getattr(self, f.name) for f in fields(self))

    def __add__(self, other: MemoryBreakdown) -> MemoryBreakdown:
        return MemoryBreakdown(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))

    def gib(self) -> dict[str, float]:
        d = {f.name: getattr(self, f.name) / GiB for f in fields(self)}
        d["total"] = self.total / GiB
        return d


def mixed(p: PolicyFootprint) -> bool:
    """Whether ``p`` trains fp32 masters under autocast (:mod:`mrl_llm.precision`)."""
    return DTYPE_BYTES[p.dtype] < 4 and p.master_weights


def layer_activation_bytes(p: PolicyFootprint) -> float:
    """One layer's saved activations (module docstring): ``A = e s b (7h + 2h_q + 2h_kv + 4I)`` in one precision,
    ``s b (16h + e (5h + 2h_q + 2h_kv + 4I))`` under mixed precision (``2I`` for ungated MLPs)."""
    sh, e = p.shape, DTYPE_BYTES[p.dtype]
    mlp = (4 if sh.gated_mlp else 2) * sh.intermediate_size
    attn = 2 * sh.q_width + 2 * sh.kv_width
    if mixed(p):
        return p.micro_tokens * (16 * sh.hidden_size + e * (5 * sh.hidden_size + attn + mlp))
    return e * p.micro_tokens * (7 * sh.hidden_size + attn + mlp)


def autocast_cache_bytes(p: PolicyFootprint) -> float:
    """``N_c e``: autocast's compute-dtype casts of the weights a matmul reads (module docstring); 0 without
    mixed precision."""
    if not mixed(p):
        return 0.0
    sh = p.shape
    looked_up = sh.learned_positions * sh.hidden_size + (0 if sh.tie_embeddings else sh.vocab_size * sh.hidden_size)
    return float((p.n_params - looked_up) * DTYPE_BYTES[p.dtype])


def backward_grad_bytes(p: PolicyFootprint) -> float:
    """``(e + 4) V h`` under mixed precision (``e V h`` otherwise): the LM head's weight gradient as the backward makes
    it, in the compute dtype and cast to the fp32 master's, before it is added to the accumulated one."""
    sh, e = p.shape, DTYPE_BYTES[p.dtype]
    return float((e + (4 if mixed(p) else 0)) * sh.vocab_size * sh.hidden_size)


def optimizer_step_bytes(p: PolicyFootprint, shards: int = 1) -> float:
    """``4 N / k``: the ``sqrt(v)`` AdamW's multi-tensor step allocates for every parameter (0 for SGD)."""
    return 4.0 * p.n_params / shards if p.optimizer == "adamw" else 0.0


def training_bytes(p: PolicyFootprint, shards: int = 1) -> MemoryBreakdown:
    """The trainer's footprint on each of ``shards`` devices (module docstring); replicas (``fsdp_unit: none``)
    hold the whole training state on each, whatever ``shards``."""
    if shards < 1:
        raise ValueError(f"shards must be >= 1, got {shards}")
    if p.fsdp_unit == "none":
        shards = 1
    sh, e, n = p.shape, DTYPE_BYTES[p.dtype], p.n_params
    whole = full_model_bytes(p).weights  # N w
    kept = shards > 1 and p.grad_sync == "mini_batch"  # every unit gathered through a mini-batch, grads unsharded
    root = n - sh.n_layers * sh.layer_params  # embeddings, final norm, LM head: the root unit, gathered through each pass
    gathered = (sh.layer_params + root if p.fsdp_unit == "layer" and not kept else n) * e  # gathered at once
    weights = whole / shards + (gathered if shards > 1 else 0)
    if p.kl_coef > 0:
        weights += n * e / shards + (n * e if kept else 0)
    gradients = whole / shards + (4 * n if kept else 0)  # + the fp32 accumulator of the whole gradient
    moments = 8 if p.optimizer == "adamw" else 0
    layer = layer_activation_bytes(p)
    tokens = p.micro_tokens
    if p.grad_checkpointing:
        acts = sh.n_layers * (4 if mixed(p) else e) * tokens * sh.hidden_size + layer
    else:
        acts = sh.n_layers * layer
    c = p.logits_positions
    acts += e * c * sh.vocab_size + 2 * 4 * c * sh.vocab_size
    acts += layer + backward_grad_bytes(p)  # a layer's activation gradients; the largest weight's gradient arriving
    # FSDP2 gathers compute-dtype units (MixedPrecisionPolicy): autocast has nothing to cast on sharded models
    casts = autocast_cache_bytes(p) if shards == 1 else 0.0
    if casts and p.logprob_chunk:  # the checkpointed LM head casts its weight chunk by chunk, outside autocast's cache:
        casts -= e * sh.vocab_size * sh.hidden_size  # not held into the backward, where that weight's gradient arrives
    acts = max(casts + acts, optimizer_step_bytes(p, shards))
    return MemoryBreakdown(weights=weights, gradients=gradients, optimizer=n * moments / shards, activations=acts)


def full_model_bytes(p: PolicyFootprint) -> MemoryBreakdown:
    """``N w``: one whole, unsharded model in the trainer's weight width (module docstring)."""
    e = DTYPE_BYTES[p.dtype]
    return MemoryBreakdown(weights=p.n_params * (4 if (e < 4 and p.master_weights) else e))


def kv_bytes_per_sequence(p: PolicyFootprint) -> float:
    """``2 L h_kv e (prompt_len + max_response_len)``: one sequence's KV cache at full length."""
    return 2 * p.shape.n_layers * p.shape.kv_width * DTYPE_BYTES[p.dtype] * p.seq_len


def sampling_bytes_per_sequence(p: PolicyFootprint) -> float:
    """One sequence's sampling working memory (module docstring): vLLM ``8 V``; the HF engine
    ``(e + 12) V + prompt_len (3 e I + 8 h)``."""
    sh, e = p.shape, DTYPE_BYTES[p.dtype]
    if p.engine == "vllm":
        return 2 * 4 * sh.vocab_size
    return (e + 12) * sh.vocab_size + p.prompt_len * (3 * e * sh.intermediate_size + 8 * sh.hidden_size)


def sync_copy_bytes(p: PolicyFootprint) -> float:
    """``N e``: the trainer's state dict cast to a low-precision ``vllm`` engine's dtype at each sync (0 otherwise)."""
    return float(p.n_params * DTYPE_BYTES[p.dtype]) if p.engine == "vllm" and DTYPE_BYTES[p.dtype] < 4 else 0.0


def checkpoint_host_bytes(p: PolicyFootprint, n_train: int) -> float:
    """``8 N``: the AdamW state a checkpoint of ``n_train > 1`` FSDP ranks gathers into rank 0's host RAM (0 for one
    rank, whole replicas, or SGD)."""
    if n_train <= 1 or p.fsdp_unit == "none" or p.optimizer != "adamw":
        return 0.0
    return 8.0 * p.n_params


def rollout_bytes(p: PolicyFootprint, concurrent_seqs: int, *, own_weights: bool) -> MemoryBreakdown:
    """The rollout engine's footprint on one device with ``concurrent_seqs`` sequences in flight;
    ``own_weights=False`` when it samples from a model of the same process (the ``hf`` engine)."""
    return MemoryBreakdown(
        weights=p.n_params * DTYPE_BYTES[p.dtype] if own_weights else 0.0,
        activations=sampling_bytes_per_sequence(p) * concurrent_seqs,
        kv_cache=kv_bytes_per_sequence(p) * concurrent_seqs,
    )
