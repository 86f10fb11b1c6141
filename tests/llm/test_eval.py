"""The evaluation protocol: greedy + pass@k rows, peer-exclusive prompts fixed at step 0, skipped golds."""

from __future__ import annotations

import pytest

from mrl_llm.config import PolicyConfig, SamplingSection
from mrl_llm.data import Problem
from mrl_llm.evaluate import peer_exclusive_sets, summarize
from mrl_llm.worker import LLMPolicyWorker, WorkerConfig
from tests.llm.helpers import ShortAnswerVerifier, install_verifier, problems, tiny


def row(step, policy, pid, greedy, succ, samples=4, skipped=False):
    return {"step": step, "policy": policy, "prompt_id": pid, "skipped": skipped, "greedy_correct": greedy,
            "samples": samples, "successes": succ}


def test_peer_exclusive_prompts_and_summary_by_hand():
    step0 = [
        row(0, "A", "x", 1, 0), row(0, "B", "x", 0, 0),  # only A solves x -> exclusive for B
        row(0, "A", "y", 0, 0), row(0, "B", "y", 0, 2),  # only B solves y (by sampling) -> exclusive for A
        row(0, "A", "z", 0, 0), row(0, "B", "z", 0, 0),  # nobody: exclusive for no one
        row(0, "A", "w", 1, 3), row(0, "B", "w", 1, 1),  # both
        row(0, "A", "s", 0, 0, skipped=True), row(0, "B", "s", 1, 1, skipped=True),  # unusable gold
    ]
    excl = peer_exclusive_sets(step0)
    assert excl == {"A": {"y"}, "B": {"x"}}
    later = [row(5, "A", "x", 1, 4), row(5, "A", "y", 1, 1), row(5, "A", "z", 0, 0), row(5, "A", "w", 0, 2),
             row(5, "B", "x", 0, 1), row(5, "B", "y", 1, 4), row(5, "B", "z", 0, 0), row(5, "B", "w", 1, 4)]
    s = summarize(later, excl)
    assert s["A"] == {"n": 4, "eval_accuracy": 0.5, "pass_at_k": 0.75, "peer_exclusive_n": 1,
                      "peer_exclusive_accuracy": 1.0}
    assert s["B"]["peer_exclusive_accuracy"] == 0.0 and s["B"]["pass_at_k"] == 0.75
    assert summarize(later)["A"]["peer_exclusive_accuracy"] is None


def test_worker_evaluate_is_deterministic_and_counts_samples(monkeypatch):
    install_verifier(monkeypatch, ShortAnswerVerifier(max_chars=4))
    pol = PolicyConfig(name="A", model_config=tiny("llama"), tokenizer_dir="utf8-bytes",
                       sampling=SamplingSection(max_new_tokens=5))
    w = LLMPolicyWorker("A", WorkerConfig(policy=pol, track_ref_kl=False), seed=0)
    probs = problems(3) + [Problem(prompt_id="bad", question="q?", gold="UNPARSABLE", verifier="short")]
    a = w.evaluate(probs, step=0, k=3, temperature=1.0, top_p=1.0)
    b = w.evaluate(probs, step=0, k=3, temperature=1.0, top_p=1.0)
    assert a == b and [r["prompt_id"] for r in a] == ["p0", "p1", "p2", "bad"]
    assert all(r["samples"] == 3 and 0 <= r["successes"] <= 3 for r in a)
    assert a[-1]["skipped"] and a[-1]["greedy_correct"] == 0 and a[-1]["successes"] == 0
    c = w.evaluate(probs, step=1, k=3, temperature=1.0, top_p=1.0)  # another step: other samples, same greedy
    assert [r["greedy_response"] for r in c] == [r["greedy_response"] for r in a]
    assert w.evaluate(probs[:1], step=0, k=0, temperature=1.0, top_p=1.0)[0]["samples"] == 0


@pytest.mark.parametrize("k", [0, 2])
def test_summary_handles_greedy_only(k):
    rows = [row(0, "A", "x", 1, 0, samples=k)]
    s = summarize(rows)["A"]
    assert s["eval_accuracy"] == 1.0 and (s["pass_at_k"] is None) == (k == 0)
