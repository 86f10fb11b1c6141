"""The synthetic arithmetic task: deterministic generation, the family split, the checker."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mrl_llm.rewards import ArithmeticTask, Family, UnparsableGoldError, arithmetic_reward, reference_response
from mrl_llm.rewards.arithmetic import FAMILIES, ArithmeticVerifier, arithmetic_verdict


def test_generation_is_deterministic_and_ids_unique():
    a = ArithmeticTask(families=("add", "sub", "mul"), seed=3)
    b = ArithmeticTask(families=("add", "sub", "mul"), seed=3)
    for split in ("train", "eval", "all"):
        assert a.problems(split) == b.problems(split)
    ids = [p.prompt_id for p in a.problems("all")]
    assert len(ids) == len(set(ids)) == 400 + 210 + 200


def test_problem_contents():
    task = ArithmeticTask(families=("add", "sub", "mul"))
    by_id = {p.prompt_id: p for p in task.problems("all")}
    p = by_id["add:12+7"]
    assert (p.question, p.gold, p.family, p.verifier) == ("What is 12+7?", "19", "add", "arithmetic")
    assert by_id["mul:9*19"].gold == "171"
    assert by_id["sub:13-5"].gold == "8"
    assert "sub:3-5" not in by_id  # differences are non-negative
    assert max(len(p.question) for p in by_id.values()) <= 14


def test_split_is_disjoint_complete_and_per_family():
    task = ArithmeticTask(families=("add", "mul"), eval_fraction=0.25, seed=0)
    for fam in ("add", "mul"):
        train = {p.prompt_id for p in task.problems("train", [fam])}
        held = {p.prompt_id for p in task.problems("eval", [fam])}
        every = {p.prompt_id for p in task.problems("all", [fam])}
        assert not train & held and train | held == every
        assert len(held) == round(0.25 * len(every))
        assert {p.family for p in task.problems("all", [fam])} == {fam}
    # a family's split does not depend on the other families in the task
    alone = ArithmeticTask(families=("mul",), eval_fraction=0.25, seed=0)
    assert alone.problems("eval") == task.problems("eval", ["mul"])
    # another seed holds out other prompts
    other = ArithmeticTask(families=("add", "mul"), eval_fraction=0.25, seed=1)
    assert other.problems("eval") != task.problems("eval")


def test_task_validation():
    with pytest.raises(ValueError, match="distinct"):
        ArithmeticTask(families=("add", "add"))
    with pytest.raises(KeyError, match="unknown arithmetic family"):
        ArithmeticTask(families=("div",))
    with pytest.raises(KeyError, match="not in this task"):
        ArithmeticTask(families=("add",)).problems("train", ["mul"])
    with pytest.raises(ValueError, match="eval_fraction"):
        ArithmeticTask(eval_fraction=1.0)
    small = Family("tiny", "+", (0, 2), (0, 2))
    assert len(ArithmeticTask(families=(small,), eval_fraction=0.0).problems("train")) == 9


def test_reference_response_passes_every_problem_and_neighbours_fail():
    task = ArithmeticTask(families=tuple(FAMILIES))
    for p in task.problems("all"):
        assert arithmetic_reward(reference_response(p), p.gold) == 1.0
        assert arithmetic_reward(reference_response(p), str(int(p.gold) + 1)) == 0.0


@given(a=st.integers(0, 10**6), b=st.integers(-(10**6), 10**6))
def test_checker_compares_integers(a, b):
    assert arithmetic_reward(f"so \\boxed{{{a}}}", str(b)) == float(a == b)


def test_checker_reasons():
    v = ArithmeticVerifier()
    assert v.score(r"\boxed{19}", "19").correct
    assert v.score(r"\boxed{019}", "19").correct
    assert v.score(r"\boxed{18}", "19").reason == "wrong"
    assert v.score("19", "19").reason == "no_answer"
    assert v.score(r"\boxed{nineteen}", "19").reason == "no_answer"
    assert v.score(r"\boxed{19}", "19", finish_reason="length").reason == "truncated"
    assert v.score(r"\boxed{19}", "x").skip
    assert v.stats.counts()["total"] == 7
    with pytest.raises(UnparsableGoldError):
        arithmetic_reward(r"\boxed{1}", "one")


def test_prompts_are_short_in_real_tokenizers(shared_dir):
    from transformers import AutoTokenizer

    task = ArithmeticTask(families=tuple(FAMILIES))
    for name in ("llama2", "qwen1.5"):
        tok = AutoTokenizer.from_pretrained(shared_dir / "tokenizers" / name)
        texts = [p.question + "\n" + reference_response(p) for p in task.problems("all")]
        longest = max(len(ids) for ids in tok(texts)["input_ids"])
        assert longest <= 32, (name, longest)


def test_task_from_a_config_mapping():
    from shared_interfaces.config_io import from_mapping

    task = from_mapping(
        ArithmeticTask,
        {"families": ["add", {"name": "big", "op": "+", "a_range": [0, 99], "b_range": [0, 9]}], "seed": 2},
    )
    assert task.family_names == ("add", "big")
    assert len(task.problems("all", ["big"])) == 1000


def test_numerals_longer_than_python_int_limit_are_scored_not_raised():
    """``int()`` refuses over 4,300 digits (ValueError from inside score); the verdict compares the digits."""
    v = ArithmeticVerifier()
    huge = "9" * 100_000
    assert v.score(rf"\boxed{{{huge}}}", "19").reason == "wrong"
    assert v.score(rf"\boxed{{{huge}}}", huge).correct
    assert v.score(rf"\boxed{{-000{huge}}}", f"-{huge}").correct
    assert v.score(rf"\boxed{{{huge}8}}", huge).reason == "wrong"
    assert v.score(r"\boxed{19}", huge).reason == "wrong"


@given(a=st.integers(-10**6, 10**6), b=st.integers(-10**6, 10**6), pad=st.integers(0, 3), plus=st.booleans())
def test_integer_comparison_is_int_equality(a, b, pad, plus):
    text = ("-" if a < 0 else "+" if plus else "") + "0" * pad + str(abs(a))
    assert (arithmetic_verdict(rf"\boxed{{{text}}}", str(b)).correct) == (a == b)
    assert arithmetic_verdict(r"\boxed{١٩}", "19").correct and arithmetic_verdict(r"\boxed{-0}", "0").correct
