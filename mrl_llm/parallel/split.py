"""A policy's rows split over its ranks, balanced by token count.

:func:`split_by_tokens`: the rows are taken longest first (ties: lower index first) and each goes to the
rank holding the fewest tokens so far (ties: the lower rank) among those holding fewer than ``ceil(n / k)``
rows — the LPT rule with verl's equal-size constraint: no rank gets more rows than an even split gives it, so
a row-count micro-batch never leaves one rank a small extra micro-batch (and every other rank a filler) because
it was handed a few more rows. Each share keeps the rows' original order. Every row lands on exactly one rank,
so any count that sums over rows (:class:`~shared_interfaces.losses.LossNorm`'s) is the sum of the ranks'
counts. A rank may get no rows (fewer rows than ranks).
"""

from __future__ import annotations

from collections.abc import Sequence


def split_by_tokens(rows: Sequence[int], lengths: Sequence[int], k: int) -> list[list[int]]:
    """``k`` shares of ``rows`` (indices into ``lengths``, the rows' token counts), balanced (module docstring)."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"split_by_tokens: the number of ranks must be an integer >= 1, got {k!r}")
    for i in rows:
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < len(lengths):
            raise ValueError(f"split_by_tokens: row {i!r} is not an index into the {len(lengths)} row lengths")
        n = lengths[i]
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"split_by_tokens: row {i} has length {n!r}; expected a non-negative integer")
    if len(set(rows)) != len(rows):
        raise ValueError("split_by_tokens: a row is listed twice")
    load = [0] * k
    shares: list[list[int]] = [[] for _ in range(k)]
    order = {r: j for j, r in enumerate(rows)}
    cap = -(-len(rows) // k)  # ceil(n / k) rows a rank at most
    for r in sorted(rows, key=lambda r: (-lengths[r], order[r])):
        dest = min((j for j in range(k) if len(shares[j]) < cap), key=lambda j: (load[j], j))
        shares[dest].append(r)
        load[dest] += lengths[r]
    return [sorted(s, key=order.__getitem__) for s in shares]
