"""The HF engine records exactly the trainer's log-probs, stops on EOS, and is seeded."""

from __future__ import annotations

import pytest
import torch

from mrl_llm.logprobs import response_logprobs
from mrl_llm.rollout import HFEngine, SamplingConfig
from mrl_llm.rollout.hf_engine import top_p_filter


class _Tok:
    """The few tokenizer attributes the engine uses (the model is random: no real vocabulary needed)."""

    eos_token_id = 3
    pad_token_id = 0

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(str(i) for i in ids if not (skip_special_tokens and i in (0, 3)))


@pytest.fixture(scope="module")
def model():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128,
                      eos_token_id=3, bos_token_id=1, pad_token_id=0, tie_word_embeddings=False)
    m = Qwen2ForCausalLM(cfg).float()
    with torch.no_grad():  # make EOS likely enough to be sampled in a short run
        m.lm_head.weight[3] += 0.5
    return m.eval()


PROMPTS = [[1, 5, 6, 7], [1, 9], [1, 11, 12]]


def test_recorded_logprobs_equal_the_trainer_recomputation(model):
    eng = HFEngine(model, _Tok(), max_batch_size=4)
    sp = SamplingConfig(temperature=0.7, top_p=0.9, max_new_tokens=12, seed=3)  # a seed whose samples both stop and run out
    out = eng.generate(PROMPTS, 3, sp)
    assert [len(o) for o in out] == [3, 3, 3]
    prompts = [p for p in PROMPTS for _ in range(3)]
    samples = [s for o in out for s in o]
    again = response_logprobs(model, prompts, [s.token_ids for s in samples], pad_id=0, temperature=0.7)
    for s, lp in zip(samples, again, strict=True):
        assert len(s.token_ids) == len(s.logprobs) == len(lp) >= 1
        torch.testing.assert_close(torch.tensor(s.logprobs), torch.tensor(lp), atol=2e-5, rtol=0)
        if s.finish_reason == "stop":
            assert s.token_ids[-1] == 3 and 3 not in s.token_ids[:-1]
        else:
            assert len(s.token_ids) == 12 and 3 not in s.token_ids
    assert {s.finish_reason for s in samples} == {"stop", "length"}


def test_same_seed_same_samples_and_greedy_is_argmax(model):
    eng = HFEngine(model, _Tok(), max_batch_size=2)
    sp = SamplingConfig(max_new_tokens=6, seed=7)
    a = eng.generate(PROMPTS, 2, sp)
    b = eng.generate(PROMPTS, 2, sp)
    assert a == b
    g = eng.generate(PROMPTS[:1], 2, SamplingConfig(max_new_tokens=5, greedy=True))
    assert g[0][0].token_ids == g[0][1].token_ids
    with torch.no_grad():
        first = model(torch.tensor([PROMPTS[0]])).logits[0, -1].argmax().item()
    assert g[0][0].token_ids[0] == first


def test_top_p_keeps_the_nucleus_only():
    logp = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    kept = torch.isfinite(top_p_filter(logp, 0.7))
    assert kept.tolist() == [[True, True, False, False]]
    assert torch.isfinite(top_p_filter(logp, 0.01)).sum() == 1


def test_bad_input_is_refused(model):
    eng = HFEngine(model, _Tok())
    with pytest.raises(ValueError, match="no tokens"):
        eng.generate([[]], 1, SamplingConfig())
    with pytest.raises(ValueError, match="n "):
        eng.generate(PROMPTS, 0, SamplingConfig())


def test_inverse_cdf_sampler_follows_the_distribution_and_never_draws_zero_mass():
    from mrl_llm.rollout.hf_engine import sample_from

    probs = torch.tensor([0.0, 0.5, 0.3, 0.0, 0.2])
    logp = torch.log(probs).expand(20000, 5)
    g = torch.Generator().manual_seed(0)
    counts = torch.bincount(sample_from(logp, g), minlength=5).double() / 20000
    assert counts[0] == 0 and counts[3] == 0
    torch.testing.assert_close(counts, probs.double(), atol=0.015, rtol=0)


def test_prompts_outside_the_vocabulary_or_the_positions_are_refused(model):
    eng = HFEngine(model, _Tok())
    with pytest.raises(ValueError, match="prompt 1: token id 40 is outside the model's vocabulary \\[0, 40\\)"):
        eng.generate([[1, 2], [1, 40]], 2, SamplingConfig())
    with pytest.raises(ValueError, match="prompt 0: token id -1 is outside"):
        eng.generate([[1, -1]], 1, SamplingConfig())
    with pytest.raises(ValueError, match="prompt 0 has 128 tokens, leaving no room .* 128 positions"):
        eng.generate([[1] * 128], 1, SamplingConfig())


def test_responses_stop_at_the_models_positions_with_reason_length(model):
    """A prompt near ``max_position_embeddings`` (128) gets only the room left, as vLLM's ``max_model_len``."""
    eng = HFEngine(model, _Tok(), max_batch_size=8)
    long_p, short_p = [1] + [5] * 124, [1, 9]  # 3 positions left for the long prompt
    out = eng.generate([long_p, short_p], 4, SamplingConfig(max_new_tokens=12, seed=3))
    for s in out[0]:
        assert len(s.token_ids) == len(s.logprobs) <= 3
        assert s.finish_reason == ("stop" if s.token_ids[-1] == 3 else "length")
    assert any(s.finish_reason == "length" and len(s.token_ids) == 3 for s in out[0])
    assert any(len(s.token_ids) > 3 for s in out[1])  # the short prompt keeps its own budget
    again = response_logprobs(model, [long_p] * 4, [s.token_ids for s in out[0]], pad_id=0)
    for s, lp in zip(out[0], again, strict=True):
        torch.testing.assert_close(torch.tensor(s.logprobs), torch.tensor(lp), atol=2e-5, rtol=0)


def test_learned_positions_do_not_run_past_the_table():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=40, n_positions=8, n_embd=16, n_layer=1, n_head=2, eos_token_id=3,
                                      bos_token_id=1)).eval()
    prompts = [[1, 2, 4, 5, 6], [1]]  # 3 positions left, 7 left: the long one's done rows must not go past 8
    out = HFEngine(gpt2, _Tok()).generate(prompts, 2, SamplingConfig(max_new_tokens=8, seed=1))
    assert all(1 <= len(s.token_ids) == len(s.logprobs) <= 3 for s in out[0])
    assert any(len(s.token_ids) > 3 for s in out[1])
    flat = [s for o in out for s in o]
    again = response_logprobs(gpt2, [p for p in prompts for _ in range(2)], [s.token_ids for s in flat], pad_id=0)
    for s, lp in zip(flat, again, strict=True):
        torch.testing.assert_close(torch.tensor(s.logprobs), torch.tensor(lp), atol=2e-5, rtol=0)


def test_non_finite_logprobs_are_an_error_not_a_zero(model):
    import copy

    eng = HFEngine(model, _Tok())
    with pytest.raises(RuntimeError, match="not finite .* temperature 1e-45.*too small"):
        eng.generate([[1, 2]], 1, SamplingConfig(temperature=1e-45, max_new_tokens=3, seed=1))
    broken = copy.deepcopy(model)
    with torch.no_grad():
        broken.lm_head.weight[5, 0] = float("nan")
    with pytest.raises(RuntimeError, match="weights hold NaN/inf"):
        HFEngine(broken, _Tok()).generate([[1, 2]], 1, SamplingConfig(max_new_tokens=3, seed=1))
    tiny = eng.generate([[1, 2]], 2, SamplingConfig(temperature=1e-6, max_new_tokens=3, seed=1))  # near-greedy: fine
    assert all(len(s.token_ids) == len(s.logprobs) and all(lp <= 0 for lp in s.logprobs) for s in tiny[0])


def test_empty_batch_one_token_and_special_token_prompts(model):
    eng = HFEngine(model, _Tok())
    assert eng.generate([], 3, SamplingConfig(seed=1)) == []
    one = eng.generate([[3, 0, 3]], 2, SamplingConfig(max_new_tokens=1, seed=1))[0]
    assert all(len(s.token_ids) == len(s.logprobs) == 1 for s in one)
    assert all(s.finish_reason == ("stop" if s.token_ids == (3,) else "length") for s in one)
