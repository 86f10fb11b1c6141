"""Peer alignment: a peer's records in this policy's tokens (THL, :mod:`mrl_llm.thl`).

A peer record carries its producer's token ids and behaviour log-probs. :meth:`PeerAlignment.align` gives
``(prompt ids, response ids, aligned log-probs, residual)`` in the learner's tokenizer: THL's own split of
the learner's joint encoding of its prompt text + the response (special tokens as the learner's template
tokenizes its prompts), so a token spanning the boundary appears once (THL gives it to the response; when
it is the prompt's only token, it stays the prompt, untrained: a row needs a prompt token, and its mass is
already a boundary conflict in the residual); the producer's extra EOS ids
(``peer_eos_ids``, its ``generation_config.json``'s) map to the learner's EOS. Traces are cached by
``(record_id, learner tokenizer)``; :meth:`PeerAlignment.prefetch` fills that cache for a step's records in
one :func:`~mrl_llm.thl.align_traces` batch per (source tokenizer, producer), the same traces as one by one.
On a worker group of k ranks (every rank holds the whole batch) each rank aligns every k-th peer record and
the ranks exchange their traces, so the group aligns each record once, not k times.

A record whose prompt the learner has not rendered, or whose tokenizer is not one of the run's
(:func:`run_tokenizers`), is a ``KeyError`` naming the learner and the record. No model is involved.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from mrl_llm.byte_tokenizer import BYTE_TOKENIZER_ID, byte_tokenizer
from mrl_llm.models import load_tokenizer_dir, tokenizer_id
from mrl_llm.parallel.group import WorkerGroup
from mrl_llm.rank.prompts import PromptCache
from mrl_llm.thl import align_trace, align_traces
from shared_interfaces.records import ExperienceRecord, TraceCache


def run_tokenizers(name: str, tokenizer: Any, own_dir: str | None, dirs: Sequence[str]) -> dict[str, Any]:
    """Every tokenizer of the run by :func:`~mrl_llm.models.tokenizer_id`: policy ``name``'s own
    ``tokenizer`` (loaded from ``own_dir``), the byte tokenizer, and each directory of ``dirs`` (the peers';
    ``own_dir`` is not loaded twice); the first of an id wins."""
    out: dict[str, Any] = {tokenizer_id(tokenizer): tokenizer, BYTE_TOKENIZER_ID: byte_tokenizer()}
    for d in dirs:
        if d == BYTE_TOKENIZER_ID:
            continue
        tok = tokenizer if d == own_dir else load_tokenizer_dir(d, who=f"a peer of {name!r}")
        out.setdefault(tokenizer_id(tok), tok)
    return out


class PeerAlignment:
    """Learner ``name``'s view of peer records (module docstring). ``prompts``: the learner's rendered
    prompts; ``tokenizers``: :func:`run_tokenizers`; ``peer_eos_ids``: per producer, its extra EOS ids."""

    def __init__(self, name: str, tokenizer: Any, prompts: PromptCache, *, tokenizers: Mapping[str, Any],
                 peer_eos_ids: Mapping[str, Sequence[int]], max_traces: int = 4096) -> None:
        self.name, self.tokenizer, self.prompts = name, tokenizer, prompts
        self.tok_id = tokenizer_id(tokenizer)
        self.tokenizers = dict(tokenizers)
        self.peer_eos_ids = peer_eos_ids
        self.trace_cache = TraceCache(max_entries=max_traces)  # a few steps of peer records (sync uses one)

    def align(self, rec: ExperienceRecord) -> tuple[list[int], list[int], list[float], Any]:
        """``(prompt ids, response ids, aligned log-probs, residual)`` of ``rec`` in the learner's tokens."""
        self.prompts.ids(rec.prompt_id)  # an unrendered prompt: the error that names it

        def compute() -> Any:
            return align_trace(self.source_tokenizer(rec), self.tokenizer, list(rec.token_ids),
                               list(rec.token_logprobs), **self.thl_options(rec))

        tr = self.trace_cache.get_or_compute(rec.record_id, self.tok_id, compute)
        prompt, ids, lps = tr.prompt_ids.tolist(), tr.target_ids.tolist(), tr.target_logprobs.tolist()
        if not prompt and ids:  # a token straddling a one-token prompt took it all: it stays the prompt, untrained
            prompt, ids, lps = ids[:1], ids[1:], lps[1:]
        return prompt, ids, lps, tr.residual

    def thl_options(self, rec: ExperienceRecord) -> dict[str, Any]:
        """THL's keyword arguments for ``rec``: the learner's prompt, how it tokenizes it, the peer's EOS ids."""
        return {"prompt_text": self.prompts.text(rec.prompt_id),
                "prompt_special_tokens": self.prompts.template.add_special_tokens,
                "source_eos_ids": self.peer_eos_ids.get(rec.policy_id, ())}

    def source_tokenizer(self, rec: ExperienceRecord) -> Any:
        """The tokenizer ``rec`` was written in."""
        src = self.tokenizers.get(rec.tokenizer_id)
        if src is None:
            raise KeyError(
                f"policy {self.name!r} cannot read record {rec.record_id!r}: tokenizer {rec.tokenizer_id!r} is "
                f"not one of the run's tokenizers {sorted(self.tokenizers)}"
            )
        return src

    def prefetch(self, records: Sequence[ExperienceRecord], *, group: WorkerGroup | None = None) -> None:
        """Align the peer records among ``records`` (the learner's own are skipped) into the trace cache,
        one batch per (source tokenizer, producer). ``group`` (a collective when sharded: every rank calls it
        with the same records): rank ``r`` aligns the peer records ``r, r + k, ...`` (by record id) and the
        traces are gathered, so every rank's cache ends up holding all of them. No peer record (the same on every
        rank): no collective."""
        peer: dict[str, ExperienceRecord] = {}
        for rec in records:
            if rec.policy_id != self.name:
                self.prompts.ids(rec.prompt_id)  # an unrendered prompt: the error that names it
                peer[rec.record_id] = rec
        if group is None or not group.sharded or not peer:
            self._align_into_cache(peer.values())
            return
        mine = self._align_into_cache([peer[r] for r in sorted(peer)[group.rank::group.world_size]])
        for part in group.gather_objects(sorted(mine.items())):
            for rid, tr in part:
                self.trace_cache.get_or_compute(rid, self.tok_id, lambda tr=tr: tr)

    def _align_into_cache(self, records: Iterable[ExperienceRecord]) -> dict[str, Any]:
        """Align ``records`` (one batch per source tokenizer and producer) into the cache; ``{record_id: trace}``."""
        out: dict[str, Any] = {}
        groups: dict[tuple[str, str], dict[str, ExperienceRecord]] = {}
        for rec in records:
            groups.setdefault((rec.tokenizer_id, rec.policy_id), {})[rec.record_id] = rec
        for recs in groups.values():
            todo = list(recs.values())
            opts = self.thl_options(todo[0])
            traces = align_traces(self.source_tokenizer(todo[0]), self.tokenizer, [r.token_ids for r in todo],
                                  [r.token_logprobs for r in todo],
                                  prompt_texts=[self.prompts.text(r.prompt_id) for r in todo],
                                  prompt_special_tokens=opts["prompt_special_tokens"],
                                  source_eos_ids=opts["source_eos_ids"])
            for rec, tr in zip(todo, traces, strict=True):
                self.trace_cache.get_or_compute(rec.record_id, self.tok_id, lambda tr=tr: tr)
                out[rec.record_id] = tr
        return out
