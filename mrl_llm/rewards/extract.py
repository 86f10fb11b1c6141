"""Answer extraction: the content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) in a text, and
the answer of a closing "The answer is ..." line (:func:`answer_line`, for base models' responses).

Rule: find the last ``\\boxed`` / ``\\fbox`` command (not a prefix of a longer command name such as
``\\boxedx``). If braces follow (spaces allowed before them), the content runs to the matching closing
brace: nested ``{}`` groups are followed and escaped braces ``\\{`` ``\\}`` do not count. Otherwise,
``\\boxed 42`` (a space then a token) boxes the next run of characters up to whitespace or ``$``,
without a trailing ``.`` or ``,``. The **last** command decides: if it is unclosed (a response
truncated mid-answer) or empty, there is no answer, even when an earlier box exists.
"""

from __future__ import annotations

import re
from typing import Literal

AnswerFormat = Literal["boxed", "boxed_or_answer_line"]
ANSWER_FORMATS: tuple[str, ...] = ("boxed", "boxed_or_answer_line")

_BOX = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")


def _braced(text: str, start: int) -> str | None:
    """The content of the ``{...}`` group opening at ``text[start]``, or ``None`` when unclosed."""
    depth = 0
    i = start
    n = len(text)
    while i < n:
        ch = text[i]
        if ch == "\\":
            i += 2
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[start + 1 : i]
        i += 1
    return None


def last_boxed(text: str) -> str | None:
    """The stripped content of the last ``\\boxed``/``\\fbox`` in ``text``; ``None`` if there is none,
    or the last one is unclosed or empty."""
    matches = list(_BOX.finditer(text))
    if not matches:
        return None
    end = matches[-1].end()
    rest = text[end:]
    stripped = rest.lstrip()
    if stripped.startswith("{"):
        content = _braced(text, end + (len(rest) - len(stripped)))
    elif rest[:1].isspace() and stripped:
        m = re.match(r"[^\s$]+", stripped)
        content = m.group(0).rstrip(".,") if m else None
    else:
        content = None
    if content is None or not content.strip():
        return None
    return content.strip()


def gold_answer(gold: str) -> str | None:
    """The final answer of a gold string: the last box's content when ``gold`` holds a ``\\boxed``
    (a full solution), else the stripped gold itself (a bare answer); ``None`` when empty or when the
    last box is unclosed/empty."""
    if _BOX.search(gold):
        return last_boxed(gold)
    stripped = gold.strip()
    if stripped.startswith("$") and stripped.endswith("$") and len(stripped) > 1:
        stripped = stripped.strip("$").strip()
    return stripped or None


_BASE = re.compile(r"^\(?\s*[0-9A-Za-z]+\s*\)?\s*_\s*(?:\{\s*(\d+)\s*\}|(\d+))$")


def number_base(answer: str) -> int | None:
    """The base of a numeral written with a base subscript (``52_8``, ``4210_{5}``), else ``None``.
    math-verify ignores subscripts, so the MATH verifier checks bases itself."""
    m = _BASE.match(answer.strip())
    if m is None:
        return None
    return int(m.group(1) or m.group(2))


#: "The answer is: X", "The final answer is X.", "Final Answer: The final answer is $X$. I hope it is
#: correct." (Minerva's format), "the answer is $X$" — case-insensitive, ``:`` optional.
_ANSWER_LINE = re.compile(r"\b(?:final\s+)?answer\s+is\s*:?[ \t]*", re.IGNORECASE)


def answer_line(text: str) -> str | None:
    """The answer of the **last** "answer is" phrase in ``text`` (``None`` when there is none or it is
    empty). Rule: after the last match of ``(final )answer is(:)`` (case-insensitive), on the same
    line: a ``$...$`` (or ``$$...$$``) group is the answer when the text starts with one; otherwise
    the text runs to the first full stop that ends a sentence (``.`` followed by whitespace or the
    end of the line), and one trailing ``.`` ``,`` ``;`` or ``!`` is dropped. So "The answer is: 3.5."
    gives ``3.5`` and "The final answer is $\\frac{1}{2}$. I hope it is correct." gives ``\\frac{1}{2}``.
    """
    matches = list(_ANSWER_LINE.finditer(text))
    if not matches:
        return None
    rest = text[matches[-1].end():].split("\n", 1)[0].strip()
    if rest.startswith("$"):
        delim = "$$" if rest.startswith("$$") else "$"
        end = rest.find(delim, len(delim))
        content = rest[len(delim):end] if end >= 0 else None
    else:
        m = re.search(r"\.(?:\s|$)", rest)
        content = (rest[: m.start()] if m else rest).rstrip(".,;!")
    if content is None or not content.strip():
        return None
    return content.strip()


def response_answer(text: str, answer_format: AnswerFormat = "boxed") -> str | None:
    """The answer a response gives under ``answer_format``: ``boxed`` — the last box
    (:func:`last_boxed`) only; ``boxed_or_answer_line`` — the last box when the response has any
    ``\\boxed``/``\\fbox`` command (an unclosed last box is still no answer), else the last
    "answer is" phrase (:func:`answer_line`)."""
    if answer_format == "boxed" or _BOX.search(text):
        return last_boxed(text)
    if answer_format == "boxed_or_answer_line":
        return answer_line(text)
    raise ValueError(f"answer_format must be one of {ANSWER_FORMATS}, got {answer_format!r}")
