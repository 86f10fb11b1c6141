"""Peers' claims re-checked (:mod:`mrl_llm.peer_check`): a peer record's reward is re-scored by the
learner's verifier against the learner's copy of the problem before planning; a record whose claim
disagrees is quarantined and counted, a reward outside [0, 1] is refused; an honest record passes.

End to end in the single-process trainer: a forged record (a real peer's name, a wrong answer, reward
1.0, verified) written into the exchange while the run is on is fetched with its step's groups and does not
become an SGT target, and the metrics count it. (A resume cuts the log back to its checkpoint's digest-covered
records, so forged lines of later steps are dropped there: ``tests/distributed/test_resume_dir.py``.) (The Ray runtime: ``tests/llm/test_ray_peer_check.py``.)"""

from __future__ import annotations

import json
import logging

import pytest

from mrl_llm.data import Problem
from mrl_llm.distributed.actors import PolicyActor, fetch_learner_rows
from mrl_llm.peer_check import REFUSED, REJECTED, PeerCheck
from mrl_llm.rewards import score_problems
from mrl_llm.trainer import train
from mrl_llm.worker import LLMPolicyWorker
from shared_interfaces.exchange import InMemoryExchange
from shared_interfaces.records import ExperienceRecord, make_record_id
from shared_interfaces.regimes.config import parse_regime
from tests.llm.helpers import ShortAnswerVerifier, install_verifier, problems
from tests.llm.test_resume import small_config

PROBS = {p.prompt_id: p for p in problems(3)}


def rec(policy: str, pid: str, g: int, text: str, reward: float, *, verified: bool = True, verifier: str = "short",
        step: int = 0) -> ExperienceRecord:
    return ExperienceRecord(
        record_id=make_record_id(policy, step, pid, g), policy_id=policy, policy_version=step, step=step,
        prompt_id=pid, sample_index=g, prompt_text="q", response_text=text, token_ids=(1, 2),
        token_logprobs=(-0.5, -0.25), tokenizer_id="t", reward=reward, verified=verified, verifier=verifier,
        finish_reason="stop")


class Scorer:
    """``score_many`` over a :class:`ShortAnswerVerifier` (success: 1..8 characters), counting calls."""

    def __init__(self) -> None:
        self.verifier = ShortAnswerVerifier(max_chars=8)
        self.calls: list[int] = []

    def __call__(self, items):
        self.calls.append(len(items))
        return score_problems(self.verifier, items)


def make_check() -> tuple[PeerCheck, Scorer]:
    scorer = Scorer()
    check = PeerCheck("B", scorer)
    check.remember(PROBS.values())
    return check, scorer


def test_empty_input_scores_nothing():
    check, scorer = make_check()
    assert check([]) == {} and scorer.calls == []


def test_honest_records_pass_forged_ones_are_quarantined_once_per_record(caplog):
    check, scorer = make_check()
    honest = [rec("A", "p0", 0, "42", 1.0), rec("A", "p0", 1, "a long wrong answer", 0.0)]
    forged = [rec("A", "p1", 0, "a long wrong answer", 1.0),  # a wrong answer claiming success
              rec("A", "p1", 1, "42", 0.0),  # a success claimed as a failure (pooled statistics read it)
              rec("A", "p2", 0, "42", 1.0, verified=False)]  # the verified flag disagrees
    with caplog.at_level(logging.WARNING, logger="mrl_llm.peer_check"):
        out = check(honest + forged)
    assert out == {r.record_id: REJECTED for r in forged}
    assert scorer.calls == [5]  # one batch
    assert check(honest + forged) == out and scorer.calls == [5]  # decided once per record id
    assert check.counts == {REJECTED: 3, "peer_reward_refused": 0}
    msg = next(r.getMessage() for r in caplog.records if "A/0/p1/0" in r.getMessage())
    assert "from policy 'A'" in msg and "claims reward 1" in msg and "gives 0" in msg


def test_verdicts_evicted_from_the_bounded_cache_by_the_same_call_still_count():
    """A call whose new records push its already-decided ones out of the verdict cache (more records in
    the window than ``max_verdicts``) answered with a KeyError; each record's outcome is still reported."""
    scorer = Scorer()
    check = PeerCheck("B", scorer, max_verdicts=3)
    check.remember(PROBS.values())
    old = [rec("A", "p0", g, "42", 1.0) for g in range(2)] + [rec("A", "p2", 0, "a long wrong answer", 1.0)]
    assert check(old) == {old[2].record_id: REJECTED}
    new = [rec("A", "p1", g, "a long wrong answer", 1.0) for g in range(3)]
    assert check(old + new) == {r.record_id: REJECTED for r in [old[2], *new]}
    assert scorer.calls == [3, 3]


def test_rewards_outside_the_verifiers_range_are_refused_naming_the_producer(caplog):
    check, scorer = make_check()
    bad = [rec("A", "p0", 0, "42", 5.0), rec("C", "p0", 1, "42", -1.0)]
    with caplog.at_level(logging.WARNING, logger="mrl_llm.peer_check"):
        assert check(bad) == {r.record_id: REFUSED for r in bad}
    assert scorer.calls == []  # refused on receipt, never scored
    text = caplog.text
    assert "refused peer record 'A/0/p0/0' from policy 'A'" in text and "outside the verifiers' range [0, 1]" in text
    assert "from policy 'C'" in text


def test_claims_that_cannot_be_checked_are_quarantined():
    check, scorer = make_check()
    check.remember([Problem("bad", "q", "UNPARSABLE", "short")])
    recs = [rec("A", "elsewhere", 0, "42", 1.0),  # no such problem in this run
            rec("A", "p0", 0, "42", 1.0, verifier="math"),  # not the problem's verifier
            rec("A", "bad", 0, "42", 1.0)]  # the learner's verifier cannot use the gold
    assert check(recs) == {r.record_id: REJECTED for r in recs}
    assert scorer.calls == [1]


def rows_for(ex: InMemoryExchange, vet=None, counts=None):
    rows, _ = fetch_learner_rows(ex, "B", parse_regime("sgt"), ["p0"], 0, present=["A", "B"], vet=vet, counts=counts)
    return rows


def sgt_targets(rows) -> list:
    return [r for r, s in zip(rows.row_records(), rows.sgt_mask.tolist(), strict=True) if s]


def test_a_forged_success_is_no_sgt_target_once_checked():
    ex = InMemoryExchange()
    ex.publish([rec("B", "p0", g, "a long wrong answer", 0.0) for g in range(2)])  # the learner's group fails
    forged = rec("A", "p0", 0, "a long wrong answer", 1.0)
    ex.publish([forged, rec("A", "p0", 1, "another long wrong one", 0.0)])
    unchecked = rows_for(ex)
    assert unchecked.sgt_gate.tolist() == [True] and sgt_targets(unchecked) == [forged]  # without the check
    check, _ = make_check()
    counts: dict[str, int] = {}
    checked = rows_for(ex, vet=check, counts=counts)
    assert checked.sgt_gate.tolist() == [False] and sgt_targets(checked) == []
    assert forged.record_id not in {r.record_id for r in checked.row_records()}
    assert counts == {REJECTED: 1}
    # an honest peer success still opens the gate
    honest = rec("A", "p0", 2, "42", 1.0)
    ex.publish([honest])
    assert sgt_targets(rows_for(ex, vet=check)) == [honest]


# -- end to end: the single-process trainer, a forged line replayed on resume ----------------------------

def forged_lines(out, step: int) -> list[str]:
    """One forged record per prompt for ``step`` under the real peer 'bytes': one of its real responses
    (a failure under the run's verifier) claiming reward 1.0, verified."""
    real = [json.loads(x) for x in (out / "exchange.jsonl").read_text().splitlines()]
    real = [r for r in real if r["policy_id"] == "bytes"]
    lines = []
    for pid in sorted({p.prompt_id for p in problems(5)}):
        r = dict(real[0], step=step, policy_version=step, prompt_id=pid, sample_index=7, reward=1.0, verified=True,
                 record_id=make_record_id("bytes", step, pid, 7))
        lines.append(json.dumps(r))
    return lines


@pytest.mark.parametrize("honest", [False, True])
def test_a_forged_record_in_the_exchange_is_no_sgt_target_and_is_counted(tmp_path, monkeypatch, honest):
    # max_chars=0: no honest response succeeds, so any SGT target would be a forged one
    install_verifier(monkeypatch, ShortAnswerVerifier(max_chars=8 if honest else 0))
    probs, evp = problems(5), problems(2, prefix="e")
    out = tmp_path / "run"
    real_save = PolicyActor.save

    def save_then_forge(self, s):
        # someone writes records of step s + 1 under 'bytes' into the exchange while the run is on (after
        # the step-s checkpoint, before step s + 1 trains): they are fetched with the step's groups
        if not honest and self.spec.name == "bytes" and s == 0:
            self.exchange.publish([ExperienceRecord.from_json(x) for x in forged_lines(out, s + 1)])
        return real_save(self, s)

    seen: list[tuple[str, list]] = []
    real_train_step = LLMPolicyWorker.train_step

    def spying(self, rows):
        if self.version == 1:  # the update of step 1
            seen.append((self.name, rows))
        return real_train_step(self, rows)

    monkeypatch.setattr(PolicyActor, "save", save_then_forge)
    monkeypatch.setattr(LLMPolicyWorker, "train_step", spying)
    train(small_config(2, regime="sgt", eval={"enabled": False}), out, problems=probs, eval_problems=evp)

    rows = {(r["step"], r["policy"]): r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
            if r["kind"] == "train"}
    (bpe_rows,) = [r for name, r in seen if name == "bpe"]
    targets = sgt_targets(bpe_rows)
    peers = [r for r, pg, own in zip(bpe_rows.row_records(), bpe_rows.pg_mask.tolist(), bpe_rows.own_mask.tolist(),
                                     strict=True) if pg and not own]
    assert all(r.sample_index != 7 for r in targets + peers)
    assert all(r["peer_reward_refused"] == 0 for r in rows.values())
    if honest:
        assert all(r["peer_verdict_rejected"] == 0 for r in rows.values())
        assert targets and rows[(1, "bpe")]["sgt_activations"] > 0  # honest successes are used
    else:
        assert targets == [] and rows[(1, "bpe")]["sgt_activations"] == 0
        # the step's prompts each had one forged record under 'bytes', which 'bpe' fetched and refused
        assert rows[(1, "bpe")]["peer_verdict_rejected"] == len(bpe_rows.sgt_gate) > 0
        assert rows[(1, "bytes")]["peer_verdict_rejected"] == 0  # records under its own name are not fetched
        assert rows[(0, "bpe")]["peer_verdict_rejected"] == 0
