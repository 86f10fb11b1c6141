"""The HF engine's shared prefill (:mod:`mrl_llm.rollout.hf_engine`, ``share_prompts``): each distinct prompt of an
admitted group is prefilled once and its cache rows repeated; the samples equal those of prefilling every copy
(``share_prompts=False``): the same tokens and finish reasons, log-probs to float32 rounding."""

from __future__ import annotations

import pytest
import torch

from mrl_llm.rollout import HFEngine, SamplingConfig
from tests.rollout.test_hf_engine import _Tok
from tests.rollout.test_hf_engine_batching import _decode_batches, _eos_at, _model

PROMPTS = [[1, 5, 6, 7, 8, 9, 10], [1, 2], [1, 11, 12, 13], [1, 2]]  # mixed lengths; the last equals the second


@pytest.fixture(scope="module")
def model():
    return _model()


def _sliding():
    """A model whose cache is not mergeable (sliding-window layers, as Gemma-3's)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(1)
    cfg = Qwen2Config(vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=1, max_position_embeddings=128, eos_token_id=3, pad_token_id=0,
                      use_sliding_window=True, sliding_window=6, layer_types=["sliding_attention", "full_attention"])
    return Qwen2ForCausalLM(cfg).eval()


def _same(a, b, atol=1e-5):
    assert [[(s.token_ids, s.finish_reason) for s in o] for o in a] == [[(s.token_ids, s.finish_reason) for s in o]
                                                                        for o in b]
    for oa, ob in zip(a, b, strict=True):
        for sa, sb in zip(oa, ob, strict=True):
            assert sa.logprobs == pytest.approx(sb.logprobs, abs=atol, rel=0)


SAMPLINGS = {
    "call-seeded": SamplingConfig(temperature=1.0, max_new_tokens=9, seed=7),
    "row-seeded top-p": SamplingConfig(temperature=0.7, top_p=0.9, max_new_tokens=9,
                                       row_seeds=tuple(range(100, 100 + 3 * len(PROMPTS)))),
    "greedy": SamplingConfig(max_new_tokens=9, greedy=True, seed=1),
}


@pytest.mark.parametrize("which", ["plain", "sliding"])
@pytest.mark.parametrize("sampling", list(SAMPLINGS))
@pytest.mark.parametrize("cap", [1, 2, 5, 64])  # 2 and 5 split a prompt's 3 copies over two admissions
def test_shared_prefill_gives_the_samples_of_prefilling_every_copy(model, which, sampling, cap):
    m = model if which == "plain" else _sliding()
    sp = SAMPLINGS[sampling]
    want = HFEngine(m, _Tok(), max_batch_size=cap, share_prompts=False).generate(PROMPTS, 3, sp)
    got = HFEngine(m, _Tok(), max_batch_size=cap).generate(PROMPTS, 3, sp)
    _same(got, want)


@pytest.mark.parametrize("n", [1, 4])
def test_one_sample_per_prompt_and_many(model, n):
    sp = SamplingConfig(temperature=1.0, max_new_tokens=6, seed=3)
    prompts = PROMPTS[:3]  # distinct: with n = 1 nothing is shared
    _same(HFEngine(model, _Tok()).generate(prompts, n, sp),
          HFEngine(model, _Tok(), share_prompts=False).generate(prompts, n, sp))


def test_each_distinct_prompt_is_prefilled_once_and_the_hook_sees_every_row(model):
    """Two prompts x 3 copies: one prefill of 2 rows (the reference: 6); the logits hook gets all 6 rows from
    the first token on, and the forced EOS schedule holds row by row."""
    schedule = [1, 2, 3, 9, 9, 9]
    seen = []

    def hook(rows, steps, logits):
        seen.append(rows.tolist())
        return _eos_at(schedule)(rows, steps, logits)

    sp = SamplingConfig(max_new_tokens=12, seed=2)
    out, decode, prefill = _decode_batches(model, HFEngine(model, _Tok(), logits_hook=hook), [[1, 5], [1, 6, 7]], 3, sp)
    assert prefill == [2]
    assert seen[0] == [0, 1, 2, 3, 4, 5]
    assert [len(s.token_ids) for o in out for s in o] == schedule
    ref, _, ref_prefill = _decode_batches(
        model, HFEngine(model, _Tok(), logits_hook=_eos_at(schedule), share_prompts=False), [[1, 5], [1, 6, 7]], 3, sp)
    assert ref_prefill == [6]
    _same(out, ref)


def test_equal_prompts_share_one_prefill_and_split_copies_prefill_again(model):
    """Equal prompts given twice are one distinct prompt; with room for 4 rows, a prompt's 3 copies after one
    of another prompt are split over two admissions, and each admission prefills the prompt once."""
    sp = SamplingConfig(max_new_tokens=2, seed=5)
    _, _, prefill = _decode_batches(model, HFEngine(model, _Tok()), [[1, 2], [1, 2]], 2, sp)
    assert prefill == [1]
    eng = HFEngine(model, _Tok(), max_batch_size=4, logits_hook=_eos_at([2] * 6))
    out, _, prefill = _decode_batches(model, eng, [[1, 5], [1, 6, 7]], 3, sp)
    assert prefill == [2, 1]  # rows 0-3: prompts 0 (3 copies) and 1 (1 copy); then rows 4-5: prompt 1 again
    _same(out, HFEngine(model, _Tok(), max_batch_size=4, logits_hook=_eos_at([2] * 6),
                        share_prompts=False).generate([[1, 5], [1, 6, 7]], 3, sp))


def test_empty_call(model):
    assert HFEngine(model, _Tok()).generate([], 8, SamplingConfig(seed=1)) == []
