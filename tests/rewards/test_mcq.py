"""Multiple-choice verifier: answer formats, gold forms, truncation, unusable golds."""

from __future__ import annotations

import pytest

from mrl_llm.rewards import UnparsableGoldError, choice_letter, mcq_reward
from mrl_llm.rewards.mcq import MCQVerifier

CHOICES = ("London", "Paris", "Rome", "Oslo")


@pytest.mark.parametrize(
    ("response", "letter"),
    [
        ("Answer: (B)", "B"),
        ("answer: b", "B"),
        ("the answer is b", "B"),
        ("The correct answer is (c) because ...", "C"),
        ("**Answer:** D", "D"),
        ("**Final Answer**: (A)", "A"),
        (r"so $\boxed{B}$", "B"),
        (r"\boxed{(C)}", "C"),
        (r"\boxed{\text{(C)}}", "C"),
        (r"\boxed{\textbf{D}}", "D"),
        (r"\boxed{C. Rome}", "C"),
        ("B", "B"),
        ("(E)", "E"),
        ("B) 42", "B"),
        ("C.", "C"),
        ("I first thought A. Final answer: b.", "B"),  # the last answer phrase wins
        ("Choice (d)", "D"),
        ("the answer is option C", "C"),
        ("The answer is a good one to think about. Answer: C", "C"),  # 'a' there is an article
        ("no idea", None),
        ("the options are A and B", None),
        ("adoption is a process", None),
    ],
)
def test_choice_letter_formats(response, letter):
    assert choice_letter(response) == letter


def test_letters_limited_to_the_options():
    assert choice_letter("Answer: F") == "F"  # A-J without options
    assert choice_letter("Answer: F", choices=CHOICES) is None
    assert choice_letter("Answer: K") is None


def test_option_text_counts_with_choices():
    assert choice_letter(r"\boxed{Paris}", choices=CHOICES) == "B"
    assert choice_letter("  paris. ", choices=CHOICES) == "B"
    assert choice_letter(r"\boxed{Paris}") is None


def test_scores_and_reasons():
    v = MCQVerifier()
    assert v.score("Answer: (B)", "B", choices=CHOICES).correct
    assert v.score("Answer: (B)", "(b)", choices=CHOICES).correct
    assert v.score("Answer: (B)", "Paris", choices=CHOICES).correct  # gold as the option text
    assert v.score(r"\boxed{B}", r"The answer is $\boxed{B}$").correct  # gold as a solution
    wrong = v.score("Answer: C", "B", choices=CHOICES)
    assert (wrong.reward, wrong.reason, wrong.extracted) == (0.0, "wrong", "C")
    assert v.score("I do not know", "B").reason == "no_answer"
    assert v.score("Answer: B", "B", finish_reason="length").reason == "truncated"
    bad = v.score("Answer: B", "Berlin", choices=CHOICES)
    assert bad.skip and bad.reason == "gold_unparsable"
    assert v.check_gold("Berlin", choices=CHOICES) is not None and v.check_gold("b") is None
    counts = v.stats.counts()
    assert counts["correct"] == 4 and counts["wrong"] == 1 and counts["skipped"] == 1 and counts["total"] == 8


def test_plain_function():
    assert mcq_reward("the answer is b", "B") == 1.0
    assert mcq_reward("the answer is c", "B") == 0.0
    assert mcq_reward("the answer is b", "B", finish_reason="length") == 0.0
    with pytest.raises(UnparsableGoldError):
        mcq_reward("B", "not a letter at all")


@pytest.mark.parametrize("text", ["Answer" + " " * 20_000 + "!", "Answer:" + "\n" * 20_000, "answer:" + " :*" * 20_000,
                                  "the answer is b z " * 100_000, "answer: B " * 100_000])
def test_adversarial_text_is_scored_in_linear_time(text):
    """Long whitespace runs after "Answer" made the phrase regex backtrack cubically (1,000 spaces: 8 s;
    20,000: hours), and many phrases made the scan quadratic; each of these now takes milliseconds."""
    import time

    t0 = time.perf_counter()
    letter = choice_letter(text)
    assert time.perf_counter() - t0 < 2.0
    assert letter == ("B" if text.startswith("answer: B") else None)
