"""Independent re-derivations for THL tests: the word rule as a regex, token spans from prefix
decodes or a tokenizer's own offsets, and the per-word conservation check built on them."""

from __future__ import annotations

import re
from bisect import bisect_right

import numpy as np

WORD = re.compile(r"\s*\S+|\s+")  # whitespace run + non-whitespace run; trailing whitespace alone


def words(text: str) -> list[tuple[int, int]]:
    return [m.span() for m in WORD.finditer(text)]


def _lcp(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def prefix_decode_spans(tokenizer, ids: list[int], text: str) -> list[tuple[int, int]]:
    """Token k covers text[lcp(decode(ids[:k])) : lcp(decode(ids[:k+1]))]; a token that completes no
    character covers the character being built."""
    spans, prev = [], 0
    for k in range(len(ids)):
        d = tokenizer.decode(ids[: k + 1], skip_special_tokens=True, clean_up_tokenization_spaces=False)
        cur = max(prev, _lcp(d.rstrip("\ufffd") if not text.startswith(d) else d, text))
        if cur > prev:
            spans.append((prev, cur))
        else:
            s = min(prev, max(len(text) - 1, 0))
            spans.append((s, min(s + 1, len(text))))
        prev = cur
    return spans


def encode_literal(tokenizer, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    """Ids and offsets of ``text`` with special-token spellings kept as text (as a sampled response
    that spells ``"</s>"`` would be), no special tokens added."""
    backend = tokenizer.backend_tokenizer
    old = backend.encode_special_tokens
    backend.encode_special_tokens = True
    try:
        enc = backend.encode(text, add_special_tokens=False)
    finally:
        backend.encode_special_tokens = old
    return enc.ids, [tuple(o) for o in enc.offsets]


def check_word_conservation(
    text: str, src_spans, src_lp, tgt_spans, tgt_lp, tol: float = 1e-9
) -> int:
    """For every word no token (of either side) crosses out of, Σ target = Σ source. Returns the
    number of words checked; raises AssertionError naming the first word that fails."""
    ws = words(text)
    if not ws:
        return 0
    starts = [a for a, _ in ws]
    n = len(ws)
    sums = np.zeros((2, n))
    crossed = np.zeros(n, dtype=bool)
    for side, (spans, lps) in enumerate(((src_spans, src_lp), (tgt_spans, tgt_lp))):
        for (s, e), lp in zip(spans, lps, strict=True):
            first = bisect_right(starts, min(s, len(text) - 1)) - 1
            last = bisect_right(starts, max(e - 1, min(s, len(text) - 1))) - 1 if e > s else first
            if last > first:
                crossed[first : last + 1] = True
            sums[side, first] += lp
    checked = 0
    for w in np.flatnonzero(~crossed):
        assert abs(sums[1, w] - sums[0, w]) <= tol * max(1.0, abs(sums[0, w])), (
            f"word {w} {text[ws[w][0]:ws[w][1]]!r}: target {sums[1, w]} != source {sums[0, w]}"
        )
        checked += 1
    return checked
