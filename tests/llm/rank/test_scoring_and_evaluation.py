"""The verifiers part (:mod:`mrl_llm.rank.scoring`) and the eval protocol (:mod:`mrl_llm.rank.evaluation`)
alone: test verifiers and a scripted sampler, no model."""

from __future__ import annotations

from mrl_llm.rank.evaluation import eval_rows
from mrl_llm.rank.scoring import Scorer
from mrl_llm.rewards import Verdict
from mrl_llm.rewards.verdict import CORRECT, WRONG
from mrl_llm.rollout import Sample, SamplingConfig
from tests.llm.helpers import ShortAnswerVerifier, install_verifier, problems


class Long(ShortAnswerVerifier):
    """Succeeds on what ``short`` fails: a response longer than ``max_chars``."""

    name = "long"

    def score(self, response, gold, *, finish_reason="stop", choices=()):
        return Verdict(1.0, CORRECT) if len(response.strip()) > self.max_chars else Verdict(0.0, WRONG)


def test_score_many_scores_in_order_with_each_problems_verifier(monkeypatch):
    install_verifier(monkeypatch, ShortAnswerVerifier(max_chars=3))
    install_verifier(monkeypatch, Long(max_chars=3))
    s = Scorer({})
    short, long_ = problems(2, "short"), problems(2, "long", prefix="q")
    items = [(short[0], "ab", "stop"), (long_[0], "ab", "stop"), (short[1], "abcdef", "stop"), (long_[1], "abcdef", "stop")]
    assert [v.reward for v in s.score_many(items)] == [1.0, 0.0, 0.0, 1.0]
    assert s.score(short[0], "ab", "stop").reward == 1.0 and s.verifiers.keys() == {"short", "long"}
    assert s.score_many([]) == []
    s.close()
    assert s.verifiers == {}


def test_a_verifier_is_built_once_with_its_options(monkeypatch):
    built = []
    from mrl_llm.rewards import VERIFIERS

    monkeypatch.setitem(VERIFIERS, "short", lambda **kw: built.append(kw) or ShortAnswerVerifier(**kw))
    s = Scorer({"short": {"max_chars": 5}})
    assert s.verifier("short") is s.verifier("short") and built == [{"max_chars": 5}]


def scripted(texts: dict[str, list[str]], calls: list):
    """A sampler: the greedy call answers ``texts[pid][0]``, a sampled call ``texts[pid][1:]``."""
    def sample(n, sp):
        calls.append((n, sp))
        return [[Sample((1,), (-0.1,), "stop", t) for t in (v[:1] if sp.greedy else v[1:1 + n])] for v in texts.values()]
    return sample


def test_eval_rows_count_the_greedy_answer_and_the_k_samples(monkeypatch):
    install_verifier(monkeypatch, ShortAnswerVerifier(max_chars=3))
    probs, calls = problems(2), []
    texts = {"p0": ["ok", "ok", "too long", "no"], "p1": ["too long", "a", "b", "c"]}
    rows = eval_rows(probs, sample=scripted(texts, calls), score_many=Scorer({}).score_many, k=3, temperature=0.7,
                     top_p=0.9, max_new_tokens=11, seed=42)
    assert [(r["prompt_id"], r["greedy_correct"], r["samples"], r["successes"]) for r in rows] == [
        ("p0", 1, 3, 2), ("p1", 0, 3, 3)]
    assert calls[0] == (1, SamplingConfig(max_new_tokens=11, greedy=True))
    assert calls[1] == (3, SamplingConfig(temperature=0.7, top_p=0.9, max_new_tokens=11, seed=42))
    assert rows[1]["greedy_response"] == "too long" and rows[0]["skipped"] is False


def test_eval_rows_without_samples_or_problems(monkeypatch):
    install_verifier(monkeypatch, ShortAnswerVerifier(max_chars=3))
    calls = []
    rows = eval_rows(problems(1), sample=scripted({"p0": ["ok"]}, calls), score_many=Scorer({}).score_many, k=0,
                     temperature=1.0, top_p=1.0, max_new_tokens=4, seed=0)
    assert len(calls) == 1 and rows[0]["samples"] == rows[0]["successes"] == 0 and rows[0]["greedy_correct"] == 1
    assert eval_rows([], sample=lambda n, sp: [], score_many=Scorer({}).score_many, k=2, temperature=1.0, top_p=1.0,
                     max_new_tokens=4, seed=0) == []
