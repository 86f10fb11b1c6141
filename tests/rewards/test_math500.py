"""MATH-500: the verifier accepts every gold solution against its own final answer (bare, and as the
full solution) and rejects a perturbed answer (the first number + 1; ``+ 1`` appended when there is
no number) and another problem's different answer."""

from __future__ import annotations

import json
import re

import pytest

from mrl_llm.rewards.extract import gold_answer


@pytest.fixture(scope="module")
def math500(shared_dir):
    path = shared_dir / "data" / "math500.jsonl"
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    assert len(rows) == 500
    return rows


def perturb(answer: str) -> str:
    m = re.search(r"\d+", answer)
    if m is None:
        return answer + " + 1"
    return answer[: m.start()] + str(int(m.group()) + 1) + answer[m.end() :]


def test_every_gold_parses_and_matches_itself(math_verifier, math500):
    failures = []
    for i, row in enumerate(math500):
        final = gold_answer(row["answer"])
        assert final, f"row {i}: no final answer in the gold solution"
        for gold in (final, row["answer"]):
            verdict = math_verifier.score(row["answer"], gold)
            if not verdict.correct:
                failures.append((i, final, verdict))
    assert failures == []


def test_every_perturbed_answer_is_rejected(math_verifier, math500):
    failures = []
    for i, row in enumerate(math500):
        wrong = perturb(gold_answer(row["answer"]))
        verdict = math_verifier.score(f"So the answer is $\\boxed{{{wrong}}}$.", row["answer"])
        if verdict.reward != 0.0 or verdict.reason != "wrong":
            failures.append((i, wrong, verdict))
    assert failures == []


def _rhs(answer: str) -> str:
    return re.sub(r"^[a-z]\s*=", "", answer.replace(" ", ""))


def test_other_problems_answers_are_rejected(math_verifier, math500):
    finals = [gold_answer(r["answer"]) for r in math500]
    accepted = []
    for i in range(500):
        j = (i + 1) % 500
        # the same value written alike ("x = 5" is accepted for "5": an assignment's right-hand side)
        if _rhs(finals[i]) == _rhs(finals[j]):
            continue
        if math_verifier.score(f"\\boxed{{{finals[j]}}}", finals[i]).correct:
            accepted.append((finals[i], finals[j]))
    assert accepted == []
