"""The MATH verifier: hand cases, truncation, unusable golds (skip + counters), timeouts off the main
thread, the worker process's own kill switch, and the plain functions."""

from __future__ import annotations

import logging
import os
import threading
import time

import pytest

from mrl_llm.rewards import UnparsableGoldError, math_reward, math_verdict
from mrl_llm.rewards.math_verifier import WORKER_SCRIPT, MathVerifier
from mrl_llm.rewards.sandbox import DeadlineWorker, WorkerFailed

#: sympy tries to evaluate this power: minutes of big-integer work inside C, holding the GIL.
HANG = r"\boxed{2^{2^{2^{2^{30}}}}}"


@pytest.mark.parametrize(
    ("response", "gold", "reward"),
    [
        (r"Thus $\boxed{\frac{1}{2}}$.", "0.5", 1.0),
        (r"\boxed{\dfrac12}", r"\frac{1}{2}", 1.0),
        (r"\boxed{0.5}", r"The total is $\boxed{\frac12}$.", 1.0),
        (r"\boxed{3}", r"\boxed{4}", 0.0),
        (r"\boxed{x^2+2x+1}", "(x+1)^2", 1.0),
        (r"\boxed{(1,2)}", r"(1, 2)", 1.0),
        (r"\boxed{\{1,2\}}", r"\{2,1\}", 1.0),
        (r"\boxed 5.", "5", 1.0),
        (r"\fbox{5}", "5", 1.0),
        (r"\boxed{\sqrt{2}}", r"\sqrt{3}", 0.0),
        (r"\boxed{52_8}", "52_9", 0.0),  # math-verify ignores subscripts; bases are checked here
        (r"\boxed{52_8}", "52_8", 1.0),
        ("The answer is 5.", "5", 0.0),  # no box: the answer format is part of the task
        (r"\boxed{5} no wait \boxed{6", "5", 0.0),  # the last box is unclosed
    ],
)
def test_hand_cases(math_verifier, response, gold, reward):
    assert math_verifier.score(response, gold).reward == reward


def test_reasons_and_verified(math_verifier):
    ok = math_verifier.score(r"\boxed{2}", "2")
    assert (ok.reason, ok.verified, ok.skip, ok.extracted) == ("correct", True, False, "2")
    assert math_verifier.score(r"\boxed{3}", "2").reason == "wrong"
    assert math_verifier.score("two", "2").reason == "no_answer"


def test_truncated_response_fails_even_when_right(math_verifier):
    v = math_verifier.score(r"\boxed{2}", "2", finish_reason="length")
    assert (v.reward, v.reason, v.verified) == (0.0, "truncated", True)
    with pytest.raises(ValueError, match="finish_reason"):
        math_verifier.score(r"\boxed{2}", "2", finish_reason="eos")


def test_unparsable_gold_skips_with_counted_warning(caplog):
    v = MathVerifier(timeout_s=5.0)
    try:
        with caplog.at_level(logging.WARNING, logger="mrl_llm.rewards"):
            verdicts = [v.score(r"\boxed{1}", r"solution with an empty box \boxed{}") for _ in range(3)]
            verdicts.append(v.score(r"\boxed{1}", "???", finish_reason="length"))  # skip wins over truncation
        assert all(d.skip and not d.verified and d.reward == 0.0 for d in verdicts)
        assert {d.reason for d in verdicts} == {"gold_unparsable"}
        counts = v.stats.counts()
        assert counts["gold_unparsable"] == counts["skipped"] == 4
        assert counts["distinct_unparsable_golds"] == 2
        warnings = [r for r in caplog.records if "cannot be parsed" in r.getMessage()]
        assert len(warnings) == 2  # once per distinct gold, every sample counted
        assert v.check_gold("???") is not None and v.check_gold(r"\frac{1}{2}") is None
    finally:
        v.close()


def test_timeout_from_a_non_main_thread_then_recovers():
    v = MathVerifier(timeout_s=1.0, n_workers=1)
    try:
        assert v.score(r"\boxed{1}", "1").correct  # warm the worker up (start-up is not timed)
        out = {}

        def run():
            start = time.monotonic()
            out["hang"] = v.score(HANG, "1")
            out["elapsed"] = time.monotonic() - start
            out["after"] = v.score(r"\boxed{\frac{2}{4}}", r"\frac12")

        t = threading.Thread(target=run)
        t.start()
        t.join(60)
        assert not t.is_alive()
        assert out["hang"].reason == "timeout" and out["hang"].reward == 0.0 and out["hang"].verified
        assert out["elapsed"] < 5.0
        assert out["after"].correct  # a fresh worker took over
        assert v.worker_starts == 2
        assert v.stats.counts()["timeout"] == 1
    finally:
        v.close()


def test_concurrent_callers_with_two_workers():
    v = MathVerifier(timeout_s=1.0, n_workers=2)
    try:
        results: dict[int, object] = {}

        def run(i):
            results[i] = v.score(HANG if i == 0 else rf"\boxed{{{i}}}", str(i))

        threads = [threading.Thread(target=run, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert results[0].reason == "timeout"
        assert all(results[i].correct for i in range(1, 6))
    finally:
        v.close()


def test_worker_kills_itself_when_a_request_overruns_even_unattended():
    # kill_after_s = timeout_s + kill_grace_s = 1 s: the child's SIGALRM (default action) ends it
    # while it is stuck in C, long before the parent's 30 s deadline.
    w = DeadlineWorker(WORKER_SCRIPT, kill_grace_s=-29.0)
    try:
        start = time.monotonic()
        with pytest.raises(WorkerFailed, match="exited"):
            w.request({"op": "verify", "gold": "1", "pred": HANG[len(r"\boxed{") : -1]}, timeout_s=30.0)
        assert time.monotonic() - start < 15.0
        assert w.request({"op": "verify", "gold": "1", "pred": "1"}, timeout_s=30.0)["equal"] is True
    finally:
        w.close()


def test_close_stops_the_worker_process():
    v = MathVerifier()
    v.score(r"\boxed{1}", "1")
    pid = v._pool.workers[0].pid
    assert pid is not None
    v.close()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_plain_functions_work_off_the_main_thread():
    out = []
    t = threading.Thread(
        target=lambda: out.append((math_reward(r"\boxed{4}", "4"), math_reward(r"\boxed{5}", "4")))
    )
    t.start()
    t.join(120)
    assert out == [(1.0, 0.0)]
    assert math_reward(r"\boxed{4}", "4", finish_reason="length") == 0.0
    assert math_verdict(r"\boxed{4}", r"\boxed{4}").correct
    with pytest.raises(UnparsableGoldError):
        math_reward(r"\boxed{4}", "")
