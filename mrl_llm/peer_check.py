"""Peers' claims re-checked: a learner re-scores every peer record with its own verifier, against its own
copy of the problem, before the record enters planning.

The SGT gate and selection and the pooled advantages all read the rewards and ``verified`` flags the
records carry. A record is a peer's *claim*; a line added to ``exchange.jsonl`` under a real peer's
name (a wrong answer with ``reward: 1.0, verified: true``) would otherwise be replayed on resume and
become an SGT target. So :class:`PeerCheck` decides, once per record id, one of:

* kept — the reward is in the verifiers' range :data:`~mrl_llm.rewards.REWARD_RANGE` and the
  learner's verdict (the run's problem of that ``prompt_id``, the record's ``response_text`` and
  ``finish_reason``) gives the same reward and ``verified`` flag;
* ``peer_reward_refused`` — the reward lies outside the verifiers' range ``[0, 1]``: refused on
  receipt, not re-scored, with a warning naming the record and its producer;
* ``peer_verdict_rejected`` — quarantined: the re-scored reward or ``verified`` flag disagrees with the
  claim, or the claim cannot be checked (a prompt this learner has no problem for, a verifier other
  than the problem's, a gold the verifier cannot use), with a warning naming the record and producer.

A dropped record is left out of the learner's planning (as if it had never been published) and
counted in the learner's metrics row under its outcome's name. A comparison that timed out counts as
a failure (reward 0), the same rule as for the learner's own samples: an honest success whose
re-check times out is quarantined (conservative); an honest failure still agrees.

Where: in the learner, not in the exchange service. The learner holds the run's own copy of each
problem (the problems it was given to generate on) and the verifiers, and it is the party that must
not be fooled; the exchange service knows neither problems nor verifiers. Every record a learner plans
with comes out of the exchange through :func:`mrl_llm.distributed.actors.fetch_learner_rows`, which calls
this check on them: records that arrive from a live peer (on receipt) and records replayed from the
log on resume alike, in both runtimes (the single-process trainer and the Ray actors run the same
:class:`~mrl_llm.distributed.actors.PolicyActor`). The learner's own records of the step, scored in
its own process (or its worker group's, which all-gathers them), are not re-checked.

Cost: each record is re-scored once per learner (verdicts cached by record id; the exchange refuses a
second, different record under an id) and a step's records are scored as one batch (the MATH
verifier spreads it over its worker pool).
"""

from __future__ import annotations

import logging
import math
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from mrl_llm.rewards import REWARD_RANGE
from shared_interfaces.records import ExperienceRecord

log = logging.getLogger("mrl_llm.peer_check")

REJECTED = "peer_verdict_rejected"
REFUSED = "peer_reward_refused"
#: The counters a learner's metrics row carries (zero when nothing was dropped).
OUTCOMES = (REJECTED, REFUSED)

ScoreMany = Callable[[Sequence[tuple[Any, str, str]]], list[Any]]


class PeerCheck:
    """The check of one learner (module docstring). ``score_many`` scores ``(problem, text,
    finish_reason)`` triples in order (the worker's verifiers); :meth:`remember` records the run's
    problems as the learner is given them; calling the check on records returns ``{record_id:
    outcome}`` for the records to drop."""

    def __init__(self, learner: str, score_many: ScoreMany, *, max_problems: int = 20_000,
                 max_verdicts: int = 200_000) -> None:
        self.learner = learner
        self.score_many = score_many
        self.max_problems, self.max_verdicts = max_problems, max_verdicts
        self._problems: OrderedDict[str, Any] = OrderedDict()
        self._outcomes: OrderedDict[str, str | None] = OrderedDict()  # record id -> None (kept) or outcome
        self.counts = dict.fromkeys(OUTCOMES, 0)  # over the learner's life, for the warnings' rate limit
        self.rescored = 0

    def remember(self, problems: Iterable[Any]) -> None:
        """Keep ``problems`` (the run's own copies) as the reference for their prompt ids."""
        for p in problems:
            pid = str(p.prompt_id)
            self._problems[pid] = p
            self._problems.move_to_end(pid)
        while len(self._problems) > self.max_problems:
            self._problems.popitem(last=False)

    def __call__(self, records: Sequence[ExperienceRecord]) -> dict[str, str]:
        """``{record_id: outcome}`` of the ``records`` not to use (module docstring); each record id is
        decided once, new ones in one scoring batch."""
        todo: dict[str, ExperienceRecord] = {}
        known: dict[str, str | None] = {}  # read here: deciding new ids may evict these from the bounded cache
        for r in records:
            if r.record_id in self._outcomes:
                known[r.record_id] = self._outcomes[r.record_id]
            elif r.record_id not in todo:
                todo[r.record_id] = r
        if todo:
            known.update(self._decide(list(todo.values())))
        return {r.record_id: out for r in records if (out := known[r.record_id]) is not None}

    def _decide(self, records: list[ExperienceRecord]) -> dict[str, str | None]:
        """Decide ``records`` (new ids), cache the outcomes and return them (None: kept)."""
        decided: dict[str, str | None] = {}
        lo, hi = REWARD_RANGE
        batch: list[tuple[ExperienceRecord, Any]] = []
        for r in records:
            problem = self._problems.get(r.prompt_id)
            if not (math.isfinite(r.reward) and lo <= r.reward <= hi):
                self._set(decided, r, REFUSED, f"its reward {r.reward!r} is outside the verifiers' range [{lo:g}, {hi:g}]")
            elif problem is None:
                self._set(decided, r, REJECTED, f"prompt {r.prompt_id!r} is not one this learner was given")
            elif r.verifier != problem.verifier:
                self._set(decided, r, REJECTED, f"it names verifier {r.verifier!r}; the problem's is {problem.verifier!r}")
            else:
                batch.append((r, problem))
        if not batch:
            return decided
        verdicts = self.score_many([(p, r.response_text, r.finish_reason) for r, p in batch])
        self.rescored += len(batch)
        for (r, _), v in zip(batch, verdicts, strict=True):
            if v.skip:
                self._set(decided, r, REJECTED, f"the verifier cannot use the problem's gold ({v.detail or v.reason})")
            elif v.reward != r.reward or v.verified != r.verified:
                self._set(decided, r, REJECTED, f"it claims reward {r.reward:g} (verified {r.verified}); this learner's "
                                                f"verifier gives {v.reward:g} ({v.reason})")
            else:
                self._set(decided, r, None, "")
        return decided

    def _set(self, decided: dict[str, str | None], r: ExperienceRecord, outcome: str | None, why: str) -> None:
        decided[r.record_id] = self._outcomes[r.record_id] = outcome
        while len(self._outcomes) > self.max_verdicts:
            self._outcomes.popitem(last=False)
        if outcome is None:
            return
        self.counts[outcome] += 1
        n = self.counts[outcome]
        if n <= 10 or n % 100 == 0:
            what = "refused" if outcome == REFUSED else "quarantined"
            log.warning("policy %r %s peer record %r from policy %r (step %d): %s; not used (%s #%d)",
                        self.learner, what, r.record_id, r.policy_id, r.step, why, outcome, n)
