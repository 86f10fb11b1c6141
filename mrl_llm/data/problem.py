"""The typed training / evaluation item: :class:`Problem`.

A problem is what every policy is prompted with at a step: a stable ``prompt_id`` (the key the
exchange groups records by), the ``question`` text, the ``gold`` answer the verifier named by
``verifier`` checks responses against, optional multiple-choice ``choices`` (rendered as lettered
options ``A. ...``), an optional ``family`` (a category used for per-family metrics and the
peer-exclusive split), free ``meta`` (JSON values copied from the row, read-only) and its few-shot
examples ``shots`` (other problems, rendered before it by the template; drawn by :mod:`mrl_llm.data.shots`).
"""

from __future__ import annotations

import string
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

#: Letters labelling multiple-choice options, in order (A for choices[0], ...).
CHOICE_LETTERS = string.ascii_uppercase


def format_choices(choices: tuple[str, ...]) -> str:
    """Options one per line, labelled ``A.``, ``B.``, ... (empty for no options)."""
    return "\n".join(
        f"{letter}. {choice.strip()}" for letter, choice in zip(CHOICE_LETTERS, choices, strict=False)
    )


class ProblemError(ValueError):
    """A problem (or the data row it came from) is malformed; the message says where and what to do."""


@dataclass(frozen=True)
class Problem:
    """One prompt: ``prompt_id``, ``question``, ``gold`` answer, ``verifier`` name, optional ``choices``
    (multiple-choice options, labelled A, B, ... in order), optional ``family``, read-only ``meta`` and the
    few-shot examples ``shots`` the template renders before it (:mod:`mrl_llm.data.shots`; none by default)."""

    prompt_id: str
    question: str
    gold: str
    verifier: str
    choices: tuple[str, ...] = ()
    family: str | None = None
    meta: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)
    shots: tuple[Problem, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "choices", tuple(self.choices))
        object.__setattr__(self, "shots", tuple(self.shots))
        if not all(isinstance(s, Problem) for s in self.shots):
            raise ProblemError(f"problem {self.prompt_id!r}: shots must be Problems (few-shot examples)")
        object.__setattr__(self, "meta", MappingProxyType(dict(self.meta)))
        for name in ("prompt_id", "question", "gold", "verifier"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value.strip():
                raise ProblemError(
                    f"problem {self.prompt_id!r}: field '{name}' = {value!r} must be a non-empty string"
                )
        if len(self.choices) > len(CHOICE_LETTERS):
            raise ProblemError(
                f"problem {self.prompt_id!r}: {len(self.choices)} choices; at most {len(CHOICE_LETTERS)} are supported"
            )
        for i, choice in enumerate(self.choices):
            if not isinstance(choice, str) or not choice.strip():
                raise ProblemError(
                    f"problem {self.prompt_id!r}: choices[{i}] = {choice!r} must be a non-empty string"
                )
        if self.family is not None and (not isinstance(self.family, str) or not self.family):
            raise ProblemError(
                f"problem {self.prompt_id!r}: family = {self.family!r} must be a non-empty string or null"
            )

    @property
    def choice_letters(self) -> str:
        """The option letters in use (``"ABCD"`` for four choices; ``""`` when not multiple-choice)."""
        return CHOICE_LETTERS[: len(self.choices)]

    def formatted_choices(self) -> str:
        """The options one per line, ``"A. first\\nB. second"`` (empty when not multiple-choice)."""
        return format_choices(self.choices)

    def to_row(self) -> dict[str, Any]:
        """The problem as a JSONL row of the default schema (see :mod:`mrl_llm.data.jsonl`)."""
        row: dict[str, Any] = {"id": self.prompt_id, "question": self.question, "answer": self.gold}
        if self.choices:
            row["choices"] = list(self.choices)
        if self.family is not None:
            row["family"] = self.family
        if self.meta:
            row["meta"] = dict(self.meta)
        return row
