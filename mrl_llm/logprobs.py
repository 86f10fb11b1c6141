"""The trainer's view of log-probs: one forward over prompt + response, padded into a batch.

``log pi(y_t | x, y_<t) = log_softmax(logits_t / temperature)[y_t]`` over the full vocabulary
(:func:`shared_interfaces.losses.token_logprobs`), the same definition every rollout engine records, so
at the same weights the recomputation equals the engine's trace up to float error (the drift check
compares the two).

Layout: each sequence is ``prompt + response``, right-padded to the batch's longest; the logits at
position ``k`` predict token ``k + 1``, so the response tokens' log-probs are read at positions
``len(prompt) - 1 .. len(prompt) + len(response) - 2``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

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
    model: torch.nn.Module, batch: PackedBatch, temperature: float = 1.0, *, with_entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(logp [B, L - 1], entropy [B, L - 1] or None)`` of the packed batch (differentiable).

    Only the positions from the shortest prompt's last token on can hold response tokens, so the LM
    head and the log-softmax run on that window alone (``logits_to_keep``); positions before it are 0.
    With a large vocabulary this is most of the cost of a step.
    """
    device = next(model.parameters()).device
    B, L = batch.input_ids.shape
    start = max(0, min(batch.prompt_lens, default=1) - 1)
    kwargs = dict(input_ids=batch.input_ids.to(device), attention_mask=batch.attention_mask.to(device), use_cache=False)
    try:
        logits = model(**kwargs, logits_to_keep=torch.arange(start, L - 1, device=device)).logits
    except TypeError:  # an architecture without logits_to_keep: compute every position
        logits = model(**kwargs).logits[:, start:-1]
    targets = batch.targets[:, start:].to(device)
    logp = token_logprobs(logits, targets, temperature)
    ent = entropy_from_logits(logits.detach() / temperature) if with_entropy else None
    if start > 0:
        logp = torch.cat([logp.new_zeros(B, start), logp], dim=1)
        ent = None if ent is None else torch.cat([ent.new_zeros(B, start), ent], dim=1)
    return logp, ent


@torch.no_grad()
def response_logprobs(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    *,
    pad_id: int,
    temperature: float = 1.0,
    micro_batch: int = 16,
) -> list[list[float]]:
    """Each response's per-token log-probs under ``model`` (no gradient), in micro-batches."""
    was_training = model.training
    model.eval()
    out: list[list[float]] = []
    try:
        for s in range(0, len(prompts), max(1, micro_batch)):
            batch = pack(prompts[s : s + micro_batch], responses[s : s + micro_batch], pad_id)
            logp, _ = forward_logprobs(model, batch, temperature)
            logp = logp.float().cpu()
            for i in range(logp.shape[0]):
                out.append(logp[i][batch.response_mask[i]].tolist())
    finally:
        model.train(was_training)
    return out
