"""Verifiers by name; scoring a Problem; the gold check used by the loader."""

from __future__ import annotations

import pytest

from mrl_llm.data import Problem
from mrl_llm.rewards import VERIFIERS, Verifier, close_verifier, get_verifier, gold_checker, score_problem


@pytest.mark.parametrize("name", sorted(VERIFIERS))
def test_every_verifier_by_name(name):
    v = get_verifier(name)
    try:
        assert isinstance(v, Verifier) and v.name == name
        problem = {
            "math": Problem("m1", "1/2 = ?", r"\frac{1}{2}", "math"),
            "mcq": Problem("q1", "Capital of France?", "B", "mcq", choices=("London", "Paris")),
            "arithmetic": Problem("a1", "What is 1+1?", "2", "arithmetic"),
        }[name]
        good = {"math": r"\boxed{0.5}", "mcq": "Answer: (B)", "arithmetic": r"\boxed{2}"}[name]
        assert score_problem(v, problem, good, finish_reason="stop").correct
        assert score_problem(v, problem, good, finish_reason="length").reason == "truncated"
        assert gold_checker(v)(problem) is None
    finally:
        close_verifier(v)


def test_unknown_names_and_options():
    with pytest.raises(KeyError, match="known verifiers"):
        get_verifier("judge")
    with pytest.raises(ValueError, match="does not take options"):
        get_verifier("mcq", timeout_s=3)
    v = get_verifier("math", timeout_s=2.0)
    assert v.timeout_s == 2.0
    close_verifier(v)


def test_score_problem_refuses_the_wrong_verifier():
    v = get_verifier("arithmetic")
    with pytest.raises(ValueError, match="data.verifier"):
        score_problem(v, Problem("m1", "q", "1", "math"), r"\boxed{1}", finish_reason="stop")
