"""THL properties over random and adversarial text, for all 12 ordered pairs of the real tokenizers
and for locally trained tokenizers: text round-trip, mass accounting, per-word conservation, EOS."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mrl_llm.thl import align_trace
from tests.thl.conftest import REAL_PAIRS, learner_normalisations
from tests.thl.oracle import check_word_conservation, encode_literal, prefix_decode_spans, words

FRAGMENTS = [
    "the", "answer", "is", "We", " ", "  ", "   ", "\t", "\n", "\n\n", " \n ", "\r\n", ".", ",", ".\n\n", "!?",
    "é", "e\u0301", "u\u0308", "Å", "ﬁ", "😀", "👍🏽", "👨‍👩‍👧", "日本語", "中文", "한국어", "Ω", "—", "\u00a0", "\u3000",
    "\u200b", "$\\frac{1}{2}$", "\\boxed{42}", "x^2+y^2", "\\sqrt{3}", "0.5", "123456", "<s>", "</s>",
    "<|endoftext|>", "<|im_end|>", "[INST]", "▁", "Ġ", "<0x0A>",
]
TEXT = st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=4)), max_size=20).map("".join)

TINY_PAIRS = [
    ("tiny_bl", "tiny_sp_bpe"), ("tiny_sp_bpe", "tiny_bl"), ("tiny_sp_uni", "tiny_bl"), ("tiny_bl", "tiny_sp_uni"),
    ("tiny_sp_nosplit", "tiny_sp_uni"), ("tiny_sp_uni", "tiny_sp_nosplit"),
]
#: examples per pair; THL_EXAMPLES=500 for a thorough run
SETTINGS = settings(max_examples=int(os.environ.get("THL_EXAMPLES", "20")), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _check_pair(src_tok, tgt_tok, text: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    ids = encode_literal(src_tok, text)[0] + [src_tok.eos_token_id]
    lps = -rng.exponential(2.0, size=len(ids))
    tr = align_trace(src_tok, tgt_tok, ids, lps)

    # text: the peer's whole-sequence decode (for ordinary text, the original: see test_math500)
    assert tr.text == src_tok.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
    # the learner's tokens spell the text (no special token inside), then its EOS with the peer EOS log-prob
    assert tr.eos_appended and tr.target_ids[-1] == tgt_tok.eos_token_id and tr.target_logprobs[-1] == lps[-1]
    body = tr.target_ids[:-1].tolist()
    assert not set(body) & set(tgt_tok.all_special_ids)
    assert tgt_tok.decode(body, skip_special_tokens=False, clean_up_tokenization_spaces=False) in learner_normalisations(tr.text)
    # mass: everything placed, nothing lost, except the peer's special tokens (an <unk>) and a
    # response that decodes to no text
    special = np.isin(ids[:-1], src_tok.all_special_ids)
    expected = lps[:-1][special].sum() + (0.0 if tr.text else lps[:-1][~special].sum())
    assert abs(tr.residual.unaligned_mass - expected) < 1e-9 and (expected != 0 or tr.residual.unaligned_mass == 0.0)
    assert abs(tr.target_logprobs.sum() + tr.residual.unaligned_mass - lps.sum()) < 1e-6
    assert np.all(tr.target_logprobs <= 0) and np.all(np.isfinite(tr.target_logprobs))
    assert tr.word_spans.tolist() == [list(w) for w in words(tr.text)] and tr.residual.n_words == len(tr.word_spans)
    # per-word conservation, against independently derived spans and words
    kept = [i for i, sp in zip(ids[:-1], special, strict=True) if not sp]
    src_spans = prefix_decode_spans(src_tok, kept, tr.text)
    tgt_ids, tgt_spans = encode_literal(tgt_tok, tr.text)
    assert tgt_ids == body
    if tr.residual.n_boundary_conflicts == 0:
        assert tr.residual.word_mass_error < 1e-9
    if "\ufffd" not in tr.text:  # prefix decodes cannot tell a real U+FFFD from a partial character
        check_word_conservation(tr.text, src_spans, lps[:-1][~special], tgt_spans, tr.target_logprobs[:-1])


@pytest.mark.parametrize(("src", "tgt"), REAL_PAIRS, ids=[f"{a}->{b}" for a, b in REAL_PAIRS])
@SETTINGS
@given(text=TEXT, seed=st.integers(0, 2**32 - 1))
def test_real_pairs_on_adversarial_text(real_tokenizers, src, tgt, text, seed):
    _check_pair(real_tokenizers[src], real_tokenizers[tgt], text, seed)


@pytest.mark.parametrize(("src", "tgt"), TINY_PAIRS, ids=[f"{a}->{b}" for a, b in TINY_PAIRS])
@SETTINGS
@given(text=TEXT, seed=st.integers(0, 2**32 - 1))
def test_trained_pairs_on_adversarial_text(tiny_tokenizers, src, tgt, text, seed):
    _check_pair(tiny_tokenizers[src], tiny_tokenizers[tgt], text, seed)


@pytest.mark.parametrize(("src", "tgt"), [("tiny_sp_bpe", "gpt2"), ("qwen1.5", "tiny_sp_uni"), ("llama2", "tiny_bl")])
@SETTINGS
@given(text=TEXT, seed=st.integers(0, 2**32 - 1))
def test_trained_with_real(real_tokenizers, tiny_tokenizers, src, tgt, text, seed):
    toks = {**real_tokenizers, **tiny_tokenizers}
    _check_pair(toks[src], toks[tgt], text, seed)


@pytest.mark.parametrize(("src", "tgt"), REAL_PAIRS, ids=[f"{a}->{b}" for a, b in REAL_PAIRS])
@SETTINGS
@given(data=st.data())
def test_sampled_non_canonical_ids(real_tokenizers, src, tgt, data):
    """Any id sequence a policy could sample (invalid UTF-8, partial characters, odd spacing): the text
    is the peer's decode, the mass is accounted for, the learner spells the text."""
    s, t = real_tokenizers[src], real_tokenizers[tgt]
    specials = set(s.all_special_ids)
    ids = data.draw(st.lists(st.integers(0, len(s) - 1).filter(lambda i: i not in specials), max_size=30))
    lps = -np.asarray(data.draw(st.lists(st.floats(0, 20), min_size=len(ids), max_size=len(ids))), dtype=float)
    tr = align_trace(s, t, ids, lps, append_eos=False)
    assert tr.text == s.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
    assert abs(tr.target_logprobs.sum() + tr.residual.unaligned_mass - lps.sum()) < 1e-6
    if tr.text:
        assert tr.residual.unaligned_mass == 0.0
    else:
        assert tr.target_ids.size == 0
    assert t.decode(tr.target_ids.tolist(), clean_up_tokenization_spaces=False) in learner_normalisations(tr.text)
    if "\ufffd" not in tr.text:  # the prefix-decode oracle is exact for valid UTF-8
        src_spans = prefix_decode_spans(s, ids, tr.text)
        tgt_ids, tgt_spans = encode_literal(t, tr.text)
        check_word_conservation(tr.text, src_spans, lps, tgt_spans, tr.target_logprobs)


@pytest.mark.parametrize(("src", "tgt"), REAL_PAIRS, ids=[f"{a}->{b}" for a, b in REAL_PAIRS])
@SETTINGS
@given(prompt=TEXT, text=TEXT)
def test_prompt_slice_is_the_learner_encoding(real_tokenizers, src, tgt, prompt, text):
    """Random prompt + random response: prompt_ids + target_ids is the learner's own encoding of
    prompt + text, whatever merges across the boundary (NFC, Qwen's '.\n\n', SentencePiece '▁')."""
    s, t = real_tokenizers[src], real_tokenizers[tgt]
    specials = [tok for tok in t.all_special_tokens + s.all_special_tokens]
    if any(x in prompt + text for x in specials):
        return  # literal special-token text: covered by test_prompt.py
    ids = encode_literal(s, text)[0]
    lps = -np.full(len(ids), 0.5)
    tr = align_trace(s, t, ids, lps, prompt_text=prompt, append_eos=False)
    assert tr.prompt_ids.tolist() + tr.target_ids.tolist() == t(prompt + tr.text, add_special_tokens=True)["input_ids"]
    assert abs(tr.target_logprobs.sum() + tr.residual.unaligned_mass - lps.sum()) < 1e-9
    assert tr.residual.unaligned_mass == (0.0 if tr.text else lps.sum())
