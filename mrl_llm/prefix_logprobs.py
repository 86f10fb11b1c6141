"""Shared-prefix log-probs: each distinct prompt of a micro-batch through the backbone once (``train.share_prefix``).

A GRPO micro-batch holds several responses to each of a few prompts, and the plain pass
(:func:`mrl_llm.logprobs.forward_logprobs`) runs every row's prompt + response through the backbone: with few-shot
prompts of ~100-200 tokens and responses of <= 16, nearly all of its tokens are prompt copies. Here, for rows ``i``
whose prompt is the distinct prompt ``x_j`` (``j = j(i)``) and whose response is ``y_i``::

    h_x, kv_x = backbone(x_j)                          # the distinct prompts, left-padded, KV cache kept (with grad)
    h_y       = backbone(y_i[:-1] | kv_x[j(i)])        # each row's response after its prompt's cache row
    logp_i,0  = log_softmax(head(h_x[j(i), last]) / T)[y_i,0]
    logp_i,t  = log_softmax(head(h_y[i, t - 1]) / T)[y_i,t]      t >= 1

which is the plain pass's function of the weights (attention is causal: a prompt's states do not depend on what
follows it; positions continue from each prompt's length), so the values and the gradients are the plain pass's
up to float rounding (``tests/llm/test_prefix_logprobs.py`` pins them). The cache rows are repeated by indexing,
whose backward sums each response's gradient into its prompt's states. The LM head, log-softmax and entropy run
over the response positions in checkpointed chunks, as in :func:`mrl_llm.logprobs.chunked_forward_logprobs`.

It applies to a chunkable model (:func:`mrl_llm.logprobs.chunkable`) that is not FSDP-sharded and does not
checkpoint its layers (a checkpointed layer keeps no cache); :func:`shareable` says so, and
:func:`~mrl_llm.logprobs.forward_logprobs` takes the plain pass otherwise. Micro-batches whose rows all have
distinct prompts gain nothing (one prompt pass per row plus one response pass).
"""

from __future__ import annotations

import torch

from mrl_llm.logprobs import PackedBatch, chunkable, head_logprobs
from mrl_llm.rollout.hf_batch import select_rows


def shareable(model: torch.nn.Module) -> bool:
    """Whether :func:`shared_prefix_logprobs` applies to ``model`` (module docstring)."""
    from torch.distributed.fsdp import FSDPModule

    return (chunkable(model) and not isinstance(model, FSDPModule)
            and not getattr(model, "is_gradient_checkpointing", False))


def shared_prefix_logprobs(model: torch.nn.Module, batch: PackedBatch, temperature: float = 1.0, *,
                           with_entropy: bool = False, chunk_size: int | None = 1024,
                           ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`mrl_llm.logprobs.forward_logprobs`'s ``(logp, entropy)`` in its ``[B, L - 1]`` layout (0 off the
    response), with each distinct prompt of ``batch`` run once (module docstring). ``chunk_size``: response
    positions per LM-head chunk (None: one chunk)."""
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    device = next(model.parameters()).device
    B, L = batch.input_ids.shape
    mask = batch.response_mask.to(device)
    logp = torch.zeros((B, L - 1), dtype=torch.float32, device=device)
    ent = torch.zeros((B, L - 1), dtype=torch.float32, device=device) if with_entropy else None
    if B == 0 or not bool(mask.any()):
        return logp, ent
    pad = 0  # any id: padding is masked
    rows = batch.input_ids.tolist()
    first: dict[tuple[int, ...], int] = {}
    owner = [first.setdefault(tuple(r[:p]), len(first)) for r, p in zip(rows, batch.prompt_lens, strict=True)]
    distinct = list(first)
    Lp = max(len(p) for p in distinct)
    p_ids = torch.full((len(distinct), Lp), pad, dtype=torch.long)
    p_attn = torch.zeros((len(distinct), Lp), dtype=torch.long)
    for j, p in enumerate(distinct):
        p_ids[j, Lp - len(p):] = torch.tensor(p)
        p_attn[j, Lp - len(p):] = 1
    p_ids, p_attn = p_ids.to(device), p_attn.to(device)
    base = model.base_model
    out = base(input_ids=p_ids, attention_mask=p_attn, position_ids=(p_attn.cumsum(-1) - 1).clamp(min=0),
               use_cache=True)
    idx = torch.tensor(owner, device=device)
    h_rows = [out.last_hidden_state[:, -1][idx][:, None]]  # [B, 1, H]: predicts each response's first token
    Lr = max(batch.response_lens) - 1
    if Lr > 0:  # the responses but their last token, right-padded, after their prompt's cache row
        r_ids = torch.full((B, Lr), pad, dtype=torch.long)
        r_attn = torch.zeros((B, Lr), dtype=torch.long)
        for i, (r, p, n) in enumerate(zip(rows, batch.prompt_lens, batch.response_lens, strict=True)):
            if n > 1:
                r_ids[i, : n - 1] = torch.tensor(r[p : p + n - 1])
                r_attn[i, : n - 1] = 1
        cache, attn = select_rows(out.past_key_values, p_attn, idx)
        pos = torch.tensor(batch.prompt_lens)[:, None] + torch.arange(Lr)[None]
        h_y = base(input_ids=r_ids.to(device), attention_mask=torch.cat([attn, r_attn.to(device)], dim=1),
                   position_ids=pos.to(device), past_key_values=cache, use_cache=True).last_hidden_state
        h_rows.append(h_y)
    hidden = torch.cat(h_rows, dim=1)  # [B, Lr + 1, H]: position t predicts response token t
    lens = torch.tensor(batch.response_lens, device=device)
    h = hidden[torch.arange(hidden.shape[1], device=device)[None] < lens[:, None]]  # row-major, as mask's order
    flat, flat_ent = head_logprobs(model.get_output_embeddings(), h, batch.targets.to(device)[mask], temperature,
                                   with_entropy=with_entropy, chunk_size=chunk_size)
    logp = logp.to(flat.dtype).masked_scatter(mask, flat)
    if with_entropy:
        ent = ent.masked_scatter(mask, flat_ent.to(ent.dtype))
    return logp, ent
