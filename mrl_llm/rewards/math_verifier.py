"""The MATH verifier: last-``\\boxed{}`` extraction + math-verify equivalence, with a deadline that works
from any thread.

``score(response, gold, finish_reason=...)``:

1. the gold's final answer is the last box of ``gold`` when it has one (a full solution), else
   ``gold`` itself (a bare answer); if there is none, or math-verify parses it to nothing, the
   verdict is ``gold_unparsable``: the sample is skipped, counted, and warned about once per gold;
2. a truncated response (``finish_reason == "length"``) fails (``truncated``);
3. the response's answer is its last box (:func:`~mrl_llm.rewards.extract.last_boxed`); none fails
   (``no_answer``): the answer format is part of the task;
4. both answers are parsed by ``math_verify.parse`` and compared by ``math_verify.verify(gold, pred)``
   in a worker process (:mod:`mrl_llm.rewards.sandbox`) with math-verify's signal timeouts off; past
   ``timeout_s`` the worker is killed and the verdict is ``timeout`` (a failure, counted). One rule
   is added: math-verify ignores subscripts, so numerals in different bases (``52_8`` vs ``52_9``)
   are told apart here.

:func:`math_reward` is the same as a plain function returning 1.0 / 0.0 (it raises
:class:`~mrl_llm.rewards.verdict.UnparsableGoldError` for an unusable gold, since a float cannot say
"skip"); :func:`math_verdict` returns the :class:`Verdict`. Both use one shared verifier per process.
"""

from __future__ import annotations

import threading
from pathlib import Path

from mrl_llm.rewards.extract import gold_answer, last_boxed, number_base
from mrl_llm.rewards.sandbox import WorkerFailed, WorkerPool, WorkerTimeout
from mrl_llm.rewards.verdict import (
    CORRECT,
    ERROR,
    GOLD_UNPARSABLE,
    NO_ANSWER,
    TIMEOUT,
    WRONG,
    FinishReason,
    UnparsableGoldError,
    Verdict,
    VerifierStats,
    truncated_verdict,
)

WORKER_SCRIPT = Path(__file__).with_name("math_worker.py")
_GOLD_CACHE_MAX = 50_000


class MathVerifier:
    """MATH-style verifier (see the module docstring). Thread-safe; ``n_workers`` checker processes
    run comparisons in parallel for concurrent callers. ``close()`` stops the worker processes (they
    also stop when the verifier is garbage-collected or the interpreter exits)."""

    name = "math"

    def __init__(self, *, timeout_s: float = 5.0, n_workers: int = 1, startup_timeout_s: float = 120.0):
        if not timeout_s > 0:
            raise ValueError(f"math verifier timeout_s must be > 0, got {timeout_s}")
        self.timeout_s = timeout_s
        self.stats = VerifierStats(self.name)
        self._pool = WorkerPool(WORKER_SCRIPT, n_workers, startup_timeout_s=startup_timeout_s)
        self._gold_ok: dict[str, str | None] = {}
        self._gold_lock = threading.Lock()

    @property
    def worker_starts(self) -> int:
        """Checker processes started (one per worker, plus one per restart after a timeout or crash)."""
        return self._pool.starts

    def _gold_problem(self, answer: str) -> str | None:
        with self._gold_lock:
            if answer in self._gold_ok:
                return self._gold_ok[answer]
        try:
            reply = self._pool.request({"op": "gold", "gold": answer}, self.timeout_s)
            problem = None if reply.get("gold_ok") else f"math-verify cannot parse the gold answer {answer!r}"
            if "error" in reply:
                problem = f"parsing the gold answer {answer!r} failed: {reply['error']}"
        except WorkerTimeout:
            problem = f"parsing the gold answer {answer!r} took longer than {self.timeout_s} s"
        except WorkerFailed as err:
            return f"checker failed while parsing the gold answer {answer!r}: {err}"  # not cached: may be transient
        with self._gold_lock:
            if len(self._gold_ok) >= _GOLD_CACHE_MAX:
                self._gold_ok.clear()
            self._gold_ok[answer] = problem
        return problem

    def check_gold(self, gold: str, *, choices: tuple[str, ...] = ()) -> str | None:
        """``None`` when ``gold`` has a final answer math-verify can parse, else the reason it has not."""
        answer = gold_answer(gold)
        if answer is None:
            return "no final answer (the gold is empty, or its last \\boxed{} is unclosed or empty)"
        return self._gold_problem(answer)

    def score(
        self, response: str, gold: str, *, finish_reason: FinishReason = "stop", choices: tuple[str, ...] = ()
    ) -> Verdict:
        """The verdict on ``response`` against ``gold`` (module docstring); never raises on bad input
        except an unknown ``finish_reason``."""
        return self.stats.record(self._score(response, gold, finish_reason), gold)

    def _score(self, response: str, gold: str, finish_reason: str) -> Verdict:
        truncated = truncated_verdict(finish_reason)
        problem = self.check_gold(gold)
        if problem is not None:
            return Verdict(0.0, GOLD_UNPARSABLE, detail=problem)
        if truncated is not None:
            return truncated
        pred = last_boxed(response)
        if pred is None:
            return Verdict(0.0, NO_ANSWER, detail="no complete \\boxed{} in the response")
        answer = gold_answer(gold)
        gold_base, pred_base = number_base(answer), number_base(pred)
        if gold_base is not None and pred_base is not None and gold_base != pred_base:
            return Verdict(0.0, WRONG, pred, detail=f"base {pred_base} numeral, the gold is in base {gold_base}")
        try:
            reply = self._pool.request({"op": "verify", "gold": answer, "pred": pred}, self.timeout_s)
        except WorkerTimeout:
            return Verdict(0.0, TIMEOUT, pred, detail=f"comparison ran past {self.timeout_s} s; worker restarted")
        except WorkerFailed as err:
            return Verdict(0.0, ERROR, pred, detail=str(err))
        if "error" in reply:
            return Verdict(0.0, ERROR, pred, detail=reply["error"])
        return Verdict(1.0, CORRECT, pred) if reply.get("equal") else Verdict(0.0, WRONG, pred)

    def close(self) -> None:
        self._pool.close()


_default: MathVerifier | None = None
_default_lock = threading.Lock()


def default_math_verifier() -> MathVerifier:
    """The process-wide verifier behind :func:`math_reward` (created on first use)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = MathVerifier()
        return _default


def math_verdict(response: str, gold: str, *, finish_reason: FinishReason = "stop") -> Verdict:
    """The :class:`Verdict` of the shared MATH verifier on ``response`` against ``gold``."""
    return default_math_verifier().score(response, gold, finish_reason=finish_reason)


def math_reward(response: str, gold: str, *, finish_reason: FinishReason = "stop") -> float:
    """1.0 if the last ``\\boxed{}`` of ``response`` equals the gold answer (bare, or the last box of a
    full solution) under math-verify, else 0.0; 0.0 for a truncated response. Raises
    :class:`UnparsableGoldError` when the gold has no parsable answer (use :func:`math_verdict` or a
    :class:`MathVerifier` to skip such samples instead)."""
    verdict = math_verdict(response, gold, finish_reason=finish_reason)
    if verdict.skip:
        raise UnparsableGoldError(f"gold answer unusable: {verdict.detail}")
    return verdict.reward
