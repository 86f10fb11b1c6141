"""Word segmentation: the one rule THL uses to define a word.

A *word* is a maximal run of non-whitespace characters together with the whitespace run in front of
it (so whitespace-only tokens belong to the next word, and byte-level BPE's ``Ġword`` / SentencePiece's
``▁word`` fall inside one word). Whitespace is Python's ``str.isspace``. Whitespace after the last
non-whitespace character (trailing whitespace) forms one last, whitespace-only segment; a text that
is all whitespace is one whitespace-only segment; the empty text has no segments. Formally, with
``ws(i)`` whether character ``i`` is whitespace, a segment starts at ``i`` iff ``i = 0`` or
``ws(i) and not ws(i - 1)``; segments run from one start to the next. They partition the text.

Everything here is vectorised over a batch: the texts are concatenated and processed as one array of
code points.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

#: Every code point for which ``str.isspace`` holds is below this bound (checked by a test).
_WS_BOUND = 0x3001


@lru_cache(maxsize=1)
def _ws_table() -> np.ndarray:
    return np.array([chr(c).isspace() for c in range(_WS_BOUND)], dtype=bool)


def codepoints(text: str) -> np.ndarray:
    """The code points of ``text`` as an int64 array (one entry per Python character)."""
    return np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype="<u4").astype(np.int64)


def whitespace_mask(cps: np.ndarray) -> np.ndarray:
    """``str.isspace`` for each code point."""
    return (cps < _WS_BOUND) & _ws_table()[np.minimum(cps, _WS_BOUND - 1)]


def segment_starts(cps: np.ndarray, text_starts: np.ndarray) -> np.ndarray:
    """Global start positions of all segments of a batch of concatenated texts.

    ``cps`` are the code points of the concatenation, ``text_starts`` the (sorted) start offset of each
    text in it. Each non-empty text's first character starts a segment; so does every whitespace
    character that follows a non-whitespace one in the same text.
    """
    n = cps.size
    starts = np.zeros(n, dtype=bool)
    if n:
        ws = whitespace_mask(cps)
        starts[1:] = ws[1:] & ~ws[:-1]
        firsts = text_starts[text_starts < n]
        starts[firsts] = True
    return np.flatnonzero(starts).astype(np.int64)


def word_spans(text: str) -> list[tuple[int, int]]:
    """The ``(start, end)`` character spans of the segments of one text (see the module rule)."""
    if not text:
        return []
    starts = segment_starts(codepoints(text), np.zeros(1, dtype=np.int64)).tolist()
    return list(zip(starts, starts[1:] + [len(text)], strict=True))
