"""The deadline worker: start-up, replies, crashes, garbage and timeouts, with small stand-in scripts."""

from __future__ import annotations

import textwrap
import time

import pytest

from mrl_llm.rewards.math_verifier import MathVerifier
from mrl_llm.rewards.sandbox import DeadlineWorker, WorkerFailed, WorkerPool, WorkerStartError, WorkerTimeout

ECHO = """
import json, sys, time
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    req = json.loads(line)
    if req.get("op") == "sleep":
        time.sleep(req["s"])
    if req.get("op") == "die":
        sys.exit(3)
    if req.get("op") == "garbage":
        print("not json", flush=True)
        continue
    if req.get("op") == "wrong_id":
        req["id"] = -1
    print(json.dumps({"id": req["id"], "echo": req.get("x"), "gold_ok": True}), flush=True)
"""


@pytest.fixture
def script(tmp_path):
    def make(body: str):
        path = tmp_path / f"w{len(list(tmp_path.iterdir()))}.py"
        path.write_text(textwrap.dedent(body), encoding="utf-8")
        return path

    return make


def test_echo_and_restart_after_each_failure(script):
    w = DeadlineWorker(script(ECHO))
    try:
        assert w.request({"x": 1}, 5.0)["echo"] == 1
        with pytest.raises(WorkerTimeout):
            w.request({"op": "sleep", "s": 30}, 0.3)
        with pytest.raises(WorkerFailed, match="exited \\(code 3\\)"):
            w.request({"op": "die"}, 5.0)
        with pytest.raises(WorkerFailed, match="not JSON"):
            w.request({"op": "garbage"}, 5.0)
        with pytest.raises(WorkerFailed, match="replied to request -1"):
            w.request({"op": "wrong_id"}, 5.0)
        assert w.request({"x": 2}, 5.0)["echo"] == 2
        assert w.starts == 5
    finally:
        w.close()


def test_start_up_failures_are_clear(script):
    silent = DeadlineWorker(script("import time; time.sleep(30)"), startup_timeout_s=0.5)
    start = time.monotonic()
    with pytest.raises(WorkerStartError, match="did not start within 0.5 s"):
        silent.request({}, 1.0)
    assert time.monotonic() - start < 10
    with pytest.raises(WorkerStartError, match="failed to start: .*exited \\(code 1\\)"):
        DeadlineWorker(script("raise SystemExit(1)")).request({}, 1.0)
    with pytest.raises(WorkerStartError, match="instead of its ready line"):
        DeadlineWorker(script("print('{\"hello\": 1}', flush=True)")).request({}, 1.0)


def test_pool_validation():
    with pytest.raises(ValueError, match="n >= 1"):
        WorkerPool("x.py", 0)


def test_a_crashing_checker_gives_an_error_verdict_not_a_skip(script):
    v = MathVerifier()
    v._pool = WorkerPool(script(ECHO.replace('if req.get("op") == "die"', 'if req.get("op") == "verify"')))
    try:
        verdict = v.score(r"\boxed{1}", "1")
        assert (verdict.reason, verdict.reward, verdict.skip) == ("error", 0.0, False)
        assert v.stats.counts()["error"] == 1
    finally:
        v.close()


def test_a_checker_that_cannot_start_raises_from_score(script):
    v = MathVerifier()
    v._pool = WorkerPool(script("raise SystemExit(1)"))
    with pytest.raises(WorkerStartError):
        v.score(r"\boxed{1}", "1")
