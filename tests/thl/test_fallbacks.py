"""Where the byte view cannot explain a sequence (invalid UTF-8, an unknown decoder, a tokenizer
without a backend or offsets), THL computes spans by prefix decodes: same contract, still exact."""

from __future__ import annotations

import numpy as np
import pytest

from mrl_llm.thl import align_trace, align_traces
from mrl_llm.thl.vocab import vocab_info
from tests.thl import tiny_tokenizers as tiny
from tests.thl.oracle import check_word_conservation, encode_literal, prefix_decode_spans


@pytest.fixture(scope="module")
def chars():
    return tiny.CharTokenizer()


def test_invalid_utf8_from_byte_tokens(real_tokenizers):
    llama, qwen, gpt2 = real_tokenizers["llama2"], real_tokenizers["qwen1.5"], real_tokenizers["gpt2"]
    f0 = llama.convert_tokens_to_ids("<0xF0>")
    word = llama("ok", add_special_tokens=False)["input_ids"]
    ids = word + [f0, f0] + word  # two lone lead bytes: invalid UTF-8
    lps = -np.arange(1.0, len(ids) + 1)
    tr = align_trace(llama, qwen, ids, lps, append_eos=False)
    assert tr.text == llama.decode(ids) and "\ufffd" in tr.text
    assert tr.residual.unaligned_mass == 0.0 and np.isclose(tr.target_logprobs.sum(), lps.sum())
    # GPT-2 truncated in the middle of a character (a response cut at max length)
    ids = gpt2("so 😀", add_special_tokens=False)["input_ids"][:-1]
    tr = align_trace(gpt2, llama, ids, [-1.0] * len(ids), append_eos=False)
    assert tr.text == gpt2.decode(ids) and tr.text.endswith("\ufffd")
    assert np.isclose(tr.target_logprobs.sum(), -len(ids))


def test_python_tokenizer_without_offsets_both_ways(real_tokenizers, chars):
    assert vocab_info(chars).kind == "unknown" and not vocab_info(chars).has_backend
    qwen = real_tokenizers["qwen1.5"]
    text = "We get $x=5$.\n\nSo  é😀!"
    rng = np.random.default_rng(3)
    for src, tgt in ((qwen, chars), (chars, qwen)):
        ids = encode_literal(src, text)[0] if src is qwen else chars(text, add_special_tokens=False)["input_ids"]
        ids = list(ids) + [src.eos_token_id]
        lps = -rng.exponential(size=len(ids))
        tr = align_trace(src, tgt, ids, lps)
        assert tr.text == text and tr.target_ids[-1] == tgt.eos_token_id and tr.target_logprobs[-1] == lps[-1]
        assert tgt.decode(tr.target_ids[:-1].tolist()) == text
        assert tr.residual.unaligned_mass == 0.0 and np.isclose(tr.target_logprobs.sum(), lps.sum())
        tgt_spans = prefix_decode_spans(tgt, tr.target_ids[:-1].tolist(), text)
        src_spans = prefix_decode_spans(src, ids[:-1], text)
        assert check_word_conservation(text, src_spans, lps[:-1], tgt_spans, tr.target_logprobs[:-1]) > 0
    tr = align_trace(qwen, chars, encode_literal(qwen, "ab")[0], [-1.0, -1.0][: len(encode_literal(qwen, "ab")[0])], prompt_text="Q: ")
    assert tr.prompt_ids.tolist() + tr.target_ids.tolist() == chars("Q: ab")["input_ids"]


def test_batch_mixes_byte_view_and_fallback(real_tokenizers):
    """One batch, some sequences explained by the byte view and one not: each gets its own spans."""
    llama, gpt2 = real_tokenizers["llama2"], real_tokenizers["gpt2"]
    f0 = llama.convert_tokens_to_ids("<0xF0>")
    good = llama("fine text", add_special_tokens=False)["input_ids"]
    batch = [good, good + [f0] + good, [], good]
    lps = [-np.full(len(b), 0.5) for b in batch]
    out = align_traces(llama, gpt2, batch, lps, append_eos=False)
    for ids, lp, tr in zip(batch, lps, out, strict=True):
        assert tr.text == llama.decode(ids)
        assert np.isclose(tr.target_logprobs.sum(), lp.sum())
    assert out[0].target_logprobs.tolist() == out[3].target_logprobs.tolist()
