"""The HF engine: sampling with a KV cache from a transformers causal LM, recording behaviour log-probs.

The sampling loop is written out (rather than ``model.generate``) so that the recorded log-prob is
exactly the project's definition — ``log_softmax(logits / temperature)`` over the full vocabulary at
the sampled token — whatever top-p removes from the sampling distribution, and so that one seeded
``torch.Generator`` per call makes the samples a pure function of (weights, prompts, seed).

Prompts are left-padded into a batch (``position_ids`` from the attention mask), ``n`` copies each,
in chunks of ``max_batch_size`` sequences. A sequence stops at the first EOS id (kept, with its
log-prob; ``finish_reason = "stop"``) or after ``max_new_tokens`` (``"length"``), or earlier (``"length"``)
where prompt + response fill the model's ``max_position_embeddings``, as vLLM stops at ``max_model_len``.
A prompt token outside the model's vocabulary, a prompt that fills the positions, and non-finite
log-probs (NaN weights, or a temperature so small that ``logits / T`` overflows float32) are errors.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mrl_llm.rollout.base import RolloutEngine, Sample, SamplingConfig, check_prompts


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


def sample_from(logp: torch.Tensor, gen: torch.Generator | Sequence[torch.Generator] | None) -> torch.Tensor:
    """One token per row from ``softmax(logp)`` by inverse CDF: the first index whose cumulative mass
    exceeds ``u * total`` with ``u ~ U[0, 1)`` from ``gen`` (one uniform per row; a token of probability
    0 is never drawn; a list of generators: row ``i`` draws from ``gen[i]``). An order of magnitude faster
    than ``torch.multinomial`` on a 150k vocabulary."""
    cdf = logp.detach().double().cpu().exp().cumsum(-1)
    if isinstance(gen, Sequence):
        u = torch.cat([torch.rand((1, 1), generator=g, dtype=torch.float64) for g in gen])
    else:
        u = torch.rand((cdf.shape[0], 1), generator=gen, dtype=torch.float64)
    idx = torch.searchsorted(cdf, u * cdf[:, -1:], right=True)
    return idx.clamp(max=cdf.shape[-1] - 1).squeeze(-1)


class HFEngine(RolloutEngine):
    """Samples from ``model`` (a transformers causal LM) with ``tokenizer``'s EOS/pad ids.

    When the engine holds the trainer's own model object (colocated, the CPU default), weight sync is
    free: :meth:`sync_weights` with that object is a no-op. With a separate copy it copies the weights.
    """

    def __init__(self, model: torch.nn.Module, tokenizer, *, max_batch_size: int = 64) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.max_batch_size = max(1, int(max_batch_size))
        self.eos_ids = eos_ids_of(model, tokenizer)
        pad = tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else self.eos_ids[0])
        positions = getattr(getattr(model, "config", None), "max_position_embeddings", None)
        #: the model's positions (prompt + response); None when its config names none
        self.max_positions = int(positions) if positions else None

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
        gen: torch.Generator | list[torch.Generator] | None = None
        if sampling.row_seeds is not None:  # one generator per sequence
            gen = [torch.Generator().manual_seed(int(s) % 2**63) for s in sampling.row_seeds]
        elif sampling.seed is not None:
            gen = torch.Generator().manual_seed(sampling.seed)
        samples: list[Sample] = []
        was_training = self.model.training
        self.model.eval()
        try:
            for s in range(0, len(flat), self.max_batch_size):
                g = gen[s : s + self.max_batch_size] if isinstance(gen, list) else gen
                samples.extend(self._sample_chunk(flat[s : s + self.max_batch_size], sampling, g))
        finally:
            self.model.train(was_training)
        return [samples[i * n : (i + 1) * n] for i in range(len(prompt_token_ids))]

    @torch.no_grad()
    def _sample_chunk(
        self, prompts: list[list[int]], sp: SamplingConfig, gen: torch.Generator | list[torch.Generator] | None
    ) -> list[Sample]:
        device = next(self.model.parameters()).device
        B, L = len(prompts), max(len(p) for p in prompts)
        ids = torch.full((B, L), self.pad_id, dtype=torch.long)
        attn = torch.zeros((B, L), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, L - len(p) :] = torch.tensor(p)
            attn[i, L - len(p) :] = 1
        ids, attn = ids.to(device), attn.to(device)
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        out = self.model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=True)
        past, logits = out.past_key_values, out.logits[:, -1]
        eos = torch.tensor(self.eos_ids, device=device)
        room = self.max_positions if self.max_positions is not None else L + sp.max_new_tokens
        limits = [min(sp.max_new_tokens, room - len(p)) for p in prompts]  # >= 1 (check_prompts)
        limit = torch.tensor(limits, device=device)
        done = torch.zeros(B, dtype=torch.bool, device=device)
        toks, lps = [], []
        for t in range(max(limits)):
            logp = torch.log_softmax(logits.float() / sp.temperature, dim=-1)
            if sp.greedy:
                tok = logp.argmax(-1)
            else:
                tok = sample_from(top_p_filter(logp, sp.top_p), gen).to(device)
            toks.append(torch.where(done, self.pad_id, tok))
            lps.append(logp.gather(-1, tok[:, None]).squeeze(-1))
            done = done | torch.isin(tok, eos) | (limit <= t + 1)
            if bool(done.all()):
                break
            attn = torch.cat([attn, torch.ones((B, 1), dtype=attn.dtype, device=device)], dim=1)
            pos = pos[:, -1:] + 1
            if self.max_positions is not None:  # only rows already done reach the end (their limit)
                pos = pos.clamp(max=self.max_positions - 1)
            out = self.model(input_ids=tok[:, None], attention_mask=attn, position_ids=pos,
                             past_key_values=past, use_cache=True)
            past, logits = out.past_key_values, out.logits[:, -1]
        tok_m = torch.stack(toks, 1).cpu()
        lp_m = torch.stack(lps, 1).float().cpu()
        samples = []
        eos_set = set(self.eos_ids)
        for i in range(B):
            row = tok_m[i, : limits[i]].tolist()
            end = next((k + 1 for k, x in enumerate(row) if x in eos_set), None)
            reason = "stop" if end is not None else "length"
            end = end if end is not None else len(row)
            ids_i = tuple(row[:end])
            if not bool(torch.isfinite(lp_m[i, :end]).all()):
                raise RuntimeError(
                    f"the policy's log-probs are not finite (NaN/inf) at temperature {sp.temperature:g}: its "
                    "weights hold NaN/inf (training diverged: restore a checkpoint, lower the learning rate) or the "
                    "temperature is too small for float32 logits (raise it, or sample with greedy=True)")
            lp_i = tuple(min(0.0, x) for x in lp_m[i, :end].tolist())
            text = self.tokenizer.decode(list(ids_i), skip_special_tokens=True)
            samples.append(Sample(token_ids=ids_i, logprobs=lp_i, finish_reason=reason, text=text))
        return samples
