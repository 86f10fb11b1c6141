"""The multiple-choice verifier: the chosen option letter against the gold letter.

The letter of a text (response or gold) is found by the first rule that yields a valid letter
(``A``.. the number of ``choices``; ``A``–``J`` when the choices are not given):

1. the last ``\\boxed{...}``: ``\\boxed{B}``, ``\\boxed{(B)}``, ``\\boxed{\\text{B}}``, ``\\boxed{B. 42}``,
   or, when ``choices`` are given, the exact text of an option (case- and space-insensitive);
2. the last answer phrase: ``answer``/``option``/``choice`` (optionally "the correct/final ... ")
   then optionally ``is``/``:``/``=`` then the letter, bare or in parentheses/bold: "Answer: (B)",
   "**Answer:** B", "The correct answer is C.", "the answer is b". A lower-case letter counts only in
   parentheses or at the end of the text / before punctuation ("the answer is a good one" is no
   answer);
3. the whole text is an option: ``B``, ``(B)``, ``B.``, ``B) 42`` at its start, or (with
   ``choices``) exactly the text of an option.

A gold with no valid letter is unusable (the sample is skipped and counted). A truncated response
fails.
"""

from __future__ import annotations

import re

from mrl_llm.data.problem import CHOICE_LETTERS
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

#: Letters allowed when the options are not given.
DEFAULT_LETTERS = CHOICE_LETTERS[:10]

# The separators are possessive (``*+``): with plain ``*`` the three adjacent runs split a long run of
# spaces every way before failing (cubic: "Answer" + 1,000 spaces took 8 s); no token after a separator
# starts with a separator character, so giving characters back never made a match.
_PHRASE = re.compile(
    r"\b(?:answer|option|choice)s?\b[*_\s]*+(?:is|would\s+be|should\s+be|:|=)?[*_\s:]*+(?:option|choice|letter)?[*_\s:]*+"
    r"(?:\(([A-Za-z])\)|([A-Za-z])(?![A-Za-z0-9]))",
    re.IGNORECASE,
)
_AFTER = re.compile(r"[ *_]*+(.?)", re.DOTALL)  # the first character after a phrase's letter, past " *_"
_LEADING = re.compile(r"^[*_\s]*\(?([A-Z])(?:\)|\.|:|$|\s*$)")
_TEX_WRAP = re.compile(r"\\(?:text|textbf|mathrm|mathbf|textit|mbox)\s*\{([^{}]*)\}")


def _norm(text: str) -> str:
    return " ".join(text.replace("$", " ").split()).strip(" .").lower()


def _valid(letter: str | None, letters: str) -> str | None:
    if letter is None:
        return None
    letter = letter.upper()
    return letter if letter in letters else None


def _by_text(text: str, choices: tuple[str, ...]) -> str | None:
    norm = _norm(text)
    hits = [CHOICE_LETTERS[i] for i, c in enumerate(choices) if _norm(c) == norm]
    return hits[0] if len(hits) == 1 else None


def _phrase_letter(text: str, letters: str) -> str | None:
    found = None
    for m in _PHRASE.finditer(text):
        if m.group(1):
            letter = m.group(1)
        else:
            letter = m.group(2)
            after = _AFTER.match(text, m.end()).group(1)  # not a slice of the rest: linear in many phrases
            if letter.islower() and after and after not in ".,;:!?)\n":
                continue
        found = _valid(letter, letters) or found
    return found


def _boxed_letter(content: str, letters: str, choices: tuple[str, ...]) -> str | None:
    inner = _TEX_WRAP.sub(lambda m: m.group(1), content).strip()
    m = _LEADING.match(inner) or re.fullmatch(r"\(?([a-z])\)?", inner)
    letter = _valid(m.group(1), letters) if m else None
    if letter is None and choices:
        letter = _by_text(inner, choices)
    return letter


def choice_letter(text: str, *, choices: tuple[str, ...] = ()) -> str | None:
    """The option letter ``text`` chooses (module docstring), or ``None``."""
    letters = CHOICE_LETTERS[: len(choices)] if choices else DEFAULT_LETTERS
    boxed = last_boxed(text)
    if boxed is not None:
        letter = _boxed_letter(boxed, letters, choices)
        if letter is not None:
            return letter
    letter = _phrase_letter(text, letters)
    if letter is not None:
        return letter
    m = _LEADING.match(text.strip())
    if m and _valid(m.group(1), letters):
        return m.group(1)
    if re.fullmatch(r"\s*\(?[a-z]\)?\s*", text):
        return _valid(text.strip(" ()"), letters)
    return _by_text(text, choices) if choices else None


class MCQVerifier:
    """Multiple-choice verifier (module docstring); stateless apart from its counters; thread-safe."""

    name = "mcq"

    def __init__(self) -> None:
        self.stats = VerifierStats(self.name)

    def check_gold(self, gold: str, *, choices: tuple[str, ...] = ()) -> str | None:
        if choice_letter(gold, choices=tuple(choices)) is None:
            letters = CHOICE_LETTERS[: len(choices)] if choices else DEFAULT_LETTERS
            return f"no option letter ({letters[0]}-{letters[-1]}) or option text in the gold answer {gold[:100]!r}"
        return None

    def score(
        self, response: str, gold: str, *, finish_reason: FinishReason = "stop", choices: tuple[str, ...] = ()
    ) -> Verdict:
        choices = tuple(choices)
        truncated = truncated_verdict(finish_reason)
        gold_letter = choice_letter(gold, choices=choices)
        if gold_letter is None:
            verdict = Verdict(0.0, GOLD_UNPARSABLE, detail=self.check_gold(gold, choices=choices) or "")
        elif truncated is not None:
            verdict = truncated
        else:
            letter = choice_letter(response, choices=choices)
            if letter is None:
                verdict = Verdict(0.0, NO_ANSWER, detail="no option letter found in the response")
            elif letter == gold_letter:
                verdict = Verdict(1.0, CORRECT, letter)
            else:
                verdict = Verdict(0.0, WRONG, letter, detail=f"chose {letter}, the answer is {gold_letter}")
        return self.stats.record(verdict, gold)


_default = MCQVerifier()


def mcq_verdict(
    response: str, gold: str, *, choices: tuple[str, ...] = (), finish_reason: FinishReason = "stop"
) -> Verdict:
    """The :class:`Verdict` of the shared multiple-choice verifier."""
    return _default.score(response, gold, finish_reason=finish_reason, choices=tuple(choices))


def mcq_reward(
    response: str, gold: str, *, choices: tuple[str, ...] = (), finish_reason: FinishReason = "stop"
) -> float:
    """1.0 if ``response`` chooses the gold option, else 0.0 (0.0 when truncated). ``gold`` is a
    letter ("B", "(B)", "Answer: B") or, with ``choices``, an option's text. Raises
    :class:`UnparsableGoldError` when the gold names no option."""
    verdict = mcq_verdict(response, gold, choices=choices, finish_reason=finish_reason)
    if verdict.skip:
        raise UnparsableGoldError(verdict.detail)
    return verdict.reward
