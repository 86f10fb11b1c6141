"""The trainer's view of log-probs: one forward over prompt + response, padded into a batch.

``log pi(y_t | x, y_<t) = log_softmax(logits_t / temperature)[y_t]`` over the full vocabulary
(:func:`shared_interfaces.losses.token_logprobs`), the same definition every rollout engine records, so
at the same weights the recomputation equals the engine's trace up to float error (the drift check
compares the two).

Layout: each sequence is ``prompt + response``, right-padded to the batch's longest; the logits at
position ``k`` predict token ``k + 1``, so the response tokens' log-probs are read at positions
``len(prompt) - 1 .. len(prompt) + len(response) - 2``.

Chunked (``chunk_size``, :func:`chunked_forward_logprobs`): the backbone runs once; the LM head, the
log-softmax and the gather run over the response positions only, ``chunk_size`` at a time, each chunk
under activation checkpointing, so at most one chunk's ``[chunk, V]`` logits are alive (forward and
backward) instead of ``[B, L, V]``. The numbers are the unchunked ones (a test pins 1e-6 in fp32). An FSDP2-sharded
model takes the same path as a registered forward method of its root unit (a test pins 2 ranks chunked against
one process unchunked, 1e-6 in gradients).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from shared_interfaces.losses import entropy_from_logits, token_logprobs


@dataclass
class PackedBatch:
    """Right-padded ``input_ids``/``attention_mask [B, L]`` and, per row, the response's slice in the
    shifted (``[B, L - 1]``) log-prob layout: ``response_mask [B, L - 1]`` marks response tokens and
    ``targets [B, L - 1]`` holds the next tokens."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    targets: torch.Tensor
    response_mask: torch.Tensor
    prompt_lens: list[int]
    response_lens: list[int]


def pack(prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]], pad_id: int) -> PackedBatch:
    """Pack ``prompt + response`` pairs (see the module docstring). Every prompt needs at least one token."""
    if len(prompts) != len(responses):
        raise ValueError(f"{len(prompts)} prompts but {len(responses)} responses")
    seqs = []
    for i, (p, r) in enumerate(zip(prompts, responses, strict=True)):
        if len(p) == 0:
            raise ValueError(f"sequence {i}: the prompt is empty; a prompt needs at least one token (e.g. BOS)")
        seqs.append(list(p) + list(r))
    L = max(2, max((len(s) for s in seqs), default=2))
    B = len(seqs)
    input_ids = torch.full((B, L), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((B, L), dtype=torch.long)
    response_mask = torch.zeros((B, L - 1), dtype=torch.bool)
    for i, s in enumerate(seqs):
        input_ids[i, : len(s)] = torch.tensor(s, dtype=torch.long)
        attention_mask[i, : len(s)] = 1
        p = len(prompts[i])
        response_mask[i, p - 1 : p - 1 + len(responses[i])] = True
    return PackedBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        targets=input_ids[:, 1:],
        response_mask=response_mask,
        prompt_lens=[len(p) for p in prompts],
        response_lens=[len(r) for r in responses],
    )


def forward_logprobs(
    model: torch.nn.Module, batch: PackedBatch, temperature: float = 1.0, *, with_entropy: bool = False,
    chunk_size: int | None = None, share_prefix: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(logp [B, L - 1], entropy [B, L - 1] or None)`` of the packed batch (differentiable).

    Only the positions from the shortest prompt's last token on can hold response tokens, so the LM
    head and the log-softmax run on that window alone (``logits_to_keep``); positions before it are 0.
    With a large vocabulary this is most of the cost of a step. ``chunk_size``: the chunked path
    (:func:`chunked_forward_logprobs`; values at the response positions only, 0 elsewhere) where the
    model allows it (:func:`chunkable`). ``share_prefix``: each distinct prompt through the backbone once
    (:func:`mrl_llm.prefix_logprobs.shared_prefix_logprobs`; values at the response positions only) where the
    model allows it (:func:`mrl_llm.prefix_logprobs.shareable`).
    """
    if share_prefix:
        from mrl_llm.prefix_logprobs import shareable, shared_prefix_logprobs

        if shareable(model):
            return shared_prefix_logprobs(model, batch, temperature, with_entropy=with_entropy, chunk_size=chunk_size)
    if chunk_size and chunkable(model):
        return chunked_forward_logprobs(model, batch, temperature, with_entropy=with_entropy, chunk_size=chunk_size)
    device = next(model.parameters()).device
    B, L = batch.input_ids.shape
    start = max(0, min(batch.prompt_lens, default=1) - 1)
    kwargs = dict(input_ids=batch.input_ids.to(device), attention_mask=batch.attention_mask.to(device), use_cache=False)
    try:
        logits = model(**kwargs, logits_to_keep=torch.arange(start, L - 1, device=device)).logits
    except TypeError:  # an architecture without logits_to_keep: compute every position
        logits = model(**kwargs).logits
    if logits.shape[1] == L:  # every position: without logits_to_keep, or a forward(**kwargs) that ignored it
        logits = logits[:, start:-1]
    targets = batch.targets[:, start:].to(device)
    logp = token_logprobs(logits, targets, temperature)
    ent = entropy_from_logits(logits.detach() / temperature) if with_entropy else None
    if start > 0:
        logp = torch.cat([logp.new_zeros(B, start), logp], dim=1)
        ent = None if ent is None else torch.cat([ent.new_zeros(B, start), ent], dim=1)
    return logp, ent


#: config keys of logit transforms that happen inside the CausalLM's forward after the LM head; a model
#: with any of them set takes the unchunked path (the chunked one applies the head alone).
LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale")


def chunkable(model: torch.nn.Module) -> bool:
    """Whether ``model`` is backbone (``model.base_model``) + output head and nothing after the head. An
    FSDP2-sharded model qualifies too: the chunked pass then runs as a registered forward method of the root
    unit (:func:`_sharded_chunked`), so the root's hooks gather its shards (embeddings, final norm, head) for
    the pass and its backward, and reduce their gradients, as they do around ``forward``."""
    head, base = model.get_output_embeddings(), getattr(model, "base_model", model)
    cfg = getattr(model, "config", None)
    return (head is not None and base is not model
            and not any(getattr(cfg, k, None) not in (None, 1, 1.0) for k in LOGIT_TRANSFORMS))


#: the root unit's forward method for the chunked pass, registered with FSDP2 on first use
SHARDED_METHOD = "mrl_chunked_logprobs"


def _sharded_chunked(model: torch.nn.Module, batch: PackedBatch, temperature: float, *, with_entropy: bool,
                     chunk_size: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The chunked pass of an FSDP2 root module, through ``register_fsdp_forward_method`` (FSDP2 runs its
    pre-/post-forward hooks around the method as around ``forward``: gather before, reshard after, the
    pre-backward gather and the gradient reduce-scatter of the root's parameters)."""
    import types

    from torch.distributed.fsdp import register_fsdp_forward_method

    if not hasattr(model, SHARDED_METHOD):
        setattr(model, SHARDED_METHOD, types.MethodType(_chunked, model))
        register_fsdp_forward_method(model, SHARDED_METHOD)
    return getattr(model, SHARDED_METHOD)(batch, temperature, with_entropy=with_entropy, chunk_size=chunk_size)


def _chunk_logp(head: torch.nn.Module, h: torch.Tensor, targets: torch.Tensor, temperature: float,
                with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``log_softmax(head(h) / T)[targets]`` (float32) and, detached, the entropy at ``T`` (or an empty tensor)."""
    logits = head(h)
    logp = token_logprobs(logits, targets, temperature)
    ent = entropy_from_logits(logits.detach() / temperature) if with_entropy else logp.new_empty(0)
    return logp, ent


def chunked_forward_logprobs(
    model: torch.nn.Module, batch: PackedBatch, temperature: float = 1.0, *, with_entropy: bool = False,
    chunk_size: int = 1024,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`forward_logprobs` with the LM head in checkpointed chunks of ``chunk_size`` response positions
    (module docstring): ``h = backbone(x)[response positions]``; per chunk ``c``,
    ``logp_c = log_softmax(head(h_c) / T)[y_c]`` recomputed in the backward pass rather than stored, and
    the entropy from the same logits without a graph. ``[B, L - 1]`` outputs, 0 off the response."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    from torch.distributed.fsdp import FSDPModule

    if isinstance(model, FSDPModule):
        return _sharded_chunked(model, batch, temperature, with_entropy=with_entropy, chunk_size=chunk_size)
    return _chunked(model, batch, temperature, with_entropy=with_entropy, chunk_size=chunk_size)


def _chunked(model: torch.nn.Module, batch: PackedBatch, temperature: float, *, with_entropy: bool,
             chunk_size: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    device = next(model.parameters()).device
    B, L = batch.input_ids.shape
    hidden = model.base_model(input_ids=batch.input_ids.to(device), attention_mask=batch.attention_mask.to(device),
                              use_cache=False).last_hidden_state
    mask = batch.response_mask.to(device)
    h = hidden[:, :-1][mask]  # [n, H]: the positions that predict a response token
    flat, flat_ent = head_logprobs(model.get_output_embeddings(), h, batch.targets.to(device)[mask], temperature,
                                   with_entropy=with_entropy, chunk_size=chunk_size)
    logp = torch.zeros((B, L - 1), dtype=flat.dtype, device=device).masked_scatter(mask, flat)
    ent = None
    if with_entropy:
        ent = torch.zeros((B, L - 1), dtype=flat_ent.dtype, device=device).masked_scatter(mask, flat_ent)
    return logp, ent


def head_logprobs(head: torch.nn.Module, h: torch.Tensor, targets: torch.Tensor, temperature: float, *,
                  with_entropy: bool, chunk_size: int | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The log-probs of ``targets [n]`` from the hidden states ``h [n, H]`` through the LM ``head`` (and, with
    ``with_entropy``, the entropies), ``chunk_size`` rows at a time (None: all at once), each chunk checkpointed when
    a graph is built: ``[n]`` each; entropies None without ``with_entropy``; ``n = 0`` gives empty tensors."""
    step = chunk_size or max(h.shape[0], 1)
    lps, ents = [], []
    for s in range(0, h.shape[0], step):
        args = (head, h[s : s + step], targets[s : s + step], temperature, with_entropy)
        if torch.is_grad_enabled() and h.requires_grad:
            lp, ent = checkpoint(_chunk_logp, *args, use_reentrant=False)
        else:
            lp, ent = _chunk_logp(*args)
        lps.append(lp)
        ents.append(ent)
    flat = torch.cat(lps) if lps else h.new_zeros(0, dtype=torch.float32)
    if not with_entropy:
        return flat, None
    return flat, torch.cat(ents) if ents else flat.detach()




def response_logprobs(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    **kwargs: Any,
) -> list[list[float]]:
    """:func:`response_logprob_rows` as lists of floats (same arguments)."""
    return [t.tolist() for t in response_logprob_rows(model, prompts, responses, **kwargs)]


@torch.no_grad()
def response_logprob_rows(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    *,
    pad_id: int,
    temperature: float = 1.0,
    micro_batch: int = 16,
    groups: Sequence[Sequence[int]] | None = None,
    chunk_size: int | None = None,
    share_prefix: bool = False,
) -> list[torch.Tensor]:
    """Each response's per-token log-probs under ``model`` (no gradient; float32 ``[len]`` each, on the CPU), in micro-batches of
    ``micro_batch`` rows, or of the row indices ``groups`` (e.g. token-budget groups,
    :mod:`mrl_llm.micro_batches`); ``chunk_size`` and ``share_prefix`` as in :func:`forward_logprobs`."""
    was_training = model.training
    model.eval()
    if groups is None:
        step = max(1, micro_batch)
        groups = [range(s, min(len(prompts), s + step)) for s in range(0, len(prompts), step)]
    out: list[torch.Tensor | None] = [None] * len(prompts)
    try:
        for g in groups:
            g = list(g)
            batch = pack([prompts[i] for i in g], [responses[i] for i in g], pad_id)
            logp, _ = forward_logprobs(model, batch, temperature, chunk_size=chunk_size, share_prefix=share_prefix)
            logp = logp.float().cpu()
            for k, i in enumerate(g):
                out[i] = logp[k][batch.response_mask[k]]
    finally:
        model.train(was_training)
    missing = [i for i, v in enumerate(out) if v is None]
    if missing:
        raise ValueError(f"response_logprobs: groups leave rows {missing[:5]} out; every row needs one group")
    return out  # type: ignore[return-value]
