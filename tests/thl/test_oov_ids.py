"""Peer ids beyond the peer tokenizer (a padded model's extra vocabulary rows: Qwen2.5 has 151,936 rows
for ~151,665 tokens, and its engine samples over all of them): no text, dropped like a stripped special
token, their mass unaligned and counted — never a THLInputError that ends the run."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from mrl_llm.thl import THLInputError, align_trace, align_traces
from mrl_llm.thl.report import format_report, pair_report
from tests.thl import tiny_tokenizers as tiny

#: (peer, learner) pairs: byte-level -> metaspace, metaspace -> byte-level, byte-level -> byte-level
PAIRS = [("gpt2", "llama2"), ("llama2", "qwen1.5"), ("qwen1.5", "gpt2")]
TEXT = "We have $x^2 = 4$.\n\nSo the answer is \\boxed{2}."


def _body(tok, text: str = TEXT) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def _without(ids: list[int], lps: list[float], size: int) -> tuple[list[int], list[float]]:
    keep = [k for k, i in enumerate(ids) if i < size]
    return [ids[k] for k in keep], [lps[k] for k in keep]


def _check_dropped(src, tgt, ids: list[int], lps: list[float], **kw) -> None:
    """The trace of ``ids`` is the trace of ``ids`` without its out-of-vocabulary tokens, except that
    their mass is unaligned and counted; the invariant holds to 1e-9."""
    n = len(src)
    tr = align_trace(src, tgt, ids, lps, **kw)
    clean_ids, clean_lps = _without(ids, lps, n)
    ref = align_trace(src, tgt, clean_ids, clean_lps, **kw)
    oov_mass = sum(lp for i, lp in zip(ids, lps, strict=True) if i >= n)
    assert tr.text == ref.text and tr.eos_appended == ref.eos_appended and tr.passthrough == ref.passthrough
    assert tr.target_ids.tolist() == ref.target_ids.tolist()
    assert np.array_equal(tr.target_logprobs, ref.target_logprobs)
    assert np.array_equal(tr.word_spans, ref.word_spans) and np.array_equal(tr.prompt_ids, ref.prompt_ids)
    assert tr.residual.n_oov_tokens == sum(i >= n for i in ids) > 0 and ref.residual.n_oov_tokens == 0
    assert tr.residual.unaligned_mass == pytest.approx(ref.residual.unaligned_mass + oov_mass, abs=1e-12)
    assert dataclasses.replace(tr.residual, unaligned_mass=0.0, n_oov_tokens=0) == dataclasses.replace(ref.residual, unaligned_mass=0.0)
    assert abs(tr.target_logprobs.sum() + tr.residual.unaligned_mass - sum(lps)) < 1e-9
    assert not set(tr.target_ids.tolist()) & set(range(n, n + 10))


@pytest.mark.parametrize(("src", "tgt"), PAIRS)
@pytest.mark.parametrize("where", ["middle", "start", "before_eos", "end_without_eos", "everywhere"])
def test_oov_ids_are_dropped_wherever_they_stand(real_tokenizers, src, tgt, where):
    s, t = real_tokenizers[src], real_tokenizers[tgt]
    n, body, eos = len(s), _body(s), [s.eos_token_id]
    k = len(body) // 2
    ids = {
        "middle": body[:k] + [n] + body[k:] + eos,
        "start": [n + 5] + body + eos,
        "before_eos": body + [n, n + 5] + eos,
        "end_without_eos": body + [n + 5],
        "everywhere": [n] + body[:k] + [n + 1, n + 2] + body[k:] + [n + 3] + eos,
    }[where]
    rng = np.random.default_rng(len(ids))
    lps = (-rng.exponential(size=len(ids))).tolist()
    _check_dropped(s, t, ids, lps)
    _check_dropped(s, t, ids, lps, append_eos=False)
    _check_dropped(s, t, ids, lps, prompt_text="Q: x^2 = 4?\nA:")
    tr = align_trace(s, t, ids, lps)
    assert tr.text == TEXT and tr.eos_appended == (where != "end_without_eos")


def test_oov_is_dropped_exactly_like_a_special_token(real_tokenizers):
    """Replacing the out-of-vocabulary id by a stripped special token (Llama's BOS) gives the same trace."""
    llama, qwen = real_tokenizers["llama2"], real_tokenizers["qwen1.5"]
    body = _body(llama)
    for pos in (0, 3, len(body)):
        lps = (-np.linspace(0.1, 2.0, len(body) + 2)).tolist()
        oov = align_trace(llama, qwen, body[:pos] + [32000 + 7] + body[pos:] + [2], lps)
        bos = align_trace(llama, qwen, body[:pos] + [llama.bos_token_id] + body[pos:] + [2], lps)
        assert oov.text == bos.text and oov.target_ids.tolist() == bos.target_ids.tolist()
        assert np.array_equal(oov.target_logprobs, bos.target_logprobs)
        assert dataclasses.replace(oov.residual, n_oov_tokens=0) == bos.residual
        assert oov.residual.n_oov_tokens == 1 and bos.residual.n_oov_tokens == 0


def test_the_run_killing_case_from_a_padded_tiny_model():
    """The learner tokenizer of the contract (320 tokens) behind a model with more rows: id 320 first."""
    from transformers import AutoTokenizer

    from mrl_llm.contract import learner_tokenizer_dir

    tok = AutoTokenizer.from_pretrained(learner_tokenizer_dir())
    other = tiny.metaspace("bpe", "llama")
    n = len(tok)
    assert n == 320
    body = _body(tok, "The answer is \\boxed{4}.")
    ids = [n] + body + [n + 5, tok.eos_token_id]
    lps = [-0.5] * len(ids)
    for target in (other, tok):  # across vocabularies and the pass-through
        tr = align_trace(tok, target, ids, lps)
        assert tr.text == "The answer is \\boxed{4}." and tr.eos_appended
        assert tr.residual.n_oov_tokens == 2 and tr.residual.unaligned_mass == pytest.approx(-1.0)
        assert abs(tr.target_logprobs.sum() + tr.residual.unaligned_mass - sum(lps)) < 1e-9
        assert tr.target_ids.max() < len(target)


@pytest.mark.parametrize("eos", [True, False])
def test_a_response_of_only_oov_ids_is_empty(real_tokenizers, eos):
    gpt2, llama = real_tokenizers["gpt2"], real_tokenizers["llama2"]
    n = len(gpt2)
    ids = [n, n + 1, n + 5] + ([gpt2.eos_token_id] if eos else [])
    lps = [-1.0, -2.0, -0.25] + ([-0.5] if eos else [])
    for target in (llama, gpt2):
        tr = align_trace(gpt2, target, ids, lps)
        assert tr.text == "" and tr.residual.n_words == 0 and tr.word_spans.shape == (0, 2)
        assert tr.target_ids.tolist() == ([target.eos_token_id] if eos else [])
        assert tr.target_logprobs.tolist() == ([-0.5] if eos else [])
        assert tr.residual.unaligned_mass == -3.25 and tr.residual.n_oov_tokens == 3
        assert tr.residual.word_mass_error == 0.0 and tr.residual.moved_mass == 0.0
        assert tr.target_ids.dtype == np.int64 and tr.target_logprobs.dtype == np.float64


@pytest.mark.parametrize("prompts", [None, ["Q1\n", "Q2\n", "Q3\n", "Q4\n"]])
def test_empty_responses_beside_oov_ones(real_tokenizers, prompts):
    qwen, llama = real_tokenizers["qwen1.5"], real_tokenizers["llama2"]
    n = len(qwen)
    for target in (llama, qwen):
        traces = align_traces(qwen, target, [[], [n + 200], [], [n, qwen.eos_token_id]],
                              [[], [-1.5], [], [-1.0, -0.25]], prompt_texts=prompts)
        for tr in traces:
            assert tr.text == "" and tr.residual.n_words == 0
        assert [tr.residual.n_oov_tokens for tr in traces] == [0, 1, 0, 1]
        assert [tr.residual.unaligned_mass for tr in traces] == [0.0, -1.5, 0.0, -1.0]
        assert [tr.target_ids.tolist() for tr in traces] == [[], [], [], [target.eos_token_id]]
        if prompts is not None:
            assert [tr.prompt_ids.tolist() for tr in traces] == [target(p)["input_ids"] for p in prompts]


def test_same_vocabulary_passthrough_drops_oov_ids(real_tokenizers, shared_dir):
    from transformers import AutoTokenizer

    qwen = real_tokenizers["qwen1.5"]
    again = AutoTokenizer.from_pretrained(shared_dir / "tokenizers" / "qwen1.5")
    n = len(qwen)
    rng = np.random.default_rng(0)
    body = rng.integers(3, 30000, size=30).tolist()  # a non-canonical sampled sequence
    ids = [n + 289] + body[:10] + [n] + body[10:] + [n + 1, qwen.eos_token_id]
    lps = torch.tensor(-rng.exponential(size=len(ids)), dtype=torch.float32)
    for target in (qwen, again):
        for kw in ({}, {"append_eos": False}, {"prompt_text": "Q: hi\nA:"}):
            _check_dropped(qwen, target, ids, lps.tolist(), **kw)
        tr = align_trace(qwen, target, ids, lps)
        assert tr.passthrough and tr.eos_appended and tr.residual.n_oov_tokens == 3
        assert tr.target_ids.tolist() == body + [qwen.eos_token_id]
        keep = np.array(ids) < n
        assert np.array_equal(tr.target_logprobs, lps.double().numpy()[keep])
        assert tr.residual.unaligned_mass == pytest.approx(float(lps.double()[~torch.from_numpy(keep)].sum()), abs=1e-12)
        assert tr.text == qwen.decode(body, skip_special_tokens=True, clean_up_tokenization_spaces=False)
    tr = align_trace(qwen, again, ids, lps, append_eos=False)  # the EOS dropped too: both unaligned
    assert tr.target_ids.tolist() == body and tr.residual.n_oov_tokens == 3
    assert abs(tr.target_logprobs.sum() + tr.residual.unaligned_mass - float(lps.double().sum())) < 1e-9


def test_passthrough_to_a_larger_learner_does_not_pass_peer_oov_ids():
    """Same vocabulary, learner with extra tokens (Qwen2.5 -> Qwen3): the peer's id ``len(peer)`` is a
    real learner token (``<think>``) but a padding row of the peer's model — it must not pass through."""
    base, extended = tiny.byte_level_bpe(), tiny.byte_level_bpe()
    extended.add_tokens(["<think>", "</think>"], special_tokens=True)
    n = len(base)
    assert extended.convert_ids_to_tokens(n) == "<think>"
    body = _body(base, "the answer is 4")
    ids = body[:2] + [n, n + 1] + body[2:] + [base.eos_token_id]
    lps = [-0.5] * (len(body) + 2) + [-0.1]
    tr = align_trace(base, extended, ids, lps)
    assert tr.passthrough and tr.target_ids.tolist() == body + [extended.eos_token_id]
    assert tr.residual.n_oov_tokens == 2 and tr.residual.unaligned_mass == -1.0
    assert tr.text == "the answer is 4"


@pytest.mark.parametrize(("src", "tgt"), [("gpt2", "llama2"), ("llama2", "llama2"), ("qwen1.5", "mistral")])
def test_a_batch_with_oov_ids_equals_one_at_a_time(real_tokenizers, src, tgt):
    s, t = real_tokenizers[src], real_tokenizers[tgt]
    n, eos = len(s), s.eos_token_id
    rng = np.random.default_rng(7)
    texts = ["So $x = 2$.", "The answer is 7.", "", "é 😀 done  ", "So $x = 2$."]
    ids = [_body(s, x) + [eos] for x in texts]
    for row in (0, 1, 3):  # OOV ids at random places; row 4 stays clean, a copy of row 0's text
        for _ in range(3):
            ids[row].insert(int(rng.integers(0, len(ids[row]))), int(n + rng.integers(0, 300)))
    ids.append([n + 2, n + 3])  # only OOV
    ids.append(list(ids[0]))  # an exact repeat
    lps = [(-rng.exponential(size=len(i))).tolist() for i in ids]
    lps[-1] = lps[0]
    prompts = [f"Q{k}\n" for k in range(len(ids))]
    for kw in ({}, {"prompt_texts": prompts}, {"append_eos": False}):
        batch = align_traces(s, t, [np.array(i) for i in ids], lps, **kw)
        for k, (tr, i, lp) in enumerate(zip(batch, ids, lps, strict=True)):
            one_kw = {"prompt_text": prompts[k]} if "prompt_texts" in kw else kw
            one = align_trace(s, t, i, lp, **one_kw)
            assert tr.text == one.text and tr.residual == one.residual and tr.eos_appended == one.eos_appended
            for a, b in ((tr.target_ids, one.target_ids), (tr.target_logprobs, one.target_logprobs),
                         (tr.prompt_ids, one.prompt_ids), (tr.word_spans, one.word_spans)):
                assert np.array_equal(a, b)
            assert tr.residual.n_oov_tokens == sum(x >= n for x in i)
            assert abs(tr.target_logprobs.sum() + tr.residual.unaligned_mass - sum(lp)) < 1e-9
        assert (batch[-1] is batch[0]) == ("prompt_texts" not in kw)  # an exact repeat (same prompt) is shared


@pytest.mark.parametrize("seed", range(8))
def test_invariant_and_count_on_random_oov_insertions(real_tokenizers, tiny_tokenizers, seed):
    rng = np.random.default_rng(seed)
    toks = {**real_tokenizers, **tiny_tokenizers, "chars": tiny.CharTokenizer()}
    names = sorted(toks)
    src, tgt = toks[names[seed % len(names)]], toks[names[(seed * 5 + 1) % len(names)]]
    n = len(src)
    ids = _body(src, "Let $a_n = 2^n$. Then the sum is 2046, so \\boxed{2046}.\n")
    k = int(rng.integers(1, 6))
    for _ in range(k):
        ids.insert(int(rng.integers(0, len(ids) + 1)), int(n + rng.integers(0, 10_000)))
    if src.eos_token_id is not None:
        ids.append(src.eos_token_id)
    lps = (-rng.exponential(3.0, size=len(ids))).tolist()
    for target in (tgt, src):
        tr = align_trace(src, target, ids, lps)
        assert tr.residual.n_oov_tokens == k
        assert abs(tr.target_logprobs.sum() + tr.residual.unaligned_mass - sum(lps)) < 1e-9
        assert tr.target_ids.size == 0 or tr.target_ids.max() < len(target)


def test_clean_traces_count_no_oov_tokens(real_tokenizers):
    gpt2, llama = real_tokenizers["gpt2"], real_tokenizers["llama2"]
    ids = _body(gpt2) + [gpt2.eos_token_id]
    for target in (llama, gpt2):
        assert align_trace(gpt2, target, ids, [-1.0] * len(ids)).residual.n_oov_tokens == 0


@pytest.mark.parametrize(
    ("ids", "lps", "match"),
    [
        ([32000, -1], [-1.0, -1.0], r"sequence 0: token id -1 at position 1 is outside the source vocabulary \[0, 32000\)"),
        ([32005, 5, -7], [-1.0, -1.0, -1.0], r"token id -7 at position 2 is outside"),
        ([32000, 5], [-1.0, float("nan")], r"log-prob nan at position 1 is NaN"),
        ([32000, 5], [-1.0, 0.5], r"log-prob 0.5 at position 1 is positive"),
        ([5, 32000], [-1.0, -1e5], r"log-prob -100000.0 at position 1 is below -10000"),
    ],
)
@pytest.mark.parametrize("container", [list, np.asarray])
@pytest.mark.parametrize("target", ["gpt2", "llama2"])
def test_negative_ids_and_bad_logprobs_still_raise(real_tokenizers, ids, lps, match, container, target):
    """An OOV id is accepted; a negative id, a non-integer id or a bad log-prob after it is still refused,
    across vocabularies and in the pass-through alike."""
    with pytest.raises(THLInputError, match=match):
        align_trace(real_tokenizers["llama2"], real_tokenizers[target], container(ids), container(lps))


def test_report_counts_oov_tokens(real_tokenizers):
    stats = pair_report(real_tokenizers["gpt2"], real_tokenizers["llama2"], ["So x = 2.", "Done."])
    assert stats["oov_tokens"] == 0  # the report's responses are encoded by the peer tokenizer
    assert "out-of-vocabulary peer tokens: 0" in format_report("a", "b", "c", stats)
