"""A synthetic verifiable arithmetic task for tiny models: named families, a seeded train/eval split,
and a checker.

A *family* is one operation over two operand ranges; its problem space is every pair ``(a, b)`` in the
ranges (all enumerated, so it is small and exact). Default families (:data:`FAMILIES`)::

    add   a + b   a, b in 0..19          400 problems, answers 0..38
    sub   a - b   a in 0..19, b in 0..a  210 problems, answers 0..19
    mul   a * b   a in 0..9, b in 0..19  200 problems, answers 0..171

A problem reads ``What is 12+7?`` (``*`` for multiplication; at most 14 characters) with id
``add:12+7`` and gold ``19``. The answer format is fixed: the response must end its answer in
``\\boxed{19}`` (:func:`reference_response` is exactly that, the SFT target). The checker
(:func:`arithmetic_reward`) takes the last box, which must hold an integer, and compares it exactly.

The split is deterministic: family ``f``'s problems are shuffled by ``random.Random("<seed>:<f>")``
and the first ``round(eval_fraction * n)`` are held out for evaluation; the rest are training prompts.
The split does not depend on which other families are in the task. Problems come back in a fixed
order (family order, then ``a``, then ``b``). The demo warm-starts each tiny policy on a different
family so that their skills are complementary, then mutual RL runs on the union.

Measured with ``python -m experiments.probes.arithmetic_sft --family F --families add,sub,mul
--steps 400`` (a 446 K-parameter Llama-style model, character vocabulary, batch 64, 60-110 s on one
shared CPU thread; greedy accuracy on up to 80 sampled prompts per cell)::

    trained on   own train  own held-out  other families
    add          1.00       0.89          <= 0.07
    sub          0.93       0.81          <= 0.08
    mul          1.00       0.33          <= 0.04

So each family is learnt in a few hundred steps and not picked up from another; ``add`` and ``sub``
generalise to held-out prompts, ``mul`` is mostly memorised (its held-out prompts test transfer of
a table, not of a rule). The default task is ``("add", "sub")``.
"""

from __future__ import annotations

import random
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from mrl_llm.data.problem import Problem
from mrl_llm.rewards.extract import last_boxed
from mrl_llm.rewards.verdict import (
    CORRECT,
    GOLD_UNPARSABLE,
    NO_ANSWER,
    WRONG,
    FinishReason,
    UnparsableGoldError,
    Verdict,
    VerifierStats,
    truncated_verdict,
)

Op = Literal["+", "-", "*"]
Split = Literal["train", "eval", "all"]
_INT = re.compile(r"[+-]?\d+")


def _integer(numeral: str) -> tuple[bool, str]:
    """The value of an integer numeral (an ``_INT`` match) as ``(negative, decimal digits without leading
    zeros)``, at any length: ``int()`` refuses numerals over 4,300 digits (a ValueError), and a response
    may box one. ``\\d`` matches any Unicode decimal digit, so ``"١٩"`` is 19, as ``int()`` reads it."""
    text = numeral.strip()
    body = text.lstrip("+-")
    if not body.isascii():
        body = "".join(str(unicodedata.decimal(c)) for c in body)
    digits = body.lstrip("0")
    return (text.startswith("-") and digits != "", digits)


@dataclass(frozen=True)
class Family:
    """Problems ``a op b`` for ``a`` in ``a_range`` and ``b`` in ``b_range`` (inclusive); with
    ``b_le_a`` only pairs ``b <= a`` (non-negative differences)."""

    name: str
    op: Op
    a_range: tuple[int, int]
    b_range: tuple[int, int]
    b_le_a: bool = False

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[a-z][a-z0-9_]*", self.name):
            raise ValueError(f"family name {self.name!r} must be lower-case letters, digits, _")
        if self.op not in ("+", "-", "*"):
            raise ValueError(f"family {self.name!r}: op {self.op!r} must be '+', '-' or '*'")
        for label, (lo, hi) in (("a_range", self.a_range), ("b_range", self.b_range)):
            if not (0 <= lo <= hi):
                raise ValueError(f"family {self.name!r}: {label} {(lo, hi)} must satisfy 0 <= lo <= hi")

    def pairs(self) -> list[tuple[int, int]]:
        return [
            (a, b)
            for a in range(self.a_range[0], self.a_range[1] + 1)
            for b in range(self.b_range[0], self.b_range[1] + 1)
            if not (self.b_le_a and b > a)
        ]

    def answer(self, a: int, b: int) -> int:
        return a + b if self.op == "+" else a - b if self.op == "-" else a * b

    def problem(self, a: int, b: int) -> Problem:
        expr = f"{a}{self.op}{b}"
        return Problem(
            prompt_id=f"{self.name}:{expr}",
            question=f"What is {expr}?",
            gold=str(self.answer(a, b)),
            verifier="arithmetic",
            family=self.name,
            meta={"a": a, "b": b, "op": self.op},
        )


FAMILIES: dict[str, Family] = {
    "add": Family("add", "+", (0, 19), (0, 19)),
    "sub": Family("sub", "-", (0, 19), (0, 19), b_le_a=True),
    "mul": Family("mul", "*", (0, 9), (0, 19)),
}


def family(name: str) -> Family:
    """A default family by name."""
    if name not in FAMILIES:
        raise KeyError(f"unknown arithmetic family {name!r}; known: {sorted(FAMILIES)}")
    return FAMILIES[name]


@dataclass(frozen=True)
class ArithmeticTask:
    """The task: ``families`` (names of :data:`FAMILIES` or :class:`Family` objects), the held-out
    fraction per family and the split seed."""

    families: tuple[str | Family, ...] = ("add", "sub")
    eval_fraction: float = 0.2
    seed: int = 0
    _resolved: tuple[Family, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        resolved = tuple(f if isinstance(f, Family) else family(f) for f in self.families)
        names = [f.name for f in resolved]
        if not names or len(set(names)) != len(names):
            raise ValueError(f"arithmetic families must be non-empty and distinct, got {names}")
        if not 0.0 <= self.eval_fraction < 1.0:
            raise ValueError(f"eval_fraction must be in [0, 1), got {self.eval_fraction}")
        object.__setattr__(self, "_resolved", resolved)

    @property
    def family_names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self._resolved)

    def _split(self, fam: Family) -> tuple[list[tuple[int, int]], set[tuple[int, int]]]:
        pairs = fam.pairs()
        shuffled = list(pairs)
        random.Random(f"{self.seed}:{fam.name}").shuffle(shuffled)
        return pairs, set(shuffled[: round(self.eval_fraction * len(pairs))])

    def problems(self, split: Split = "train", families: Sequence[str] | None = None) -> list[Problem]:
        """The problems of ``split`` (``train``, ``eval`` or ``all``) of the given families (default:
        all of the task's), in fixed order."""
        if split not in ("train", "eval", "all"):
            raise ValueError(f"split must be 'train', 'eval' or 'all', got {split!r}")
        wanted = self.family_names if families is None else tuple(families)
        unknown = sorted(set(wanted) - set(self.family_names))
        if unknown:
            raise KeyError(f"families {unknown} are not in this task ({list(self.family_names)})")
        out: list[Problem] = []
        for fam in self._resolved:
            if fam.name not in wanted:
                continue
            pairs, held_out = self._split(fam)
            for a, b in pairs:
                if split == "all" or (split == "eval") == ((a, b) in held_out):
                    out.append(fam.problem(a, b))
        return out


_ID = re.compile(r"([a-z]+):(\d+)([+\-*])(\d+)")


def problem_from_id(prompt_id: str) -> Problem | None:
    """The problem of a default family's id (``add:12+7`` -> :meth:`Family.problem`), or None when ``prompt_id``
    is not one (another dataset's id, an unknown family, another operator, operands out of the family's ranges)."""
    m = _ID.fullmatch(prompt_id)
    if m is None or m.group(1) not in FAMILIES:
        return None
    fam, a, b = FAMILIES[m.group(1)], int(m.group(2)), int(m.group(4))
    if m.group(3) != fam.op or (a, b) not in set(fam.pairs()):
        return None
    return fam.problem(a, b)


def reference_response(problem: Problem) -> str:
    """The canonical correct response (the SFT target): ``\\boxed{<gold>}``."""
    return "\\boxed{" + problem.gold + "}"


class ArithmeticVerifier:
    """Checker: the last ``\\boxed{}`` must hold an integer equal to the gold integer."""

    name = "arithmetic"

    def __init__(self) -> None:
        self.stats = VerifierStats(self.name)

    def check_gold(self, gold: str, *, choices: tuple[str, ...] = ()) -> str | None:
        return None if _INT.fullmatch(gold.strip()) else f"the gold {gold[:50]!r} is not an integer"

    def score(
        self, response: str, gold: str, *, finish_reason: FinishReason = "stop", choices: tuple[str, ...] = ()
    ) -> Verdict:
        truncated = truncated_verdict(finish_reason)
        problem = self.check_gold(gold)
        if problem is not None:
            verdict = Verdict(0.0, GOLD_UNPARSABLE, detail=problem)
        elif truncated is not None:
            verdict = truncated
        else:
            boxed = last_boxed(response)
            if boxed is None or not _INT.fullmatch(boxed):
                verdict = Verdict(0.0, NO_ANSWER, boxed, detail="no \\boxed{integer} in the response")
            elif _integer(boxed) == _integer(gold):
                verdict = Verdict(1.0, CORRECT, boxed)
            else:
                verdict = Verdict(0.0, WRONG, boxed)
        return self.stats.record(verdict, gold)


_default = ArithmeticVerifier()


def arithmetic_verdict(response: str, gold: str, *, finish_reason: FinishReason = "stop") -> Verdict:
    """The :class:`Verdict` of the shared arithmetic checker."""
    return _default.score(response, gold, finish_reason=finish_reason)


def arithmetic_reward(response: str, gold: str, *, finish_reason: FinishReason = "stop") -> float:
    """1.0 if the last ``\\boxed{}`` of ``response`` holds the gold integer, else 0.0 (0.0 when
    truncated). Raises :class:`UnparsableGoldError` when ``gold`` is not an integer."""
    verdict = arithmetic_verdict(response, gold, finish_reason=finish_reason)
    if verdict.skip:
        raise UnparsableGoldError(verdict.detail)
    return verdict.reward
