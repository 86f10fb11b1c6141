"""Checkpoint + resume is exact: a run stopped after step k (or killed mid-step) and resumed ends with the
same metrics, eval rows and weights as an uninterrupted run (same seed, CPU, one thread)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from safetensors.torch import load_file

from mrl_llm.config import config_from_mapping
from mrl_llm.contract import learner_tokenizer_dir
from mrl_llm.metrics import TIMING_KEYS
from mrl_llm.trainer import train
from mrl_llm.worker import LLMPolicyWorker
from tests.llm.helpers import ShortAnswerVerifier, install_verifier, problems, tiny


def small_config(steps: int = 3, regime: str = "prp_thl+sgt", **extra):
    return config_from_mapping({
        "seed": 11, "steps": steps, "prompts_per_step": 2, "regime": {"name": regime},
        "loss": {"kl_coef": 0.05}, "eval": {"k": 2, "max_prompts": 3}, "tensorboard": False, "progress": False,
        "policies": [
            {"name": "bytes", "model_config": tiny("llama"), "tokenizer_dir": "utf8-bytes", "group_size": 3,
             "sampling": {"max_new_tokens": 6}, "train": {"lr": 3e-3, "micro_batch": 2}},
            {"name": "bpe", "model_config": tiny("qwen2"), "tokenizer_dir": learner_tokenizer_dir(), "group_size": 3,
             "sampling": {"max_new_tokens": 10}, "train": {"lr": 3e-3, "micro_batch": 4, "grad_accum": 1}},
        ],
        **extra,
    })


def outputs(d):
    rows = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
    rows = [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in rows]
    evals = [json.loads(x) for x in (d / "eval.jsonl").read_text().splitlines()]
    weights = {n: load_file(d / "policies" / n / "model.safetensors") for n in ("bytes", "bpe")}
    return rows, evals, weights, (d / "exchange.jsonl").read_text()


def assert_same(a, b, *, drop_eval_steps=()):
    rows_a, ev_a, w_a, ex_a = a
    rows_b, ev_b, w_b, ex_b = b
    keep = lambda rows: [r for r in rows if not (r["kind"] == "eval" and r["step"] in drop_eval_steps)]  # noqa: E731
    assert keep(rows_a) == keep(rows_b)
    assert [r for r in ev_a if r["step"] not in drop_eval_steps] == [r for r in ev_b if r["step"] not in drop_eval_steps]
    assert ex_a == ex_b
    for n in w_a:
        assert w_a[n].keys() == w_b[n].keys()
        for k in w_a[n]:
            assert w_a[n][k].equal(w_b[n][k]), (n, k)


@pytest.fixture
def verifier(monkeypatch):
    v = ShortAnswerVerifier(max_chars=8)
    install_verifier(monkeypatch, v)
    return v


def test_stop_after_step_k_then_resume_equals_uninterrupted(tmp_path, verifier):
    probs, evp = problems(5), problems(3, prefix="e")
    ref = train(small_config(3), tmp_path / "a", problems=probs, eval_problems=evp)
    train(small_config(1), tmp_path / "b", problems=probs, eval_problems=evp)
    res = train(small_config(3), tmp_path / "b", resume=True, problems=probs, eval_problems=evp)
    # the stopped run evaluated at its end (step 1); the uninterrupted one did not
    assert_same(outputs(tmp_path / "a"), outputs(tmp_path / "b"), drop_eval_steps=(1,))
    assert [p["eval_accuracy"] for p in res["policies"]] == [p["eval_accuracy"] for p in ref["policies"]]
    assert [p["compute"] for p in res["policies"]] == [p["compute"] for p in ref["policies"]]


def test_crash_mid_step_then_resume_equals_uninterrupted(tmp_path, verifier, monkeypatch):
    probs, evp = problems(5), problems(3, prefix="e")
    train(small_config(3), tmp_path / "a", problems=probs, eval_problems=evp)
    real = LLMPolicyWorker.train_step

    def crashing(self, rows):
        if self.name == "bpe" and self.version == 2:
            raise RuntimeError("simulated crash in step 2, after every policy published its records")
        return real(self, rows)

    monkeypatch.setattr(LLMPolicyWorker, "train_step", crashing)
    with pytest.raises(RuntimeError, match="simulated crash"):
        train(small_config(3), tmp_path / "b", problems=probs, eval_problems=evp)
    monkeypatch.setattr(LLMPolicyWorker, "train_step", real)
    train(small_config(3), tmp_path / "b", resume=True, problems=probs, eval_problems=evp)
    assert_same(outputs(tmp_path / "a"), outputs(tmp_path / "b"))


def test_resume_refuses_a_different_config_and_a_busy_dir(tmp_path, verifier):
    probs = problems(4)
    train(small_config(1), tmp_path / "r", problems=probs, eval_problems=probs[:2])
    with pytest.raises(FileExistsError, match="--resume"):
        train(small_config(2), tmp_path / "r", problems=probs, eval_problems=probs[:2])
    with pytest.raises(ValueError, match="differs from the run's in \\['seed'\\]"):
        train(replace(small_config(2), seed=5), tmp_path / "r", resume=True, problems=probs, eval_problems=probs[:2])
    with pytest.raises(FileNotFoundError, match="nothing to resume"):
        train(small_config(2), tmp_path / "empty", resume=True, problems=probs)
    # a run killed before its first checkpoint (no guard could clean up): not "pass --resume", which cannot work
    killed = tmp_path / "killed"
    killed.mkdir()
    (killed / "config.json").write_text((tmp_path / "r" / "config.json").read_text())
    (killed / "metrics.jsonl").write_text("")
    with pytest.raises(FileExistsError, match="stopped before its first checkpoint .* remove .*killed or choose"):
        train(small_config(1), killed, problems=probs, eval_problems=probs[:2])
