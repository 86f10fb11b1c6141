"""End to end: two tiny policies with the real Qwen1.5 and Llama-2 vocabularies, two steps, PRP (THL) + SGT.

The qwen policy samples 2 tokens (short texts: the test verifier accepts them), the llama policy 12
(long texts: rejected), so llama's SGT gate opens on every prompt and both policies train on each
other's THL-aligned traces. The run's decisions are cross-checked against the core re-run on the
exchange log, and the outputs (metrics, eval rows, summary, HF policy directories, report) are read back.
"""

from __future__ import annotations

import json

import pytest
import torch

from mrl_llm.config import config_from_mapping
from mrl_llm.distributed.actors import fetch_learner_rows
from mrl_llm.report import make_report
from mrl_llm.trainer import train
from shared_interfaces.exchange import DiskLogExchange
from tests.llm.helpers import ShortAnswerVerifier, install_verifier, problems, tiny

B, G, STEPS = 2, 3, 2


def run_config(shared_dir, regime: str = "prp_thl+sgt"):
    toks = shared_dir / "tokenizers"
    return config_from_mapping({
        "name": "integration", "seed": 3, "steps": STEPS, "prompts_per_step": B, "regime": {"name": regime},
        "loss": {"kl_coef": 0.01, "clip_high": 0.28},
        "eval": {"k": 2, "max_prompts": 3},
        "tensorboard": False, "progress": False,
        "policies": [
            {"name": "qwen", "model_config": tiny("qwen2"), "tokenizer_dir": str(toks / "qwen1.5"), "group_size": G,
             "sampling": {"max_new_tokens": 2}, "train": {"lr": 1e-3, "micro_batch": 3}},
            {"name": "llama", "model_config": tiny("llama"), "tokenizer_dir": str(toks / "llama2"), "group_size": G,
             "sampling": {"max_new_tokens": 12, "top_p": 0.95}, "train": {"lr": 1e-3, "micro_batch": 4, "grad_accum": 1}},
        ],
    })


def test_two_policies_two_steps_real_vocabularies(shared_dir, tmp_path, monkeypatch):
    install_verifier(monkeypatch, ShortAnswerVerifier(max_chars=30))
    cfg = run_config(shared_dir)
    out = tmp_path / "run"
    summary = train(cfg, out, problems=problems(6), eval_problems=problems(3, prefix="e"))

    # -- summary and metrics --------------------------------------------------------------------
    assert summary["regime"] == "prp_thl+sgt" and summary["steps"] == STEPS
    assert [p["name"] for p in summary["policies"]] == ["qwen", "llama"]
    for p in summary["policies"]:
        for key in ("eval_accuracy", "peer_exclusive_accuracy", "kl_to_ref", "entropy"):
            assert key in p
        assert p["compute"]["samples"] == STEPS * B * G and p["compute"]["flops"] > 0
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if r["kind"] == "train"]
    assert [(r["step"], r["policy"]) for r in train_rows] == [(s, n) for s in range(STEPS) for n in ("qwen", "llama")]
    by = {(r["step"], r["policy"]): r for r in train_rows}
    for r in train_rows:
        assert r["own_rows"] == B * G and r["peer_rows"] == B * G  # PRP: every peer sample joins
        assert r["nan_skipped"] == 0 and r["thl_residual"] >= 0
        assert min(r["generation_s"], r["scoring_s"], r["exchange_thl_s"], r["update_s"]) >= 0
        assert r["logprob_drift_max"] < 1e-3  # the engine's log-probs are the trainer's
    assert by[(1, "qwen")]["kl_to_ref"] > 0  # one update has moved it from the reference
    # the llama policy always fails and qwen succeeds: llama's gate opens on every prompt
    assert all(by[(s, "llama")]["sgt_activations"] == B and by[(s, "llama")]["sgt_rows"] == B for s in range(STEPS))
    assert all(by[(s, "qwen")]["sgt_activations"] == 0 for s in range(STEPS))
    assert by[(0, "llama")]["reward_mean"] == 0.0 and by[(0, "qwen")]["reward_mean"] > 0.5

    # -- the run's decisions are the core's decisions on the exchange log ---------------------------
    ex = DiskLogExchange(out / "exchange.jsonl")
    recs = list(ex.records())
    assert len(recs) == STEPS * B * G * 2
    for s in range(STEPS):
        pids = sorted({r.prompt_id for r in recs if r.step == s})
        for learner in ("qwen", "llama"):
            rows, _ = fetch_learner_rows(ex, learner, cfg.regime_spec, pids, s, present=["qwen", "llama"], seed=cfg.seed)
            assert int(rows.sgt_gate.sum()) == by[(s, learner)]["sgt_activations"]
            assert int(rows.sgt_mask.sum()) == by[(s, learner)]["sgt_rows"]
    ex.close()

    # -- evaluation -----------------------------------------------------------------------------
    ev = [json.loads(x) for x in (out / "eval.jsonl").read_text().splitlines()]
    assert sorted({r["step"] for r in ev}) == [0, STEPS]
    assert len(ev) == 2 * 2 * 3  # steps x policies x prompts
    final = {p["name"]: p for p in summary["policies"]}
    assert final["llama"]["peer_exclusive_n"] == 3 and final["qwen"]["peer_exclusive_n"] == 0
    assert final["qwen"]["peer_exclusive_accuracy"] is None
    rec = json.loads((out / "problems.json").read_text())  # the pool and the evaluated prompts
    assert rec["train"] == [f"p{i}" for i in range(6)] and [r["prompt_id"] for r in rec["eval"]] == ["e0", "e1", "e2"]
    from shared_interfaces.success_matrix import read_success_matrix

    assert read_success_matrix(out / "success_matrix.json").split == ("heldout",) * 3  # evaluated, never trained

    # -- trained policies are ordinary HF directories ---------------------------------------------
    from transformers import AutoModelForCausalLM, AutoTokenizer

    for name in ("qwen", "llama"):
        d = out / "policies" / name
        model = AutoModelForCausalLM.from_pretrained(d)
        tok = AutoTokenizer.from_pretrained(d)
        assert model.config.hidden_size == 64 and len(tok) > 30_000
        assert torch.isfinite(next(model.parameters())).all()

    rep = make_report(tmp_path)
    assert (tmp_path / "report.png").stat().st_size > 0 and "prp_thl+sgt" in rep["table"]


@pytest.mark.slow
@pytest.mark.parametrize("regime", ["grpo", "xgrpo", "prp_snapshot", "sgt"])
def test_every_regime_runs(shared_dir, tmp_path, monkeypatch, regime):
    install_verifier(monkeypatch, ShortAnswerVerifier(max_chars=30))
    summary = train(run_config(shared_dir, regime), tmp_path / regime, problems=problems(4),
                    eval_problems=problems(2, prefix="e"))
    rows = [json.loads(x) for x in (tmp_path / regime / "metrics.jsonl").read_text().splitlines()]
    peer_rows = sum(r.get("peer_rows", 0) for r in rows if r["kind"] == "train")
    assert (peer_rows > 0) == (regime == "prp_snapshot")
    sgt = sum(p["sgt_activations"] for p in summary["policies"])
    assert (sgt > 0) == (regime == "sgt")
