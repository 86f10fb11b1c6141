"""THL on MATH-500 solutions for all 12 ordered pairs of the real tokenizers (batched)."""

from __future__ import annotations

import numpy as np
import pytest

from mrl_llm.thl import align_traces
from tests.thl.conftest import REAL_PAIRS, learner_normalisations
from tests.thl.oracle import check_word_conservation, encode_literal

N_DEFAULT = 60  # solutions per pair in the default run; the slow test does all 500


def _run(real_tokenizers, texts, src, tgt, seed=0):
    s, t = real_tokenizers[src], real_tokenizers[tgt]
    rng = np.random.default_rng(seed)
    encoded = [encode_literal(s, text) for text in texts]
    ids = [e[0] + [s.eos_token_id] for e in encoded]
    lps = [-rng.exponential(1.5, size=len(x)) for x in ids]
    traces = align_traces(s, t, ids, lps)
    checked = 0
    for text, (_, src_spans), lp, tr in zip(texts, encoded, lps, traces, strict=True):
        assert tr.text in learner_normalisations(text)
        body = tr.target_ids[:-1]
        assert tr.eos_appended and tr.target_ids[-1] == t.eos_token_id and tr.target_logprobs[-1] == lp[-1]
        assert t.decode(body.tolist(), skip_special_tokens=False) in learner_normalisations(tr.text)
        assert tr.residual.unaligned_mass == 0.0
        assert abs(tr.target_logprobs.sum() - lp.sum()) < 1e-6
        tgt_ids, tgt_spans = encode_literal(t, tr.text)
        assert tgt_ids == body.tolist()
        if tr.text == text:  # the source's own offsets are an independent oracle for its spans
            checked += check_word_conservation(text, src_spans, lp[:-1], tgt_spans, tr.target_logprobs[:-1])
        if tr.residual.n_boundary_conflicts == 0:
            assert tr.residual.word_mass_error < 1e-9
    return traces, checked


@pytest.mark.parametrize(("src", "tgt"), REAL_PAIRS, ids=[f"{a}->{b}" for a, b in REAL_PAIRS])
def test_math500_pairs(real_tokenizers, math500, src, tgt):
    texts = [row["answer"] for row in math500[:N_DEFAULT]]
    traces, checked = _run(real_tokenizers, texts, src, tgt)
    n_words = sum(tr.residual.n_words for tr in traces)
    assert checked > 0.9 * n_words  # per-word conservation verified on almost every word


@pytest.mark.slow
@pytest.mark.parametrize(("src", "tgt"), REAL_PAIRS, ids=[f"{a}->{b}" for a, b in REAL_PAIRS])
def test_math500_pairs_all(real_tokenizers, math500, src, tgt):
    _run(real_tokenizers, [row["answer"] for row in math500], src, tgt, seed=1)
