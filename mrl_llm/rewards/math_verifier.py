"""The MATH verifier: last-``\\boxed{}`` extraction + math-verify equivalence, with a deadline that works
from any thread.

``score(response, gold, finish_reason=...)``:

1. the gold's final answer is the last box of ``gold`` when it has one (a full solution), else
   ``gold`` itself (a bare answer); if there is none, or math-verify parses it to nothing, the
   verdict is ``gold_unparsable``: the sample is skipped, counted, and warned about once per gold;
2. a truncated response (``finish_reason == "length"``) fails (``truncated``);
3. the response's answer is its last box (:func:`~mrl_llm.rewards.extract.last_boxed`); none fails
   (``no_answer``): the answer format is part of the task. ``answer_format="boxed_or_answer_line"``
   also accepts, in a response with no ``\\boxed`` at all, a closing "The answer is: X" / "The final
   answer is X." phrase (:func:`~mrl_llm.rewards.extract.answer_line`; base models end this way);
   the default ``boxed`` is verl's rule;
4. both answers are parsed by ``math_verify.parse`` and compared by ``math_verify.verify(gold, pred)``
   in a worker process (:mod:`mrl_llm.rewards.sandbox`) with math-verify's signal timeouts off; past
   ``timeout_s`` the worker is killed and the verdict is ``timeout`` (a failure, counted). One rule
   is added: math-verify ignores subscripts, so numerals in different bases (``52_8`` vs ``52_9``)
   are told apart here.

:meth:`MathVerifier.score_many` scores a batch (a step's responses) over the pool of ``n_workers``
checker processes (default 2), ``n_workers`` comparisons at a time: a runaway parse holds one worker
until its deadline while the others score the rest, so it costs about one timeout, not a stall. Its
verdicts are the ones :meth:`~MathVerifier.score` gives one by one, in the input's order.

:func:`math_reward` is the same as a plain function returning 1.0 / 0.0 (it raises
:class:`~mrl_llm.rewards.verdict.UnparsableGoldError` for an unusable gold, since a float cannot say
"skip"); :func:`math_verdict` returns the :class:`Verdict`. Both use one shared verifier per process.
"""

from __future__ import annotations

import importlib.util
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from mrl_llm.rewards.extract import ANSWER_FORMATS, AnswerFormat, gold_answer, number_base, response_answer
from mrl_llm.rewards.sandbox import WorkerFailed, WorkerPool, WorkerTimeout
from mrl_llm.rewards.verdict import (
    CORRECT,
    ERROR,
    GOLD_UNPARSABLE,
    NO_ANSWER,
    TIMEOUT,
    WRONG,
    FinishReason,
    ScoreRequest,
    UnparsableGoldError,
    Verdict,
    VerifierStats,
    truncated_verdict,
)

WORKER_SCRIPT = Path(__file__).with_name("math_worker.py")
_GOLD_CACHE_MAX = 50_000


class MathVerifier:
    """MATH-style verifier (see the module docstring). Thread-safe; ``n_workers`` checker processes
    (started on first use) run comparisons in parallel for :meth:`score_many` and for concurrent
    callers. ``answer_format``: ``boxed`` (default) or ``boxed_or_answer_line``. ``close()`` stops
    the worker processes (they also stop when the verifier is garbage-collected or the interpreter
    exits). A checker that cannot start at all raises
    :class:`~mrl_llm.rewards.sandbox.WorkerStartError` from ``score``."""

    name = "math"

    def __init__(self, *, timeout_s: float = 5.0, n_workers: int = 2, startup_timeout_s: float = 120.0,
                 answer_format: AnswerFormat = "boxed"):
        if not timeout_s > 0:
            raise ValueError(f"math verifier timeout_s must be > 0, got {timeout_s}")
        if answer_format not in ANSWER_FORMATS:
            raise ValueError(f"math verifier answer_format must be one of {list(ANSWER_FORMATS)}, "
                             f"got {answer_format!r}")
        if importlib.util.find_spec("math_verify") is None:
            raise ImportError(
                "the MATH verifier needs math-verify: pip install 'mutual-rl[llm]' (or math-verify)"
            )
        self.timeout_s = timeout_s
        self.answer_format = answer_format
        self.n_workers = n_workers
        self.stats = VerifierStats(self.name)
        self._pool = WorkerPool(WORKER_SCRIPT, n_workers, startup_timeout_s=startup_timeout_s)
        self._threads: ThreadPoolExecutor | None = None  # score_many's callers, one per checker
        self._threads_lock = threading.Lock()
        self._gold_ok: dict[str, str | None] = {}
        self._gold_lock = threading.Lock()

    @property
    def worker_starts(self) -> int:
        """Checker processes started (one per worker, plus one per restart after a timeout or crash)."""
        return self._pool.starts

    def _gold_problem(self, answer: str) -> str | None:
        """Why ``answer`` (an extracted gold) is unusable, or ``None``; cached. Raises
        :class:`WorkerFailed` when the checker crashed (not cached: it may be transient)."""
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
        try:
            return self._gold_problem(answer)
        except WorkerFailed as err:
            return f"the checker failed while parsing the gold answer {answer!r}: {err}"

    def score(
        self, response: str, gold: str, *, finish_reason: FinishReason = "stop", choices: tuple[str, ...] = ()
    ) -> Verdict:
        """The verdict on ``response`` against ``gold`` (module docstring); never raises on bad input
        except an unknown ``finish_reason``."""
        return self.stats.record(self._score(response, gold, finish_reason), gold)

    def score_many(self, requests: Sequence[ScoreRequest]) -> list[Verdict]:
        """``[score(*r) for r in requests]``, computed ``n_workers`` at a time over the checker pool
        (module docstring); the verdicts come back in the order of ``requests``."""
        if self.n_workers == 1 or len(requests) <= 1:
            return [self.score(r.response, r.gold, finish_reason=r.finish_reason) for r in requests]
        for r in requests:  # an unknown finish reason is the caller's error: raise before any work
            truncated_verdict(r.finish_reason)
        with self._threads_lock:
            if self._threads is None:
                self._threads = ThreadPoolExecutor(self.n_workers, thread_name_prefix="math-verify")
            threads = self._threads
        return list(threads.map(lambda r: self.score(r.response, r.gold, finish_reason=r.finish_reason), requests))

    def _score(self, response: str, gold: str, finish_reason: str) -> Verdict:
        truncated = truncated_verdict(finish_reason)
        answer = gold_answer(gold)
        try:
            problem = self.check_gold(gold) if answer is None else self._gold_problem(answer)
        except WorkerFailed as err:
            return Verdict(0.0, ERROR, detail=f"checker failed on the gold answer: {err}")
        if problem is not None:
            return Verdict(0.0, GOLD_UNPARSABLE, detail=problem)
        if truncated is not None:
            return truncated
        pred = response_answer(response, self.answer_format)
        if pred is None:
            where = "\\boxed{}" if self.answer_format == "boxed" else "\\boxed{} or 'The answer is' line"
            return Verdict(0.0, NO_ANSWER, detail=f"no complete {where} in the response")
        gold_base, pred_base = number_base(answer), number_base(pred)
        if gold_base is not None and pred_base is not None and gold_base != pred_base:
            return Verdict(
                0.0, WRONG, pred, detail=f"base {pred_base} numeral, the gold is in base {gold_base}"
            )
        try:
            reply = self._pool.request({"op": "verify", "gold": answer, "pred": pred}, self.timeout_s)
        except WorkerTimeout:
            return Verdict(
                0.0, TIMEOUT, pred, detail=f"comparison ran past {self.timeout_s} s; worker restarted"
            )
        except WorkerFailed as err:
            return Verdict(0.0, ERROR, pred, detail=str(err))
        if "error" in reply:
            return Verdict(0.0, ERROR, pred, detail=reply["error"])
        return Verdict(1.0, CORRECT, pred) if reply.get("equal") else Verdict(0.0, WRONG, pred)

    def close(self) -> None:
        with self._threads_lock:
            threads, self._threads = self._threads, None
        if threads is not None:
            threads.shutdown(wait=True)
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
