"""Verifiers by name, as configs name them: ``math``, ``mcq``, ``arithmetic``.

``get_verifier(name, **options)`` builds a new verifier (the caller owns it and may ``close()`` it);
options go to its constructor (``math``: ``timeout_s``, ``n_workers``, ``startup_timeout_s``).
:func:`score_problem` scores a response to a :class:`~mrl_llm.data.Problem`; :func:`gold_checker`
plugs a verifier's gold check into the dataset loader.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mrl_llm.data.problem import Problem
from mrl_llm.rewards.arithmetic import ArithmeticVerifier
from mrl_llm.rewards.math_verifier import MathVerifier
from mrl_llm.rewards.mcq import MCQVerifier
from mrl_llm.rewards.verdict import FinishReason, Verdict, Verifier

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


def score_problem(verifier: Verifier, problem: Problem, response: str, *, finish_reason: FinishReason) -> Verdict:
    """``verifier``'s verdict on ``response`` to ``problem`` (its gold and, for multiple choice, options)."""
    if problem.verifier != verifier.name:
        raise ValueError(
            f"problem {problem.prompt_id!r} is for verifier {problem.verifier!r}, not {verifier.name!r}; "
            "check data.verifier in the config"
        )
    return verifier.score(response, problem.gold, finish_reason=finish_reason, choices=problem.choices)


def gold_checker(verifier: Verifier) -> Callable[[Problem], str | None]:
    """A ``check_gold`` callable for :func:`mrl_llm.data.load_jsonl`: rows whose gold ``verifier``
    cannot use are skipped and reported at load time instead of at every step."""
    return lambda problem: verifier.check_gold(problem.gold, choices=problem.choices)
