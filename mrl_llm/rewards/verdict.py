"""What a verifier returns (:class:`Verdict`), the counters it keeps (:class:`VerifierStats`) and the
interface every verifier implements (:class:`Verifier`).

A verdict is one of:

==================  ======  ========  ===================================================================
reason              reward  verified  meaning
==================  ======  ========  ===================================================================
``correct``         1.0     yes       the extracted answer equals the gold answer
``wrong``           0.0     yes       an answer was extracted and differs from the gold
``no_answer``       0.0     yes       no answer in the required format (e.g. no complete ``\\boxed{}``)
``truncated``       0.0     yes       ``finish_reason == "length"``: the response ran out of tokens
``timeout``         0.0     yes       the comparison ran past the verifier's deadline (counted)
``error``           0.0     yes       the checker failed on this response (crash; counted)
``gold_unparsable`` 0.0     no        the gold answer cannot be parsed: the sample is **skipped**
==================  ======  ========  ===================================================================

``verified`` means the reward came from the rule-based verifier (an
:class:`~shared_interfaces.records.ExperienceRecord`'s ``verified``). A skipped sample (``skip``) has no
verdict on the response at all: the caller must not train on it; it is counted, and logged as a
warning once per distinct gold answer.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from dataclasses import dataclass
from typing import Literal, NamedTuple, Protocol, runtime_checkable

FinishReason = Literal["stop", "length"]

#: Every verifier's rewards lie in this closed range (a :class:`Verdict` outside it cannot be made).
REWARD_RANGE = (0.0, 1.0)


class ScoreRequest(NamedTuple):
    """One response to score: what :meth:`Verifier.score` takes, as one value (for batches)."""

    response: str
    gold: str
    finish_reason: FinishReason = "stop"
    choices: tuple[str, ...] = ()

CORRECT = "correct"
WRONG = "wrong"
NO_ANSWER = "no_answer"
TRUNCATED = "truncated"
TIMEOUT = "timeout"
ERROR = "error"
GOLD_UNPARSABLE = "gold_unparsable"

REASONS = (CORRECT, WRONG, NO_ANSWER, TRUNCATED, TIMEOUT, ERROR, GOLD_UNPARSABLE)
#: Reasons for which the sample is skipped (no reward may be trained on).
SKIP_REASONS = frozenset({GOLD_UNPARSABLE})

log = logging.getLogger("mrl_llm.rewards")


@dataclass(frozen=True)
class Verdict:
    """A verifier's decision on one response: ``reward`` in [0, 1], ``reason`` (see the module table),
    the ``extracted`` answer text (``None`` when none was found) and a human-readable ``detail``."""

    reward: float
    reason: str
    extracted: str | None = None
    detail: str = ""

    def __post_init__(self) -> None:
        if self.reason not in REASONS:
            raise ValueError(f"unknown verdict reason {self.reason!r}; one of {REASONS}")
        if not REWARD_RANGE[0] <= self.reward <= REWARD_RANGE[1]:
            raise ValueError(f"verdict reward {self.reward} is outside {list(REWARD_RANGE)}")
        if self.reason != CORRECT and self.reward != 0.0:
            raise ValueError(f"a {self.reason!r} verdict must have reward 0, got {self.reward}")

    @property
    def skip(self) -> bool:
        """The sample must be skipped (the gold answer is unusable)."""
        return self.reason in SKIP_REASONS

    @property
    def verified(self) -> bool:
        """The reward was decided by the rule-based verifier (every verdict except a skip)."""
        return not self.skip

    @property
    def correct(self) -> bool:
        return self.reason == CORRECT


class VerifierStats:
    """Thread-safe counters of verdict reasons, plus the distinct unusable gold answers seen.

    ``record`` counts a verdict and logs a warning the first time each distinct gold answer is found
    unusable (a gold repeats for every sample of a group, so one warning per gold, all of them counted)
    and for the first ten timeouts / checker errors, then every hundredth.
    """

    def __init__(self, name: str):
        self.name = name
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()
        self._bad_golds: set[str] = set()

    def record(self, verdict: Verdict, gold: str) -> Verdict:
        with self._lock:
            self._counts[verdict.reason] += 1
            count = self._counts[verdict.reason]
            first_bad = verdict.skip and gold not in self._bad_golds
            if first_bad:
                self._bad_golds.add(gold)
        if verdict.reason in (TIMEOUT, ERROR) and (count <= 10 or count % 100 == 0):
            log.warning("verifier %r: %s #%d (%s)", self.name, verdict.reason, count, verdict.detail[:300])
        if first_bad:
            log.warning(
                "verifier %r: gold answer %r cannot be parsed (%s); its samples are skipped (counted in stats)",
                self.name,
                gold[-200:],
                verdict.detail or verdict.reason,
            )
        return verdict

    def counts(self) -> dict[str, int]:
        """Counts per reason (every reason present, zeros included), plus ``total`` and ``skipped``."""
        with self._lock:
            out = {r: self._counts.get(r, 0) for r in REASONS}
            out["total"] = sum(self._counts.values())
            out["skipped"] = sum(self._counts.get(r, 0) for r in SKIP_REASONS)
            out["distinct_unparsable_golds"] = len(self._bad_golds)
        return out

    def reset(self) -> None:
        with self._lock:
            self._counts.clear()
            self._bad_golds.clear()


@runtime_checkable
class Verifier(Protocol):
    """A rule-based verifier. ``score`` never raises on a bad *response* (it returns a failure verdict)
    and never raises on a bad *gold* (it returns a skip verdict); ``check_gold`` says up front whether a
    gold answer is usable (``None``) or why not."""

    name: str
    stats: VerifierStats

    def score(
        self, response: str, gold: str, *, finish_reason: FinishReason = "stop", choices: tuple[str, ...] = ()
    ) -> Verdict: ...

    def check_gold(self, gold: str, *, choices: tuple[str, ...] = ()) -> str | None: ...


def truncated_verdict(finish_reason: str) -> Verdict | None:
    """The failure verdict for a truncated response (``finish_reason == "length"``), else ``None``;
    an unknown finish reason is an error (the rollout engine must say ``stop`` or ``length``)."""
    if finish_reason == "stop":
        return None
    if finish_reason == "length":
        return Verdict(0.0, TRUNCATED, detail="response truncated at max_new_tokens")
    raise ValueError(f"finish_reason must be 'stop' or 'length', got {finish_reason!r}")


class UnparsableGoldError(ValueError):
    """Raised by the plain ``*_reward`` functions when the gold answer cannot be parsed (the verifier
    objects return a skip :class:`Verdict` instead)."""
