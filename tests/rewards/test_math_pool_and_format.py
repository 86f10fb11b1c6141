"""The MATH verifier scores a batch over its worker pool (same verdicts as one by one; a runaway parse
holds one worker, not the step) and offers ``answer_format: boxed_or_answer_line`` for base models'
"The answer is: X" endings (the default stays: only the last ``\\boxed{}`` counts)."""

from __future__ import annotations

import threading
import time

import pytest

from mrl_llm.rewards import ScoreRequest, answer_line, get_verifier, response_answer, score_problems
from mrl_llm.rewards.math_verifier import MathVerifier
from tests.rewards.test_math_verifier import HANG

REQUESTS = [
    ScoreRequest(r"Thus $\boxed{\frac{1}{2}}$.", "0.5"),
    ScoreRequest(r"\boxed{3}", r"\boxed{4}"),
    ScoreRequest(r"\boxed{x^2+2x+1}", "(x+1)^2"),
    ScoreRequest(r"\boxed{52_8}", "52_9"),
    ScoreRequest("The answer is 5.", "5"),
    ScoreRequest(r"\boxed{2}", "2", "length"),
    ScoreRequest(r"\boxed{1}", r"an empty box \boxed{}"),  # an unusable gold: a skip verdict
    ScoreRequest(r"\boxed{(1,2)}", "(1, 2)"),
    ScoreRequest(r"\boxed{\sqrt{2}}", r"\sqrt{3}"),
    ScoreRequest("", "7"),
]


def test_score_many_over_the_pool_equals_serial_scoring():
    serial, pooled = MathVerifier(n_workers=1), MathVerifier(n_workers=3)
    try:
        expected = [serial.score(r.response, r.gold, finish_reason=r.finish_reason) for r in REQUESTS * 2]
        assert pooled.score_many(REQUESTS * 2) == expected
        assert pooled.stats.counts() == serial.stats.counts()
        assert pooled.score_many([]) == []
        with pytest.raises(ValueError, match="finish_reason"):
            pooled.score_many([ScoreRequest(r"\boxed{1}", "1", "eos"), *REQUESTS])
    finally:
        serial.close()
        pooled.close()


def test_default_pool_size_is_two_and_configurable():
    v = get_verifier("math")
    w = get_verifier("math", n_workers=4)
    try:
        assert (v.n_workers, len(v._pool.workers)) == (2, 2)
        assert len(w._pool.workers) == 4
    finally:
        v.close()
        w.close()


class _Timed(MathVerifier):
    """Records when each verdict is reached (seconds on the monotonic clock) and its reason."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.done: list[tuple[float, str]] = []
        self._lock2 = threading.Lock()

    def score(self, response, gold, *, finish_reason="stop", choices=()):
        v = super().score(response, gold, finish_reason=finish_reason, choices=choices)
        with self._lock2:
            self.done.append((time.monotonic(), v.reason))
        return v


def test_a_runaway_parse_among_many_costs_one_timeout_not_a_stall():
    timeout = 3.0
    v = _Timed(timeout_s=timeout, n_workers=2)
    try:
        v.score_many([ScoreRequest(r"\boxed{1}", "1"), ScoreRequest(r"\boxed{2}", "2")])  # both workers up
        v.done.clear()
        batch = [ScoreRequest(HANG, "1")] + [ScoreRequest(rf"\boxed{{{i}}}", str(i)) for i in range(20)]
        start = time.monotonic()
        out = v.score_many(batch)
        elapsed = time.monotonic() - start
        assert out[0].reason == "timeout" and all(o.correct for o in out[1:])
        # the other 20 were scored by the free worker while the runaway held its own until the deadline
        # (one at a time they would all wait behind it: timeout + a fresh worker's start-up first)
        correct_done = [t - start for t, reason in v.done if reason == "correct"]
        assert len(correct_done) == 20 and max(correct_done) < timeout
        assert elapsed < timeout + 3.0  # about one timeout for the whole batch
    finally:
        v.close()


def test_score_problems_batches_and_keeps_order():
    from mrl_llm.data import Problem

    probs = [Problem(f"p{i}", "q", str(i), "math") for i in range(4)]
    v = MathVerifier(n_workers=2)
    try:
        out = score_problems(v, [(p, rf"\boxed{{{i % 2}}}", "stop") for i, p in enumerate(probs)])
        assert [o.correct for o in out] == [True, True, False, False]
        assert score_problems(v, []) == []
        with pytest.raises(ValueError, match="data.verifier"):
            score_problems(v, [(Problem("x", "q", "1", "mcq"), "A", "stop")])
    finally:
        v.close()


# -- answer_format ---------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("2 + 3 = 5.\nThe answer is: 5", "5"),
        ("So we get 12.\nThe answer is 12.", "12"),
        ("The final answer is 7.", "7"),
        ("The final answer is: 3.5.", "3.5"),
        (r"Final Answer: The final answer is $\frac{1}{2}$. I hope it is correct.", r"\frac{1}{2}"),
        (r"the answer is $$x^2$$", "x^2"),
        ("THE ANSWER IS: -4", "-4"),
        ("The answer is 1,000.", "1,000"),
        ("The answer is 3. Next question: the answer is: 9", "9"),  # the last phrase counts
        ("The answer is 3.\nQ: what is 2+2?", "3"),  # the phrase's own line only
        ("The answer is: ", None),  # empty
        ("The answer is: $5", None),  # an unclosed $...$
        ("", None),
        ("I have no idea.", None),
        ("answering is hard", None),
    ],
)
def test_answer_line(text, answer):
    assert answer_line(text) == answer


def test_response_answer_rules():
    assert response_answer("The answer is: 5") is None  # default: boxed only
    assert response_answer("The answer is: 5", "boxed_or_answer_line") == "5"
    # a response that boxes is judged by its last box, whatever its answer line says
    assert response_answer(r"\boxed{4}. The answer is: 5", "boxed_or_answer_line") == "4"
    assert response_answer(r"\boxed{4 The answer is: 5", "boxed_or_answer_line") is None
    with pytest.raises(ValueError, match="answer_format"):
        response_answer("x", "latex")


BASE_MODEL_RESPONSES = [
    ("Natalia sold 48 / 2 = 24 clips in May. 48 + 24 = 72.\nThe answer is: 72", "72"),
    ("We have x = 1/2.\nThe final answer is $\\frac{1}{2}$. I hope it is correct.", "0.5"),
    ("The total is 3.5 dollars.\nThe final answer is 3.5.", r"\frac{7}{2}"),
]


def test_boxed_or_answer_line_scores_base_model_responses():
    boxed, lines = MathVerifier(n_workers=1), MathVerifier(n_workers=1, answer_format="boxed_or_answer_line")
    try:
        for response, gold in BASE_MODEL_RESPONSES:
            assert boxed.score(response, gold).reason == "no_answer"  # the default is unchanged
            assert lines.score(response, gold).correct, response
        assert lines.score("The answer is: 71", "72").reason == "wrong"
        v = lines.score("I do not know", "72")
        assert v.reason == "no_answer" and "The answer is" in v.detail
        assert lines.score("The answer is: 72", "72", finish_reason="length").reason == "truncated"
    finally:
        boxed.close()
        lines.close()


def test_bad_answer_format_is_refused():
    with pytest.raises(ValueError, match="answer_format"):
        MathVerifier(answer_format="boxed_or_anything")
