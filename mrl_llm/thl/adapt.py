"""Text adaptation, peer side: peer token ids -> the response text, with each peer token's character span.

**Peer side** (:func:`adapt_source`). The response ids are checked (:func:`as_arrays`), the peer's
special tokens (EOS, template markers, BOS, padding) are taken out, and the rest is decoded by the
peer tokenizer as *one* sequence with special tokens skipped and no clean-up — so byte-fallback
tokens and byte-level pieces that are not valid UTF-8 on their own decode together, and a
SentencePiece decode drops its dummy-prefix leading space exactly as the peer's own ``decode`` does.
That decode *is* the response text. Every kept peer token gets the character span it spells in the
text, from the byte view (checked against the decode, per sequence) or, where the byte view does not
reproduce the decode (invalid UTF-8, unknown decoder), from computed spans (:mod:`mrl_llm.thl.offsets`).
A token that only spelled a dropped leading space gets the empty span at 0 (it stays with the first
word).

The learner side is :mod:`mrl_llm.thl.encode`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mrl_llm.thl.offsets import byte_spans_to_chars, char_index_of_bytes, computed_char_spans
from mrl_llm.thl.vocab import VocabInfo


class THLInputError(ValueError):
    """Bad input to THL; the message names the sequence, the position and the problem."""


def _to_numpy(x: Any, floating: bool) -> np.ndarray:
    if hasattr(x, "detach"):  # a torch tensor (any device, any dtype) without importing torch
        x = x.detach().cpu()
        x = x.double() if floating and x.is_floating_point() else x
        x = x.numpy()
    return np.asarray(x)


def as_arrays(info: VocabInfo, batch_ids: Sequence[Any], batch_logprobs: Sequence[Any]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Check a batch and return it as int64 id arrays and float64 log-prob arrays.

    Errors (:class:`THLInputError`) name the sequence and position: ids that are not integers or lie
    outside ``[0, len(source_tokenizer))``, a length mismatch, log-probs that are NaN, infinite or > 0.
    """
    if len(batch_ids) != len(batch_logprobs):
        raise THLInputError(f"got {len(batch_ids)} id sequences but {len(batch_logprobs)} log-prob sequences; pass one log-prob list per id list")
    ids_out, lp_out = [], []
    for i, (ids, lps) in enumerate(zip(batch_ids, batch_logprobs, strict=True)):
        a, b = _to_numpy(ids, False), _to_numpy(lps, True)
        if a.ndim != 1 or b.ndim != 1:
            raise THLInputError(f"sequence {i}: ids and log-probs must be flat 1-D sequences (got shapes {a.shape} and {b.shape})")
        if a.size == 0:
            a = a.astype(np.int64)
        if a.dtype.kind not in "iu":
            raise THLInputError(f"sequence {i}: token ids must be integers, got dtype {a.dtype}")
        if a.size != b.size:
            raise THLInputError(f"sequence {i}: {a.size} token ids but {b.size} log-probs; pass exactly one log-prob per token")
        a = a.astype(np.int64, copy=False)
        bad = np.flatnonzero((a < 0) | (a >= info.size))
        if bad.size:
            j = int(bad[0])
            raise THLInputError(
                f"sequence {i}: token id {int(a[j])} at position {j} is outside the source vocabulary [0, {info.size}); "
                "pass ids produced by the source tokenizer (and the source tokenizer that produced them)"
            )
        b = b.astype(np.float64, copy=False) if b.size else np.zeros(0, dtype=np.float64)
        bad = np.flatnonzero(~np.isfinite(b) | (b > 0))
        if bad.size:
            j = int(bad[0])
            what = "NaN" if np.isnan(b[j]) else ("infinite" if np.isinf(b[j]) else "positive")
            raise THLInputError(f"sequence {i}: log-prob {float(b[j])!r} at position {j} is {what}; log-probs must be finite and <= 0")
        ids_out.append(a)
        lp_out.append(b)
    return ids_out, lp_out


def decode_batch(tokenizer: Any, seqs: list[list[int]]) -> list[str]:
    """Whole-sequence decodes with special tokens skipped and no clean-up of spaces."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        return backend.decode_batch(seqs, skip_special_tokens=True)
    return tokenizer.batch_decode(seqs, skip_special_tokens=True, clean_up_tokenization_spaces=False)


@dataclass(frozen=True)
class SourceSide:
    """The peer side of a batch. Token arrays hold the kept (non-special) tokens of all sequences, in
    order; ``seq`` says which sequence each belongs to; spans are in that sequence's own text."""

    texts: list[str]
    seq: np.ndarray
    logprobs: np.ndarray
    starts: np.ndarray
    ends: np.ndarray
    special_mass: np.ndarray  # per sequence: mass of stripped special tokens (not the EOS counterpart)
    eos_logprob: np.ndarray  # per sequence: the final EOS's log-prob when it has a counterpart, else NaN


def adapt_source(tokenizer: Any, info: VocabInfo, ids: list[np.ndarray], lps: list[np.ndarray], *, append_eos: bool) -> SourceSide:
    """Strip specials, decode each response as one sequence, and place its tokens on the text."""
    n = len(ids)
    lengths = np.array([a.size for a in ids], dtype=np.int64)
    all_ids = np.concatenate(ids) if n else np.zeros(0, np.int64)
    all_lp = np.concatenate(lps) if n else np.zeros(0)
    seq = np.repeat(np.arange(n, dtype=np.int64), lengths)
    special = info.special[all_ids]
    eos_logprob = np.full(n, np.nan)
    if append_eos and info.eos_id is not None:
        last = np.cumsum(lengths) - 1
        has_eos = (lengths > 0) & (all_ids[np.maximum(last, 0)] == info.eos_id)
        eos_logprob[has_eos] = all_lp[last[has_eos]]
        special[last[has_eos]] = False  # handled as the EOS counterpart, not as special mass
        keep = ~special
        keep[last[has_eos]] = False
    else:
        keep = ~special
    special_mass = np.bincount(seq[special], all_lp[special], minlength=n).astype(np.float64)
    k_ids, k_lp, k_seq = all_ids[keep], all_lp[keep], seq[keep]
    bounds = np.concatenate([[0], np.cumsum(np.bincount(k_seq, minlength=n))])
    id_lists = [k_ids[bounds[i] : bounds[i + 1]].tolist() for i in range(n)]
    texts = decode_batch(tokenizer, id_lists)
    starts = np.zeros(k_ids.size, dtype=np.int64)
    ends = np.zeros(k_ids.size, dtype=np.int64)
    fallback = list(range(n))
    if info.kind != "unknown":
        fallback = _byte_view_spans(info, k_ids, bounds, texts, starts, ends)
    for i in fallback:
        s, e = computed_char_spans(lambda b: decode_batch(tokenizer, b), id_lists[i], texts[i])
        starts[bounds[i] : bounds[i + 1]], ends[bounds[i] : bounds[i + 1]] = s, e
    return SourceSide(texts, k_seq, k_lp, starts, ends, special_mass, eos_logprob)


def _byte_view_spans(info: VocabInfo, k_ids: np.ndarray, bounds: np.ndarray, texts: list[str], starts: np.ndarray, ends: np.ndarray) -> list[int]:
    """Fill spans from the byte view for every sequence it explains; return the others."""
    tok_len = info.lengths[k_ids]
    tok_end = np.cumsum(tok_len)
    blob = info.gather_bytes(k_ids)
    seq_byte = np.concatenate([[0], tok_end])[bounds]  # byte offset of each sequence in the blob
    good, shifts, encoded, fallback = [], [], [], []
    for i, text in enumerate(texts):
        b = blob[seq_byte[i] : seq_byte[i + 1]]
        d = text.encode("utf-8")
        if b == d:
            shift = 0
        elif len(b) > len(d) and b.endswith(d) and not b[: len(b) - len(d)].strip(b" "):
            shift = len(b) - len(d)  # the decoder dropped leading space(s): SentencePiece's dummy prefix
        else:
            fallback.append(i)
            continue
        good.append(i)
        shifts.append(shift)
        encoded.append(d)
    if not good:
        return fallback
    joined = b"".join(encoded)
    text_byte0 = np.concatenate([[0], np.cumsum([len(d) for d in encoded])]).astype(np.int64)
    text_char0 = np.concatenate([[0], np.cumsum([len(texts[i]) for i in good])]).astype(np.int64)
    sel = np.concatenate([np.arange(bounds[i], bounds[i + 1]) for i in good]).astype(np.int64)
    which = np.repeat(np.arange(len(good)), [bounds[i + 1] - bounds[i] for i in good])
    # byte position of each token inside its own sequence, minus the dropped prefix, clipped to the text
    local0 = tok_end[sel] - tok_len[sel] - seq_byte[np.asarray(good)][which] - np.asarray(shifts, np.int64)[which]
    text_len = text_byte0[1:] - text_byte0[:-1]
    b0 = np.clip(local0, 0, text_len[which]) + text_byte0[which]
    b1 = np.clip(local0 + tok_len[sel], 0, text_len[which]) + text_byte0[which]
    s, e = byte_spans_to_chars(b0, b1, char_index_of_bytes(joined), int(text_char0[-1]))
    starts[sel] = s - text_char0[which]
    ends[sel] = e - text_char0[which]
    return fallback

