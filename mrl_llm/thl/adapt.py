"""Text adaptation, peer side: peer token ids -> the response text, with each peer token's character span.

**Peer side** (:func:`adapt_source`). The response ids are checked (:func:`as_arrays`), the peer's
special tokens (EOS, template markers, BOS, padding) and the out-of-vocabulary ids (``>= len(tokenizer)``:
a padded model's extra rows, which have no text) are taken out, and the rest is decoded by the
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
from itertools import chain
from typing import Any

import numpy as np

from mrl_llm.thl.offsets import byte_spans_to_chars, computed_char_spans
from mrl_llm.thl.vocab import VocabInfo
from shared_interfaces.records import LOGPROB_FLOOR


class THLInputError(ValueError):
    """Bad input to THL; the message names the sequence, the position and the problem."""



def _to_numpy(x: Any, floating: bool) -> np.ndarray:
    if hasattr(x, "detach"):  # a torch tensor (any device, any dtype) without importing torch
        x = x.detach().cpu()
        x = x.double() if floating and x.is_floating_point() else x
        x = x.numpy()
    return np.asarray(x)


@dataclass(frozen=True)
class Batch:
    """A checked batch: per-sequence int64 ids / float64 log-probs, and the same concatenated."""

    ids: list[np.ndarray]
    logprobs: list[np.ndarray]
    flat_ids: np.ndarray
    flat_logprobs: np.ndarray
    lengths: np.ndarray


def as_arrays(info: VocabInfo, batch_ids: Sequence[Any], batch_logprobs: Sequence[Any]) -> Batch:
    """Check a batch and return it as int64 id arrays and float64 log-prob arrays.

    Errors (:class:`THLInputError`) name the sequence and position: ids that are not integers or are
    negative, a length mismatch, log-probs that are NaN, infinite, > 0 or below :data:`LOGPROB_FLOOR`.
    An id ``>= len(source_tokenizer)`` is accepted: a model may have more vocabulary rows than its
    tokenizer has tokens (Qwen2.5: 151,936 vs 151,665) and its engine samples over all of them. Such an
    id has no text; the alignment drops it like a special token (:func:`oov_mask`).
    """
    if len(batch_ids) != len(batch_logprobs):
        raise THLInputError(f"got {len(batch_ids)} id sequences but {len(batch_logprobs)} log-prob sequences; pass one log-prob list per id list")
    fast = _from_python_sequences(batch_ids, batch_logprobs)
    if fast is not None:
        return _checked(info, *fast)
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
        ids_out.append(a.astype(np.int64, copy=False))
        lp_out.append(b.astype(np.float64, copy=False) if b.size else np.zeros(0, dtype=np.float64))
    lengths = np.fromiter((a.size for a in ids_out), dtype=np.int64, count=len(ids_out))
    flat_ids = np.concatenate(ids_out) if ids_out else np.zeros(0, np.int64)
    flat_lp = np.concatenate(lp_out) if lp_out else np.zeros(0)
    return _checked(info, ids_out, lp_out, flat_ids, flat_lp, lengths)


_INT = frozenset({int})
_NUMBER = frozenset({int, float})


def _from_python_sequences(batch_ids: Sequence[Any], batch_logprobs: Sequence[Any]) -> tuple[Any, ...] | None:
    """The batch as arrays in a few C-level passes when every sequence is a list/tuple of Python ints
    (ids) and numbers (log-probs) of matching lengths — what records hold; else None (the general path
    converts or reports it)."""
    n = len(batch_ids)
    if n == 0 or not (set(map(type, batch_ids)) | set(map(type, batch_logprobs))) <= {list, tuple}:
        return None
    lengths = np.fromiter(map(len, batch_ids), dtype=np.int64, count=n)
    if not np.array_equal(lengths, np.fromiter(map(len, batch_logprobs), dtype=np.int64, count=n)):
        return None
    if not (set(map(type, chain.from_iterable(batch_ids))) <= _INT
            and set(map(type, chain.from_iterable(batch_logprobs))) <= _NUMBER):
        return None
    total = int(lengths.sum())
    try:
        flat_ids = np.fromiter(chain.from_iterable(batch_ids), dtype=np.int64, count=total)
    except OverflowError:  # an id beyond int64: the general path reports it
        return None
    flat_lp = np.fromiter(chain.from_iterable(batch_logprobs), dtype=np.float64, count=total)
    b = np.concatenate([[0], np.cumsum(lengths)]).tolist()
    ids = [flat_ids[b[i] : b[i + 1]] for i in range(n)]  # views (np.split is several times slower)
    return ids, [flat_lp[b[i] : b[i + 1]] for i in range(n)], flat_ids, flat_lp, lengths


def _checked(info: VocabInfo, ids_out: list[np.ndarray], lp_out: list[np.ndarray], flat_ids: np.ndarray,
             flat_lp: np.ndarray, lengths: np.ndarray) -> Batch:
    """The batch after the range checks of :func:`as_arrays` (errors name the sequence and position).
    Ids ``>= info.size`` pass (see :func:`as_arrays`)."""
    bad_id = flat_ids < 0
    bad_lp = ~np.isfinite(flat_lp) | (flat_lp > 0) | (flat_lp < LOGPROB_FLOOR)
    if bad_id.any() or bad_lp.any():
        k = int(np.argmax(bad_id | bad_lp))
        i = int(np.searchsorted(np.cumsum(lengths), k, side="right"))
        j = k - int(lengths[:i].sum())
        if bad_id[k]:
            raise THLInputError(
                f"sequence {i}: token id {int(flat_ids[k])} at position {j} is outside the source vocabulary [0, {info.size}); "
                "pass ids produced by the source tokenizer (and the source tokenizer that produced them)"
            )
        v = float(flat_lp[k])
        what = "NaN" if np.isnan(v) else ("infinite" if np.isinf(v) else ("positive" if v > 0 else f"below {LOGPROB_FLOOR:g}"))
        raise THLInputError(
            f"sequence {i}: log-prob {v!r} at position {j} is {what}; log-probs must be finite, <= 0 and >= {LOGPROB_FLOOR:g}"
        )
    return Batch(ids_out, lp_out, flat_ids, flat_lp, lengths)


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
    special_mass: np.ndarray  # per sequence: mass of stripped special and OOV tokens (not the EOS counterpart)
    eos_logprob: np.ndarray  # per sequence: the final EOS's log-prob when it has a counterpart, else NaN
    n_oov: np.ndarray  # per sequence: out-of-vocabulary tokens dropped (ids >= the tokenizer's size)


def ends_with_eos(batch: Batch, eos_ids: np.ndarray) -> np.ndarray:
    """Per sequence: its last token is one of ``eos_ids`` (False for an empty sequence)."""
    last = np.cumsum(batch.lengths) - 1
    out = batch.lengths > 0
    out[out] = np.isin(batch.flat_ids[last[out]], eos_ids)
    return out


def oov_mask(info: VocabInfo, batch: Batch, eos_ids: np.ndarray) -> np.ndarray:
    """Per token of ``batch.flat_ids``: an out-of-vocabulary id (``>= info.size``, a padded model's extra
    row: no text), other than a final EOS (an id the engine stopped on keeps the EOS contract)."""
    oov = batch.flat_ids >= info.size
    if oov.any() and eos_ids.size:
        last = np.cumsum(batch.lengths) - 1
        oov[last[ends_with_eos(batch, eos_ids)]] = False
    return oov


def adapt_source(tokenizer: Any, info: VocabInfo, batch: Batch, *, append_eos: bool, eos_ids: np.ndarray) -> SourceSide:
    """Strip specials and out-of-vocabulary ids, decode each response as one sequence, and place its
    tokens on the text. ``eos_ids``: the ids the peer's engine stops on (a final one is the EOS counterpart)."""
    lengths, all_ids, all_lp = batch.lengths, batch.flat_ids, batch.flat_logprobs
    n = lengths.size
    seq = np.repeat(np.arange(n, dtype=np.int64), lengths)
    oov = oov_mask(info, batch, eos_ids)
    beyond = all_ids >= info.size  # an out-of-vocabulary id has no text: dropped as a special token is
    if beyond.any():
        special = beyond.copy()
        special[~beyond] = info.special[all_ids[~beyond]]
    else:
        special = info.special[all_ids]
    eos_logprob = np.full(n, np.nan)
    if append_eos and eos_ids.size:
        last = np.cumsum(lengths) - 1
        has_eos = ends_with_eos(batch, eos_ids)
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
        fallback = _byte_view_spans(info, k_ids, k_seq, bounds, texts, starts, ends)
    for i in fallback:
        s, e = computed_char_spans(lambda b: decode_batch(tokenizer, b), id_lists[i], texts[i])
        starts[bounds[i] : bounds[i + 1]], ends[bounds[i] : bounds[i + 1]] = s, e
    return SourceSide(texts, k_seq, k_lp, starts, ends, special_mass, eos_logprob, np.bincount(seq[oov], minlength=n))


def _byte_view_spans(
    info: VocabInfo, k_ids: np.ndarray, k_seq: np.ndarray, bounds: np.ndarray, texts: list[str], starts: np.ndarray, ends: np.ndarray
) -> list[int]:
    """Fill spans from the byte view for every sequence it explains; return the others.

    Sequence ``i`` is explained when its token bytes are ``shift_i`` spaces (dropped by the decoder:
    SentencePiece's dummy prefix) followed by exactly the UTF-8 bytes of its decoded text. Vectorised
    over the batch: one gather of token bytes, one encode of the joined texts, one comparison.
    """
    n = len(texts)
    tok_len = info.lengths[k_ids]
    tok0 = np.cumsum(tok_len) - tok_len
    blob_bytes = info.gather_bytes(k_ids)
    blob = np.frombuffer(blob_bytes, dtype=np.uint8)
    seq_byte = np.append(tok0, blob.size)[bounds]  # where each sequence starts in the blob
    joined = "".join(texts).encode("utf-8")
    jb = np.frombuffer(joined, dtype=np.uint8)
    lead = np.flatnonzero((jb & 0xC0) != 0x80)  # first byte of every character
    char0 = np.concatenate([[0], np.cumsum([len(t) for t in texts])]).astype(np.int64)
    text_byte0 = np.append(lead, jb.size)[char0]
    text_blen = np.diff(text_byte0)
    shift = np.diff(seq_byte) - text_blen
    tb0, sb0, sh = text_byte0.tolist(), seq_byte.tolist(), shift.tolist()
    expected = b"".join(b" " * max(sh[i], 0) + joined[tb0[i] : tb0[i + 1]] for i in range(n))
    if not (shift < 0).any() and expected == blob_bytes:  # the common case: all explained at once
        bad = shift < 0
    else:  # find the sequences the byte view does not explain
        bad = np.array([
            sh[i] < 0 or blob[sb0[i] : sb0[i + 1]].tobytes() != b" " * sh[i] + joined[tb0[i] : tb0[i + 1]] for i in range(n)
        ], dtype=bool)
    good = ~bad
    sel = good[k_seq]
    q = k_seq[sel]
    local0 = tok0[sel] - seq_byte[q] - shift[q]  # byte position in the text, before clipping
    b0 = np.clip(local0, 0, text_blen[q]) + text_byte0[q]
    b1 = np.clip(local0 + tok_len[sel], 0, text_blen[q]) + text_byte0[q]
    s, e = byte_spans_to_chars(b0, b1, np.cumsum((jb & 0xC0) != 0x80, dtype=np.int64) - 1, int(char0[-1]))
    starts[sel] = s - char0[q]
    ends[sel] = e - char0[q]
    return np.flatnonzero(bad).tolist()
