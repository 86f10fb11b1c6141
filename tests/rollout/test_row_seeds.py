"""Per-sequence seeds (``SamplingConfig.row_seeds``, ``sampling.seeding: sample``): a sample depends on its
own seed, not on the other prompts of the engine call (what lets a worker group split a step's prompts over
its ranks); the empty and malformed cases."""

from __future__ import annotations

import pytest
import torch

from mrl_llm.rollout import HFEngine, SamplingConfig
from mrl_llm.worker import LLMPolicyWorker, WorkerConfig


def _engine() -> HFEngine:
    from transformers import AutoModelForCausalLM, LlamaConfig

    from mrl_llm.byte_tokenizer import byte_tokenizer

    tok = byte_tokenizer()
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    return HFEngine(AutoModelForCausalLM.from_config(cfg), tok, max_batch_size=3)


def _ids(samples):
    return [[s.token_ids for s in row] for row in samples]


def test_a_sample_depends_on_its_seed_not_on_the_call():
    eng = _engine()
    prompts = [[10, 11, 12], [20, 21], [30, 31, 32, 33]]
    seeds = tuple(range(100, 106))  # 3 prompts x 2 samples, prompt-major
    sp = SamplingConfig(max_new_tokens=6, row_seeds=seeds)
    whole = eng.generate(prompts, 2, sp)
    alone = eng.generate(prompts[1:2], 2, SamplingConfig(max_new_tokens=6, row_seeds=seeds[2:4]))
    last = eng.generate(prompts[2:], 2, SamplingConfig(max_new_tokens=6, row_seeds=seeds[4:]))
    assert _ids(alone)[0] == _ids(whole)[1] and _ids(last)[0] == _ids(whole)[2]
    for a, b in zip(alone[0], whole[1], strict=True):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
    other = eng.generate(prompts, 2, SamplingConfig(max_new_tokens=6, row_seeds=tuple(range(200, 206))))
    assert _ids(other) != _ids(whole)  # the seeds matter


def test_a_sample_does_not_depend_on_the_batch_size_or_the_left_padding():
    """Chunks of 1, 2 and 8 sequences pad a short prompt by 0 to 8 tokens on the left: same samples."""
    eng = _engine()
    prompts = [[10], [20, 21, 22, 23, 24, 25, 26, 27, 28], [30, 31], [40] * 5]
    seeds = tuple(range(100, 108))
    runs = [HFEngine(eng.model, eng.tokenizer, max_batch_size=b).generate(prompts, 2, SamplingConfig(
        max_new_tokens=8, row_seeds=seeds)) for b in (1, 2, 8)]
    for other in runs[1:]:
        assert _ids(other) == _ids(runs[0])
        for g, h in zip(other, runs[0], strict=True):
            for a, b in zip(g, h, strict=True):
                assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)


def test_row_seeds_empty_and_malformed():
    eng = _engine()
    assert eng.generate([], 2, SamplingConfig(max_new_tokens=2, row_seeds=())) == []
    with pytest.raises(ValueError, match="row_seeds: 3 seeds for 4 sequences; give one per"):
        eng.generate([[1], [2]], 2, SamplingConfig(max_new_tokens=2, row_seeds=(1, 2, 3)))


def test_worker_records_with_per_sample_seeding_do_not_depend_on_the_split(monkeypatch):
    from mrl_llm.config import PolicyConfig, SamplingSection
    from shared_interfaces.config_io import ConfigError
    from tests.llm.helpers import ShortAnswerVerifier, install_verifier, problems, tiny

    install_verifier(monkeypatch, ShortAnswerVerifier())
    pol = PolicyConfig(name="A", model_config=tiny("llama"), tokenizer_dir="utf8-bytes", group_size=2, device="cpu",
                       sampling=SamplingSection(max_new_tokens=6, seeding="sample"))
    w = LLMPolicyWorker("A", WorkerConfig(policy=pol), seed=3)
    probs = problems(4)
    whole = {r.record_id: r for r in w.generate(probs, 0)}
    part = w.generate(probs[1::2], 0)
    assert len(part) == 4
    for r in part:  # the same record whichever other prompts were sampled with it
        assert (r.token_ids, r.response_text, r.reward) == (whole[r.record_id].token_ids, whole[r.record_id].response_text,
                                                            whole[r.record_id].reward)
        assert r.token_logprobs == pytest.approx(whole[r.record_id].token_logprobs, abs=1e-5)
    w.close()
    from shared_interfaces.config_io import from_mapping

    with pytest.raises(ConfigError, match="'engine' is not one of"):
        from_mapping(SamplingSection, {"seeding": "engine"}, where="sampling")
