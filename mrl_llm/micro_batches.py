"""Micro-batches of an optimizer mini-batch: by rows (``train.micro_batch``) or by a token budget.

A micro-batch is packed right-padded to its longest row (:func:`mrl_llm.logprobs.pack`), so its size —
and the memory of its forward and backward — is ``padded(g) = |g| * max(2, max_{i in g} len_i)``
tokens, ``len_i`` = prompt + response tokens of row ``i``. With ``train.max_tokens_per_micro_batch = M``
the rows of a mini-batch are grouped greedily, **longest first**: walk the rows by decreasing length
and close the current group when adding the next row would make ``padded(g) > M``. Every row lands in
exactly one group, every group fits (a row longer than ``M`` alone is an error: the config refuses a
budget below ``max_prompt_len + max_new_tokens`` at load), and rows of similar length share a group,
so little of it is padding. The loss of every micro-batch is normalised over the whole mini-batch
(:class:`shared_interfaces.losses.LossNorm`), so how the rows are grouped does not change the
accumulated gradient (a test pins it to 1e-6 in fp32).

``padding_waste = sum_g padded(g) / sum_i len_i`` (>= 1) is logged per step.
"""

from __future__ import annotations

from collections.abc import Sequence


def padded_tokens(lengths: Sequence[int], group: Sequence[int]) -> int:
    """``padded(g) = |g| * max(2, longest row)``: the packed size of the rows ``group`` (0 when empty)."""
    return len(group) * max(2, max(lengths[i] for i in group)) if group else 0


def token_budget_groups(lengths: Sequence[int], budget: int) -> list[list[int]]:
    """Indices ``0 .. len(lengths) - 1`` grouped longest first so that every group's padded size is at most
    ``budget`` (module docstring). ``[]`` for no rows. Within a group, indices are longest first."""
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 2:
        raise ValueError(f"token budget must be an integer >= 2, got {budget!r}")
    for i, n in enumerate(lengths):
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"row {i}: length must be a non-negative integer, got {n!r}")
        if max(2, n) > budget:
            raise ValueError(f"row {i} has {n} tokens, more than the micro-batch token budget {budget}; raise "
                             "train.max_tokens_per_micro_batch to at least max_prompt_len + max_new_tokens")
    groups: list[list[int]] = []
    cur: list[int] = []
    longest = 0
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        if cur and (len(cur) + 1) * longest > budget:
            groups.append(cur)
            cur = []
        if not cur:
            longest = max(2, lengths[i])
        cur.append(i)
    if cur:
        groups.append(cur)
    return groups


def micro_batch_groups(rows: Sequence[int], lengths: Sequence[int], *, micro_batch: int,
                       max_tokens: int | None = None) -> list[list[int]]:
    """The micro-batches of the mini-batch ``rows`` (indices into ``lengths``): consecutive runs of
    ``micro_batch`` rows, or with ``max_tokens`` the token-budget groups of those rows."""
    rows = list(rows)
    if max_tokens is None:
        step = max(1, micro_batch)
        return [rows[s : s + step] for s in range(0, len(rows), step)]
    return [[rows[k] for k in g] for g in token_budget_groups([lengths[i] for i in rows], max_tokens)]
