"""The HF engine: sampling with a KV cache from a transformers causal LM, recording behaviour log-probs.

The sampling loop is written out (rather than ``model.generate``) so that the recorded log-prob is
exactly the project's definition — ``log_softmax(logits / temperature)`` over the full vocabulary at
the sampled token — whatever top-p removes from the sampling distribution.

**Seeds.** Every sequence (``n`` copies of each prompt, prompt-major) has its own ``torch.Generator``:
seeded ``row_seeds[k]`` (``sampling.seeding: sample``), else derived from the call's ``seed`` and the flat
index ``k`` (:func:`call_row_seed`, as the vLLM engine derives its request seeds), else drawn from the global
torch RNG. A sequence's ``t``-th token uses the ``t``-th uniform of its generator (:func:`inverse_cdf`), so a
sample is a pure function of (weights, prompt, its seed) whatever else is in flight.

**Batch.** Sequences are prefilled in groups, left-padded (``position_ids`` from the attention mask), with
logits at the last position only (``logits_to_keep=1``; for a model whose forward takes no such argument,
the base model's last hidden state through the output embeddings). Each decode step samples every row on the
model's device (no host copy of the ``[B, V]`` distribution); finished rows leave the batch and its KV cache,
and waiting sequences are prefilled into the freed rows (continuous batching; :mod:`mrl_llm.rollout.hf_batch`),
as many in flight as :func:`~mrl_llm.rollout.hf_batch.rows_that_fit` allows within ``max_batch_size``.

**Shared prompts** (``share_prompts``, the default). A group's rows that hold the same prompt (the ``n`` copies of
a prompt, or equal prompts) are prefilled once: the group's distinct prompts run through the model, then their
cache rows, last positions and last logits are repeated, one per sequence, before any row samples. The padded
layout of every row is the one of prefilling each copy (the distinct prompts have the same longest length), so
the samples are the same up to the float rounding of a smaller batch's matmuls; each row keeps its own seed,
its place in the admission order and the ``logits_hook``'s view. A prompt whose copies are split over two
admissions (a memory- or ``max_batch_size``-capped batch) is prefilled once in each. ``share_prompts=False``
prefills every copy (the reference the tests and ``experiments/bench/real_step.py`` compare against).

A sequence stops at the first EOS id (kept, with its log-prob; ``finish_reason = "stop"``) or after
``max_new_tokens`` (``"length"``), or earlier (``"length"``) where prompt + response fill the model's
``max_position_embeddings``, as vLLM stops at ``max_model_len``. A prompt token outside the model's
vocabulary, a prompt that fills the positions, and non-finite log-probs (NaN weights, or a temperature so
small that ``logits / T`` overflows float32) are errors.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence

import numpy as np
import torch

from mrl_llm.rollout.base import RolloutEngine, Sample, SamplingConfig, check_prompts
from mrl_llm.rollout.hf_batch import merge_rows, mergeable, rows_that_fit, select_rows

#: ``hook(rows, steps, logits) -> logits``: the flat index of each row in flight, the tokens it has sampled,
#: and its next-token logits ``[B, V]``; what it returns is the model's output for every purpose (sampling and
#: the recorded log-prob), as a vLLM logits processor (tests and benchmarks force EOS with it)
LogitsHook = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def eos_ids_of(model: torch.nn.Module, tokenizer) -> list[int]:
    """EOS ids: the tokenizer's EOS plus the model's generation config's (which may list several)."""
    ids = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen = getattr(model, "generation_config", None)
    extra = getattr(gen, "eos_token_id", None) if gen is not None else None
    if isinstance(extra, int):
        ids.add(extra)
    elif extra:
        ids.update(int(i) for i in extra)
    if not ids:
        raise ValueError("the tokenizer has no eos_token and the model's generation config names none; set one")
    return sorted(ids)


def top_p_filter(logp: torch.Tensor, top_p: float) -> torch.Tensor:
    """Log-probs with the tokens outside the top-p nucleus set to -inf (the most likely is always kept)."""
    if top_p >= 1.0:
        return logp
    sorted_lp, order = torch.sort(logp, descending=True, dim=-1)
    probs = sorted_lp.exp()
    before = probs.cumsum(-1) - probs  # mass strictly above each token
    drop_sorted = before >= top_p
    drop_sorted[..., 0] = False
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logp.masked_fill(drop, float("-inf"))


def inverse_cdf(logp: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """One token per row of ``softmax(logp)``: the first index whose cumulative mass (fp64, on ``logp``'s
    device) exceeds ``u * total`` for the row's uniform ``u`` in ``[0, 1)``; a token of probability 0 is never
    drawn. An order of magnitude faster than ``torch.multinomial`` on a 150k vocabulary."""
    cdf = logp.detach().double().exp_().cumsum_(-1)  # in place: one fp64 [B, V] at a time
    idx = torch.searchsorted(cdf, u.to(cdf).reshape(-1, 1) * cdf[:, -1:], right=True)
    return idx.clamp(max=cdf.shape[-1] - 1).squeeze(-1)


def sample_from(logp: torch.Tensor, gen: torch.Generator | Sequence[torch.Generator] | None) -> torch.Tensor:
    """:func:`inverse_cdf` with ``u ~ U[0, 1)`` from ``gen`` (one fp64 uniform per row; a list of generators:
    row ``i`` draws from ``gen[i]``)."""
    if isinstance(gen, Sequence):
        u = torch.cat([torch.rand(1, generator=g, dtype=torch.float64) for g in gen])
    else:
        u = torch.rand(logp.shape[0], generator=gen, dtype=torch.float64)
    return inverse_cdf(logp, u.to(logp.device))


def call_row_seed(seed: int, k: int) -> int:
    """The seed of flat sequence ``k`` in a call seeded ``seed`` (``sampling.seeding: call``)."""
    return int(np.random.SeedSequence([int(seed) % 2**63, k]).generate_state(1, np.uint64)[0]) % 2**63


class HFEngine(RolloutEngine):
    """Samples from ``model`` (a transformers causal LM) with ``tokenizer``'s EOS/pad ids.

    ``max_batch_size``: the most sequences in flight (the batch is otherwise sized from memory, module
    docstring); ``logits_hook``: :data:`LogitsHook`; ``share_prompts``: prefill each distinct prompt of an
    admitted group once (module docstring). When the engine holds the trainer's own model object
    (colocated, the CPU default), weight sync is free: :meth:`sync_weights` with that object is a no-op.
    With a separate copy it copies the weights.
    """

    def __init__(self, model: torch.nn.Module, tokenizer, *, max_batch_size: int = 64,
                 logits_hook: LogitsHook | None = None, share_prompts: bool = True) -> None:
        self.model = model
        self.share_prompts = bool(share_prompts)
        self.tokenizer = tokenizer
        self.max_batch_size = max(1, int(max_batch_size))
        self.logits_hook = logits_hook
        self.eos_ids = eos_ids_of(model, tokenizer)
        pad = tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else self.eos_ids[0])
        positions = getattr(getattr(model, "config", None), "max_position_embeddings", None)
        #: the model's positions (prompt + response); None when its config names none
        self.max_positions = int(positions) if positions else None
        self._keeps_logits = "logits_to_keep" in inspect.signature(model.forward).parameters
        if not self._keeps_logits and not (hasattr(model, "get_decoder") and hasattr(model, "get_output_embeddings")):
            raise ValueError(f"{type(model).__name__}: its forward takes no logits_to_keep and it has no get_decoder() "
                             "and get_output_embeddings(), so the HF engine cannot compute the prefill's logits at the "
                             "last position only; pass a transformers causal LM")

    def sync_weights(self, model: torch.nn.Module) -> None:
        if model is self.model:
            return
        self.model.load_state_dict(model.state_dict())

    def generate(
        self, prompt_token_ids: Sequence[Sequence[int]], n: int, sampling: SamplingConfig
    ) -> list[list[Sample]]:
        if n < 1:
            raise ValueError(f"n (samples per prompt) must be >= 1, got {n}")
        emb = self.model.get_input_embeddings() if hasattr(self.model, "get_input_embeddings") else None
        check_prompts(prompt_token_ids, vocab_size=getattr(emb, "num_embeddings", None), max_len=self.max_positions)
        flat = [list(p) for p in prompt_token_ids for _ in range(n)]
        sampling.check_rows(len(flat))
        if not flat:
            return []
        if sampling.row_seeds is not None:
            seeds = [int(s) % 2**63 for s in sampling.row_seeds]
        elif sampling.seed is not None:
            seeds = [call_row_seed(sampling.seed, k) for k in range(len(flat))]
        else:
            seeds = torch.randint(0, 2**63 - 1, (len(flat),)).tolist()
        was_training = self.model.training
        self.model.eval()
        try:
            tok_m, lp_m, limits = self._decode(flat, seeds, sampling)
        finally:
            self.model.train(was_training)
        samples = [self._sample(tok_m[k, : limits[k]], lp_m[k, : limits[k]], sampling) for k in range(len(flat))]
        return [samples[i * n : (i + 1) * n] for i in range(len(prompt_token_ids))]

    def _prefill(self, prompts: list[list[int]], device: torch.device):
        """The group's cache, mask, last positions and last-position logits ``[B, V]``."""
        B, L = len(prompts), max(len(p) for p in prompts)
        ids = torch.full((B, L), self.pad_id, dtype=torch.long)
        attn = torch.zeros((B, L), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, L - len(p) :] = torch.tensor(p)
            attn[i, L - len(p) :] = 1
        ids, attn = ids.to(device), attn.to(device)
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        kw = dict(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=True)
        if self._keeps_logits:
            out = self.model(**kw, logits_to_keep=1)
            logits = out.logits[:, -1]
        else:  # the last hidden state only through the LM head, never [B, L, V]
            out = self.model.get_decoder()(**kw)
            logits = self.model.get_output_embeddings()(out.last_hidden_state[:, -1])
        return out.past_key_values, attn, pos[:, -1], logits

    def _prefill_group(self, prompts: list[list[int]], device: torch.device):
        """:meth:`_prefill` of an admitted group; with ``share_prompts`` each distinct prompt runs once and its
        cache row, last position and logits are repeated for each of its rows (module docstring)."""
        if not self.share_prompts:
            return self._prefill(prompts, device)
        first: dict[tuple[int, ...], int] = {}
        expand = [first.setdefault(tuple(p), len(first)) for p in prompts]
        if len(first) == len(prompts):
            return self._prefill(prompts, device)
        cache, attn, pos, logits = self._prefill([list(p) for p in first], device)
        idx = torch.tensor(expand, device=device)
        cache, attn = select_rows(cache, attn, idx)
        return cache, attn, pos[idx], logits[idx]

    @torch.no_grad()
    def _decode(self, flat: list[list[int]], seeds: list[int], sp: SamplingConfig):
        """Every sequence's tokens and log-probs ``[N, T]`` (host) and its token limit (module docstring)."""
        device = next(self.model.parameters()).device
        N = len(flat)
        room = [self.max_positions if self.max_positions is not None else len(p) + sp.max_new_tokens for p in flat]
        limits = [min(sp.max_new_tokens, r - len(p)) for p, r in zip(flat, room, strict=True)]  # >= 1 (check_prompts)
        T = max(limits)
        cap = rows_that_fit(self.model, max(len(p) for p in flat), T, self.max_batch_size)
        uniforms = None
        if not sp.greedy:  # the t-th token of sequence k uses the t-th draw of its generator
            uniforms = torch.stack([torch.rand(T, generator=torch.Generator().manual_seed(s), dtype=torch.float64)
                                    for s in seeds]).to(device)
        out_tok = torch.full((N, T), self.pad_id, dtype=torch.long, device=device)
        out_lp = torch.zeros((N, T), dtype=torch.float32, device=device)
        limit_all = torch.tensor(limits, device=device)
        eos = torch.tensor(self.eos_ids, device=device)
        merge_ok = True
        waiting = 0  # the next sequence to admit
        rows = torch.zeros(0, dtype=torch.long, device=device)  # flat index of each row in flight
        steps = torch.zeros(0, dtype=torch.long, device=device)  # tokens sampled so far
        cache = attn = pos = logits = tok = None
        while waiting < N or len(rows):
            free = cap - len(rows)
            if waiting < N and free >= min(N - waiting, max(1, cap // 4)) and (merge_ok or not len(rows)):
                group = list(range(waiting, min(N, waiting + free)))
                waiting = group[-1] + 1
                g_cache, g_attn, g_pos, g_logits = self._prefill_group([flat[k] for k in group], device)
                merge_ok = mergeable(g_cache)
                if len(rows):  # the rows in flight take their step, then the group joins them
                    cache, attn, pos, logits = self._step(cache, attn, pos, tok)
                    cache, attn = merge_rows(cache, attn, g_cache, g_attn)
                    pos, logits = torch.cat([pos, g_pos]), torch.cat([logits, g_logits])
                else:
                    cache, attn, pos, logits = g_cache, g_attn, g_pos, g_logits
                g_rows = torch.tensor(group, device=device)
                rows, steps = torch.cat([rows, g_rows]), torch.cat([steps, torch.zeros_like(g_rows)])
            elif tok is not None:
                cache, attn, pos, logits = self._step(cache, attn, pos, tok)
            if self.logits_hook is not None:
                logits = self.logits_hook(rows, steps, logits)
            logp = torch.log_softmax(logits.float().div_(sp.temperature), dim=-1)
            logits = None  # from here the step's [B, V] working set is logp and the draw's fp64 CDF only
            if sp.greedy:
                tok = logp.argmax(-1)
            else:
                tok = inverse_cdf(top_p_filter(logp, sp.top_p), uniforms[rows, steps])
            out_tok[rows, steps] = tok
            out_lp[rows, steps] = logp.gather(-1, tok[:, None]).squeeze(-1)
            logp = None  # not held through the next forward
            steps = steps + 1
            done = torch.isin(tok, eos) | (steps >= limit_all[rows])
            keep = (~done).nonzero().squeeze(-1)
            if len(keep) < len(rows):  # finished rows leave the batch and its cache
                rows, steps, tok, pos, logits = rows[keep], steps[keep], tok[keep], pos[keep], None
                if len(rows):
                    cache, attn = select_rows(cache, attn, keep)
                else:
                    cache = attn = pos = tok = None
        return out_tok.cpu(), out_lp.cpu(), limits

    def _step(self, cache, attn: torch.Tensor, pos: torch.Tensor, tok: torch.Tensor):
        """One decode step of the rows in flight: their next-token logits ``[B, V]``."""
        attn = torch.cat([attn, torch.ones_like(attn[:, :1])], dim=1)
        pos = pos + 1
        out = self.model(input_ids=tok[:, None], attention_mask=attn, position_ids=pos[:, None],
                         past_key_values=cache, use_cache=True)
        return out.past_key_values, attn, pos, out.logits[:, -1]

    def _sample(self, toks: torch.Tensor, lps: torch.Tensor, sp: SamplingConfig) -> Sample:
        row = toks.tolist()
        eos_set = set(self.eos_ids)
        end = next((k + 1 for k, x in enumerate(row) if x in eos_set), None)
        reason = "stop" if end is not None else "length"
        end = end if end is not None else len(row)
        if not bool(torch.isfinite(lps[:end]).all()):
            raise RuntimeError(
                f"the policy's log-probs are not finite (NaN/inf) at temperature {sp.temperature:g}: its "
                "weights hold NaN/inf (training diverged: restore a checkpoint, lower the learning rate) or the "
                "temperature is too small for float32 logits (raise it, or sample with greedy=True)")
        ids = tuple(row[:end])
        lp = tuple(min(0.0, x) for x in lps[:end].tolist())
        text = self.tokenizer.decode(list(ids), skip_special_tokens=True)
        return Sample(token_ids=ids, logprobs=lp, finish_reason=reason, text=text)
