"""Last-\\boxed{} extraction and gold-answer handling."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mrl_llm.rewards.extract import gold_answer, last_boxed, number_base


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"so the answer is $\boxed{\frac{1}{2}}$.", r"\frac{1}{2}"),
        (r"\boxed{1} first, then \boxed{2}", "2"),
        (r"\boxed{\{1, 2\}}", r"\{1, 2\}"),
        (r"\boxed{a{b{c}}d}", "a{b{c}}d"),
        (r"\boxed 42.", "42"),
        (r"$\boxed 7$", "7"),
        (r"\fbox{7}", "7"),
        (r"\boxed {  5 }", "5"),
        (r"\boxed{3} and then \boxed{4", None),  # the last box is unclosed: no answer
        (r"\boxed{}", None),
        (r"\boxed{   }", None),
        (r"\boxedx{3}", None),
        (r"\boxed", None),
        ("no box at all", None),
        (r"\boxed{\left( 3, \frac{\pi}{2} \right)}", r"\left( 3, \frac{\pi}{2} \right)"),
    ],
)
def test_last_boxed_hand_cases(text, expected):
    assert last_boxed(text) == expected


_atoms = st.text(alphabet="ab12+-^_ =.,()", min_size=0, max_size=6)
_balanced = st.recursive(_atoms, lambda inner: st.lists(inner | inner.map(lambda s: "{" + s + "}"), max_size=3).map("".join), max_leaves=8)


@given(prefix=st.text(alphabet="xyz 12+{}()$.", max_size=20), content=_balanced, suffix=st.text(alphabet="xyz 12+$.", max_size=20))
def test_last_boxed_recovers_any_balanced_content(prefix, content, suffix):
    text = prefix + r"\boxed{" + content + "}" + suffix
    expected = content.strip() or None
    assert last_boxed(text) == expected


def test_gold_answer_bare_or_solution():
    assert gold_answer("  42 ") == "42"
    assert gold_answer(r"$\frac{1}{2}$") == r"\frac{1}{2}"
    assert gold_answer(r"We get $\boxed{7}$.The answer is: 7") == "7"
    assert gold_answer(r"broken \boxed{7") is None
    assert gold_answer("   ") is None


def test_number_base():
    assert number_base("52_8") == 8
    assert number_base("4210_{5}") == 5
    assert number_base("4210") is None
    assert number_base("x_1 + x_2") is None
