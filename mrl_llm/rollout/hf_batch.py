"""The HF engine's batch in flight: its KV cache's rows, and how many rows fit in memory.

**Rows.** The batch is left-padded: row ``i`` of the cache holds ``attn[i].sum()`` real positions at its right
end. :func:`select_rows` keeps some rows (finished ones leave) and trims the left columns no kept row uses;
:func:`merge_rows` appends a newly prefilled group, left-padding the shorter cache with masked zeros. Both
act on a transformers ``DynamicCache`` of plain ``DynamicLayer`` s (``[B, heads, S, head_dim]`` keys and
values: llama, qwen2/3, mistral without a sliding window, gpt2, ...); other caches (sliding windows, hybrid
or recurrent state) are only row-selected with the cache's own ``batch_select_indices`` and never merged
(:func:`mergeable`), so the engine then admits a new group only when the batch is empty.

**Memory.** One sequence in flight costs (:func:`sequence_bytes`, ``e`` the bytes per element of the
model's dtype)::

    kv       = 2 L h_kv e (prompt_len + max_new_tokens)      # the KV cache at its longest
    sampling = SAMPLING_BYTES_PER_VOCAB * V                  # one decode step's [B, V] tensors, per row
    prefill  = e P (4 h + 2 I) + e n_heads P^2               # one layer's activations over its prompt (P)

and :func:`rows_that_fit` admits ``floor(MEMORY_FRACTION * free / sequence_bytes)`` rows, capped by the
engine's ``max_batch_size`` (``sampling.max_batch_size``) — free: the device's free memory plus what the
torch allocator has cached (CUDA), or ``MemAvailable`` (CPU).
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

#: the bytes per vocabulary entry of one row's decode step: the logits (model dtype, then fp32), their
#: scaled copy and log-softmax (fp32), top-p's sort (fp32 values + int64 order + mask) and the fp64 exp and
#: cumsum of the inverse-CDF draw -- an upper bound of what is live at once
SAMPLING_BYTES_PER_VOCAB = 64
#: the share of the free memory one generate call may plan for (the rest: allocator slack, the caller)
MEMORY_FRACTION = 0.5


def _plain_layers(cache) -> list | None:
    layers = getattr(cache, "layers", None)
    if not layers:
        return None
    try:
        from transformers.cache_utils import DynamicLayer
    except ImportError:  # pragma: no cover - transformers without per-layer caches
        return None
    return layers if all(type(layer) is DynamicLayer for layer in layers) else None


def mergeable(cache) -> bool:
    """Whether ``cache`` is a transformers ``DynamicCache`` of plain layers (module docstring)."""
    return _plain_layers(cache) is not None


def select_rows(cache, attn: torch.Tensor, keep: torch.Tensor):
    """``(cache, attn)`` with only the rows ``keep`` (indices), the left columns none of them uses dropped."""
    attn = attn[keep]
    layers = _plain_layers(cache)
    if layers is None:
        cache.batch_select_indices(keep)
        return cache, attn
    used = attn.any(0).nonzero()
    start = int(used[0, 0]) if len(used) else attn.shape[1]
    for layer in layers:
        if layer.keys is not None and layer.keys.numel():
            layer.keys = layer.keys[keep, :, start:]
            layer.values = layer.values[keep, :, start:]
    return cache, attn[:, start:]


def merge_rows(cache_a, attn_a: torch.Tensor, cache_b, attn_b: torch.Tensor):
    """One cache (into ``cache_a``) and mask holding ``a``'s rows then ``b``'s, each left-padded to the longer."""
    la, lb = _plain_layers(cache_a), _plain_layers(cache_b)
    if la is None or lb is None or len(la) != len(lb):
        raise ValueError("only DynamicCaches of plain layers can be merged; admit new rows into an empty batch")
    s = max(attn_a.shape[1], attn_b.shape[1])

    def pad(x: torch.Tensor, n: int) -> torch.Tensor:  # n masked positions on the left of the sequence axis
        return F.pad(x, (0, 0, n, 0)) if x.dim() == 4 else F.pad(x, (n, 0))

    pa, pb = s - attn_a.shape[1], s - attn_b.shape[1]
    for a, b in zip(la, lb, strict=True):
        a.keys = torch.cat([pad(a.keys, pa), pad(b.keys, pb)])
        a.values = torch.cat([pad(a.values, pa), pad(b.values, pb)])
    return cache_a, torch.cat([pad(attn_a, pa), pad(attn_b, pb)])


def _size(config, *names: str, default: int | None = None) -> int:
    for name in names:
        v = getattr(config, name, None)
        if isinstance(v, int) and v > 0:
            return v
    if default is None:
        raise ValueError(f"the model's config has none of {names}; the HF engine cannot size its batch")
    return default


def sequence_bytes(model: torch.nn.Module, prompt_len: int, max_new_tokens: int) -> int:
    """The bytes one sequence in flight takes (module docstring's equation), from ``model.config``."""
    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    e = next(model.parameters()).element_size()
    h = _size(cfg, "hidden_size", "n_embd", "d_model")
    heads = _size(cfg, "num_attention_heads", "n_head")
    head_dim = _size(cfg, "head_dim", default=h // heads)
    kv_heads = _size(cfg, "num_key_value_heads", default=heads)
    layers = _size(cfg, "num_hidden_layers", "n_layer")
    inter = _size(cfg, "intermediate_size", "n_inner", default=4 * h)
    vocab = _size(cfg, "vocab_size")
    kv = 2 * layers * kv_heads * head_dim * e * (prompt_len + max_new_tokens)
    prefill = e * prompt_len * (4 * h + 2 * inter) + e * heads * prompt_len**2
    return int(kv + SAMPLING_BYTES_PER_VOCAB * vocab + prefill)


def free_bytes(device: torch.device) -> int:
    """The memory a generate call may use on ``device``: CUDA's free memory plus the allocator's cached
    blocks; on the CPU the kernel's ``MemAvailable`` (else the free pages)."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device))
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def rows_that_fit(model: torch.nn.Module, prompt_len: int, max_new_tokens: int, cap: int,
                  free: int | None = None) -> int:
    """The rows in flight: ``min(cap, floor(MEMORY_FRACTION * free / sequence_bytes))``; an error naming the
    sizes when not even one sequence fits."""
    need = sequence_bytes(model, prompt_len, max_new_tokens)
    device = next(model.parameters()).device
    budget = MEMORY_FRACTION * (free_bytes(device) if free is None else free)
    rows = int(budget // need)
    if rows < 1:
        raise MemoryError(f"the HF engine cannot fit one sequence of {prompt_len} + {max_new_tokens} positions: it "
                          f"needs {need / 2**30:.2f} GiB, {budget / 2**30:.2f} GiB is its share of the free memory on "
                          f"{device}; lower sampling.max_new_tokens or max_prompt_len, or free memory")
    return min(cap, rows)
