"""Character spans of tokens: the byte view (exact, vectorised) and a computed fallback.

THL places every token on a character span ``[start, end)`` of its text. Three sources:

1. **Byte view** (:func:`byte_spans_to_chars`), for the peer's tokens: when the concatenated token
   bytes of a sequence (:meth:`mrl_llm.thl.vocab.VocabInfo.gather_bytes`) equal the UTF-8 bytes of
   the peer's decoded text (up to the leading spaces a SentencePiece decode drops), a token covering
   bytes ``[b0, b1)`` covers the characters those bytes belong to. A token holding only part of a
   multi-byte character (a byte-fallback ``<0xF0>``, a byte-level BPE piece) covers that whole
   character, so neighbours sharing a character overlap by one character. Exact for sampled,
   non-canonical token sequences too.
2. **Offset mapping** of a fast tokenizer, for the learner's encoding (in the original text's
   characters even where the learner's normaliser changes the text, e.g. Qwen's NFC).
3. **Computed spans** (:func:`computed_char_spans`), for any tokenizer: decode every prefix
   ``ids[:k]`` as a whole sequence; token ``k`` covers the characters between the longest common
   prefixes of the text with the decodes of ``ids[:k-1]`` and ``ids[:k]``. A token that completes no
   character (a partial byte) covers the character it contributes to. Quadratic in the length, so
   THL uses it only where 1. and 2. are unavailable (invalid UTF-8, an unknown decoder, a tokenizer
   without offsets). Its one blind spot: a partial character decodes to U+FFFD, so where the text
   holds a real U+FFFD a partial byte token may be placed on the character after it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np


def char_index_of_bytes(data: bytes) -> np.ndarray:
    """For valid UTF-8 ``data``: the index of the character each byte belongs to."""
    b = np.frombuffer(data, dtype=np.uint8)
    return np.cumsum((b & 0xC0) != 0x80, dtype=np.int64) - 1


def byte_spans_to_chars(
    byte_starts: np.ndarray, byte_ends: np.ndarray, char_of_byte: np.ndarray, n_chars: int
) -> tuple[np.ndarray, np.ndarray]:
    """Character spans of byte spans ``[byte_starts, byte_ends)`` (positions in the text's bytes).

    A non-empty byte span covers ``[char(b0), char(b1 - 1) + 1)``. An empty one (a token with no
    bytes in the text) is the empty span at the character where it sits.
    """
    n_bytes = char_of_byte.size
    lookup = np.append(char_of_byte, n_chars)  # position n_bytes -> end of the text
    starts = lookup[np.minimum(byte_starts, n_bytes)]
    last = lookup[np.clip(byte_ends - 1, 0, n_bytes)] + 1
    ends = np.where(byte_ends > byte_starts, last, starts)
    return starts, ends


def _common_prefix_len(a: str, b: str) -> int:
    if b.startswith(a):
        return len(a)
    trimmed = a.rstrip("\ufffd")  # a partial character at the end of a prefix decodes to U+FFFD
    if b.startswith(trimmed):
        return len(trimmed)
    lo, hi = 0, min(len(trimmed), len(b))
    while lo < hi:  # binary search on the longest common prefix
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def computed_char_spans(
    decode_batch: Callable[[list[list[int]]], list[str]], ids: Sequence[int], text: str
) -> tuple[np.ndarray, np.ndarray]:
    """Spans of ``ids`` in ``text`` from whole-sequence decodes of every prefix (see the module).

    ``decode_batch`` decodes lists of ids as whole sequences. Spans are clipped to the text.
    """
    ids = [int(i) for i in ids]
    n = len(ids)
    starts = np.zeros(n, dtype=np.int64)
    ends = np.zeros(n, dtype=np.int64)
    if n == 0:
        return starts, ends
    decoded = decode_batch([ids[: k + 1] for k in range(n)])
    prev = 0
    for k, d in enumerate(decoded):
        cur = max(prev, min(_common_prefix_len(d, text), len(text)))
        if cur > prev:
            starts[k], ends[k] = prev, cur
        else:  # completes no character: it belongs to the character being built
            s = min(prev, max(len(text) - 1, 0))
            starts[k], ends[k] = s, min(s + 1, len(text))
        prev = cur
    return starts, ends
