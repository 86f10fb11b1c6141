"""The per-tokenizer byte tables and the word rule, each against an independent reference."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mrl_llm.thl.offsets import byte_spans_to_chars, char_index_of_bytes
from mrl_llm.thl.vocab import vocab_info
from mrl_llm.thl.words import _WS_BOUND, codepoints, segment_starts, word_spans
from tests.thl.conftest import REAL
from tests.thl.oracle import words as regex_words

KINDS = {"qwen1.5": "byte_level", "gpt2": "byte_level", "llama2": "metaspace", "mistral": "metaspace"}


@pytest.mark.parametrize("name", REAL)
def test_every_token_spells_what_the_tokenizer_decodes(real_tokenizers, name):
    """The byte view of each single token, read as UTF-8, equals the tokenizer's decode of it (up to
    the one leading space a SentencePiece decode drops)."""
    tok = real_tokenizers[name]
    info = vocab_info(tok)
    assert info.kind == KINDS[name] and info.size == len(tok)
    ids = np.arange(info.size)
    decoded = tok.backend_tokenizer.decode_batch([[int(i)] for i in ids], skip_special_tokens=False)
    bad = []
    for i, d in zip(ids.tolist(), decoded, strict=True):
        mine = info.gather_bytes(np.array([i])).decode("utf-8", "replace")
        if mine != d and not (info.kind == "metaspace" and mine.startswith(" ") and mine[1:] == d):
            bad.append((i, mine, d))
    assert not bad, bad[:5]
    assert info.special[tok.all_special_ids].all() and info.special.sum() == len(set(tok.all_special_ids))


@pytest.mark.parametrize("name", ["tiny_bl", "tiny_sp_bpe", "tiny_sp_uni", "tiny_sp_nosplit"])
def test_trained_tokenizers_are_recognised(tiny_tokenizers, name):
    assert vocab_info(tiny_tokenizers[name]).kind == ("byte_level" if name == "tiny_bl" else "metaspace")


def test_whitespace_table_covers_python_isspace():
    assert all(not chr(c).isspace() for c in range(_WS_BOUND, sys.maxunicode + 1))


TEXT = st.text(alphabet=st.sampled_from(list("ab é😀日\t\n\r\x0b\x0c\x1c\x85\u00a0\u2028\u3000.,$\\")), max_size=30) | st.text(max_size=30)


@settings(max_examples=300, deadline=None)
@given(text=TEXT)
def test_word_rule_matches_the_regex_reference(text):
    assert word_spans(text) == regex_words(text)


@settings(max_examples=100, deadline=None)
@given(texts=st.lists(TEXT, max_size=6))
def test_batched_segmentation_equals_one_text_at_a_time(texts):
    starts = np.concatenate([[0], np.cumsum([len(t) for t in texts])])[:-1].astype(np.int64)
    got = segment_starts(codepoints("".join(texts)), starts).tolist()
    want = [int(s0) + a for s0, t in zip(starts, texts, strict=True) for a, _ in regex_words(t)]
    assert got == want


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=20), cuts=st.lists(st.integers(0, 80), max_size=6))
def test_byte_spans_cover_the_characters_their_bytes_belong_to(text, cuts):
    data = text.encode("utf-8")
    cuts = sorted({min(c, len(data)) for c in cuts} | {0, len(data)})
    b0, b1 = np.array(cuts[:-1], dtype=np.int64), np.array(cuts[1:], dtype=np.int64)
    s, e = byte_spans_to_chars(b0, b1, char_index_of_bytes(data), len(text))
    owner = [ci for ci, ch in enumerate(text) for _ in ch.encode("utf-8")]  # the character of each byte
    for x0, x1, c0, c1 in zip(b0, b1, s, e, strict=True):
        chars = {owner[k] for k in range(x0, x1)}
        assert (c0, c1) == ((min(chars), max(chars) + 1) if chars else (c0, c0))
