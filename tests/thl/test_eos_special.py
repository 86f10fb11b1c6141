"""The EOS contract, special tokens, empty and special-only responses (mass goes where documented)."""

from __future__ import annotations

import numpy as np
import pytest

from mrl_llm.thl import align_trace, align_traces
from tests.thl import tiny_tokenizers as tiny


@pytest.fixture(scope="module")
def pair(real_tokenizers):
    return real_tokenizers["qwen1.5"], real_tokenizers["llama2"]


def test_eos_gets_a_one_to_one_counterpart(pair):
    qwen, llama = pair
    ids = qwen("The answer is 4.", add_special_tokens=False)["input_ids"] + [qwen.eos_token_id]
    lps = [-0.5] * (len(ids) - 1) + [-0.125]
    tr = align_trace(qwen, llama, ids, lps)
    assert tr.eos_appended and tr.target_ids[-1] == llama.eos_token_id == 2
    assert tr.target_logprobs[-1] == -0.125
    assert tr.residual.unaligned_mass == 0.0
    assert np.isclose(tr.target_logprobs[:-1].sum(), -0.5 * (len(ids) - 1))
    # and back: Llama's </s> becomes Qwen's <|endoftext|>
    back = align_trace(llama, qwen, tr.target_ids, tr.target_logprobs)
    assert back.target_ids[-1] == qwen.eos_token_id and back.target_logprobs[-1] == -0.125
    assert back.text == tr.text == "The answer is 4."


def test_append_eos_false_makes_eos_mass_unaligned(pair):
    qwen, llama = pair
    ids = qwen("x", add_special_tokens=False)["input_ids"] + [qwen.eos_token_id]
    tr = align_trace(qwen, llama, ids, [-1.0, -0.25], append_eos=False)
    assert not tr.eos_appended and llama.eos_token_id not in tr.target_ids.tolist()
    assert tr.residual.unaligned_mass == -0.25
    assert np.isclose(tr.target_logprobs.sum(), -1.0)


def test_other_special_tokens_are_unaligned_and_leave_no_text(pair):
    qwen, llama = pair
    im_start, im_end = qwen.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"])
    body = qwen("Hi there", add_special_tokens=False)["input_ids"]
    ids = [im_start] + body + [im_end, qwen.eos_token_id]
    lps = [-2.0] + [-0.5] * len(body) + [-0.75, -0.1]
    tr = align_trace(qwen, llama, ids, lps)
    assert tr.text == "Hi there"
    assert tr.residual.unaligned_mass == pytest.approx(-2.75)
    assert tr.target_logprobs[-1] == -0.1 and tr.target_ids[-1] == 2
    assert tr.target_logprobs.sum() + tr.residual.unaligned_mass == pytest.approx(sum(lps), abs=1e-12)
    # an EOS that is not last is an ordinary special token; BOS at the start too
    ids = [llama.bos_token_id] + llama("a b", add_special_tokens=False)["input_ids"] + [2, 2]
    tr = align_trace(llama, qwen, ids, [-1.0, -0.5, -0.5, -0.25, -0.125])
    assert tr.text == "a b" and tr.residual.unaligned_mass == -1.25 and tr.target_logprobs[-1] == -0.125


def test_empty_and_special_only_responses(pair):
    qwen, llama = pair
    empty, eos_only, specials_only = align_traces(
        qwen, llama, [[], [qwen.eos_token_id], [151644, 151645]], [[], [-0.3], [-1.0, -2.0]]
    )
    assert empty.text == "" and empty.target_ids.size == 0 and empty.residual.unaligned_mass == 0.0
    assert empty.residual.n_words == 0 and empty.word_spans.shape == (0, 2)
    assert eos_only.target_ids.tolist() == [2] and eos_only.target_logprobs.tolist() == [-0.3]
    for tr in (empty, eos_only, specials_only):
        assert tr.target_ids.dtype == np.int64 and tr.target_logprobs.dtype == np.float64
        assert not tr.target_logprobs.flags.writeable
        assert all(isinstance(getattr(tr.residual, f), float) for f in ("word_mass_error", "moved_mass", "unaligned_mass", "crossing_mass"))
    assert specials_only.target_ids.size == 0 and specials_only.residual.unaligned_mass == -3.0


def test_empty_batch(pair):
    qwen, llama = pair
    assert align_traces(qwen, llama, [], []) == [] and align_traces(qwen, llama, [], [], prompt_texts=[]) == []
    assert align_traces(qwen, qwen, [], []) == []


def test_whitespace_only_and_trailing_whitespace(real_tokenizers):
    gpt2, mistral = real_tokenizers["gpt2"], real_tokenizers["mistral"]
    for text in ["   ", "\n\n", "end.  \n", " \t x \n"]:
        ids = gpt2(text)["input_ids"]
        lps = -np.linspace(0.1, 1.0, len(ids))
        tr = align_trace(gpt2, mistral, ids, lps, append_eos=False)
        assert tr.text == text
        assert tr.residual.unaligned_mass == 0.0 and np.isclose(tr.target_logprobs.sum(), lps.sum())
        # trailing whitespace is its own last word, carried by the learner tokens that spell it
        if text.rstrip() != text and text.strip():
            assert tr.word_spans[-1][0] == len(text.rstrip())


def test_learner_without_eos_token_leaves_eos_mass_unaligned(real_tokenizers):
    no_eos = tiny.byte_level_bpe(eos=None)
    assert no_eos.eos_token_id is None
    gpt2 = real_tokenizers["gpt2"]
    ids = gpt2("so 5", add_special_tokens=False)["input_ids"] + [gpt2.eos_token_id]
    tr = align_trace(gpt2, no_eos, ids, [-1.0] * (len(ids) - 1) + [-0.5])
    assert not tr.eos_appended and tr.residual.unaligned_mass == -0.5


def test_byte_fallback_sequences_decode_as_one(real_tokenizers):
    """Llama spells 😀 as four byte tokens, none valid UTF-8 alone; GPT-2 splits it in two pieces."""
    llama, gpt2 = real_tokenizers["llama2"], real_tokenizers["gpt2"]
    ids = llama("a 😀 b", add_special_tokens=False)["input_ids"]
    assert sum(t.startswith("<0x") for t in llama.convert_ids_to_tokens(ids)) == 4
    lps = -np.arange(1, len(ids) + 1, dtype=float)
    tr = align_trace(llama, gpt2, ids, lps, append_eos=False)
    assert tr.text == "a 😀 b" and tr.residual.n_split_chars > 0
    assert tr.residual.unaligned_mass == 0.0 and tr.residual.word_mass_error < 1e-12
