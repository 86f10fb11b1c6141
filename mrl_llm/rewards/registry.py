"""Verifiers by name, as configs name them: ``math``, ``mcq``, ``arithmetic``.

``get_verifier(name, **options)`` builds a new verifier (the caller owns it and may ``close()`` it);
options go to its constructor (``math``: ``timeout_s``, ``n_workers``, ``startup_timeout_s``,
``answer_format``). :func:`score_problem` scores a response to a :class:`~mrl_llm.data.Problem`,
:func:`score_problems` a batch of them (over the MATH verifier's worker pool: ``score_many``);
:func:`gold_checker` plugs a verifier's gold check into the dataset loader.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from mrl_llm.data.problem import Problem
from mrl_llm.rewards.arithmetic import ArithmeticVerifier
from mrl_llm.rewards.math_verifier import MathVerifier
from mrl_llm.rewards.mcq import MCQVerifier
from mrl_llm.rewards.verdict import FinishReason, ScoreRequest, Verdict, Verifier

VERIFIERS: dict[str, Callable[..., Verifier]] = {
    "math": MathVerifier,
    "mcq": MCQVerifier,
    "arithmetic": ArithmeticVerifier,
}


def get_verifier(name: str, **options: Any) -> Verifier:
    """A new verifier named ``name`` (see :data:`VERIFIERS`) built with ``options``."""
    if name not in VERIFIERS:
        raise KeyError(f"unknown verifier {name!r}; known verifiers: {sorted(VERIFIERS)}")
    try:
        return VERIFIERS[name](**options)
    except TypeError as err:
        raise ValueError(f"verifier {name!r} does not take options {sorted(options)}: {err}") from err


def close_verifier(verifier: Verifier) -> None:
    """Release a verifier's resources (the MATH verifier's worker processes); a no-op for the others."""
    close = getattr(verifier, "close", None)
    if close is not None:
        close()


def _check_name(verifier: Verifier, problem: Problem) -> None:
    if problem.verifier != verifier.name:
        raise ValueError(
            f"problem {problem.prompt_id!r} is for verifier {problem.verifier!r}, not {verifier.name!r}; "
            "check data.verifier in the config"
        )


def score_problem(
    verifier: Verifier, problem: Problem, response: str, *, finish_reason: FinishReason
) -> Verdict:
    """``verifier``'s verdict on ``response`` to ``problem`` (its gold and, for multiple choice, options)."""
    _check_name(verifier, problem)
    return verifier.score(response, problem.gold, finish_reason=finish_reason, choices=problem.choices)


def score_problems(
    verifier: Verifier, items: Sequence[tuple[Problem, str, FinishReason]]
) -> list[Verdict]:
    """:func:`score_problem` of each ``(problem, response, finish_reason)`` in ``items``, in order; a
    verifier with a ``score_many`` (the MATH verifier: its worker pool) gets the whole batch at once."""
    for problem, _, _ in items:
        _check_name(verifier, problem)
    requests = [ScoreRequest(text, p.gold, fr, p.choices) for p, text, fr in items]
    many = getattr(verifier, "score_many", None)
    if many is not None:
        return list(many(requests))
    return [verifier.score(r.response, r.gold, finish_reason=r.finish_reason, choices=r.choices) for r in requests]


def gold_checker(verifier: Verifier) -> Callable[[Problem], str | None]:
    """A ``check_gold`` callable for :func:`mrl_llm.data.load_jsonl`: rows whose gold ``verifier``
    cannot use are skipped and reported at load time instead of at every step."""
    return lambda problem: verifier.check_gold(problem.gold, choices=problem.choices)
