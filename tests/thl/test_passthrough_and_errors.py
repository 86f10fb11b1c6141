"""Same vocabulary -> ids and log-probs pass through bit-exactly; bad input -> a clear error."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mrl_llm.thl import THLInputError, align_trace, align_traces, same_vocabulary
from tests.thl.conftest import REAL


@pytest.mark.parametrize("name", REAL)
def test_same_vocabulary_passes_through_exactly(real_tokenizers, shared_dir, name):
    from transformers import AutoTokenizer

    tok = real_tokenizers[name]
    again = AutoTokenizer.from_pretrained(shared_dir / "tokenizers" / name)  # a different object
    assert same_vocabulary(tok, again)
    # a non-canonical sampled sequence (ids no encoder would produce) with float32 log-probs
    rng = np.random.default_rng(0)
    ids = rng.integers(3, 30000, size=40).tolist() + [tok.eos_token_id]
    lps = torch.tensor(-rng.exponential(size=41), dtype=torch.float32)
    for target in (tok, again):
        tr = align_trace(tok, target, ids, lps, prompt_text="Q: hi\nA:")
        assert tr.passthrough and tr.eos_appended
        assert tr.target_ids.tolist() == ids
        assert np.array_equal(tr.target_logprobs, lps.double().numpy())
        assert tr.residual.unaligned_mass == 0.0 and tr.residual.word_mass_error == 0.0
        assert tr.prompt_ids.tolist() == target("Q: hi\nA:")["input_ids"]
    tr = align_trace(tok, again, ids, lps, append_eos=False)
    assert tr.target_ids.tolist() == ids[:-1] and tr.residual.unaligned_mass == float(lps[-1])
    (empty,) = align_traces(tok, again, [[]], [[]])
    assert empty.passthrough and empty.target_ids.size == 0 and empty.text == "" and empty.word_spans.shape == (0, 2)


def test_passthrough_keeps_the_eos_contract(tiny_tokenizers):
    """Same vocabulary, different EOS names (a base and a chat tokenizer): the final EOS becomes the
    learner's EOS id with the same log-prob; a learner without EOS leaves its mass unaligned."""
    from tests.thl import tiny_tokenizers as tiny

    base, chat, no_eos = tiny.metaspace("bpe", "llama"), tiny.metaspace("bpe", "llama"), tiny.metaspace("bpe", "llama")
    chat.eos_token = "<s>"  # any other token of the same vocabulary
    no_eos.eos_token = None
    assert same_vocabulary(base, chat) and chat.eos_token_id == 1 != base.eos_token_id
    ids = base("the answer", add_special_tokens=False)["input_ids"] + [base.eos_token_id]
    lps = [-1.0] * (len(ids) - 1) + [-0.5]
    tr = align_trace(base, chat, ids, lps)
    assert tr.passthrough and tr.target_ids.tolist() == ids[:-1] + [chat.eos_token_id] and tr.target_logprobs.tolist() == lps
    tr = align_trace(base, no_eos, ids, lps)
    assert tr.passthrough and tr.target_ids.tolist() == ids[:-1] and tr.residual.unaligned_mass == -0.5 and not tr.eos_appended


def test_different_vocabularies_are_not_the_same(real_tokenizers, tiny_tokenizers):
    assert not same_vocabulary(real_tokenizers["llama2"], real_tokenizers["mistral"])
    assert not same_vocabulary(real_tokenizers["qwen1.5"], real_tokenizers["gpt2"])
    assert not same_vocabulary(tiny_tokenizers["tiny_sp_bpe"], tiny_tokenizers["tiny_sp_nosplit"])


def test_same_vocabulary_is_directional(tiny_tokenizers):
    """A learner with extra tokens appended (Qwen2.5 -> Qwen3) still takes the peer's ids as they are."""
    from tests.thl import tiny_tokenizers as tiny

    base, extended = tiny.byte_level_bpe(), tiny.byte_level_bpe()
    extended.add_tokens(["<think>", "</think>"], special_tokens=True)
    assert same_vocabulary(base, extended) and not same_vocabulary(extended, base)
    ids = base("the answer", add_special_tokens=False)["input_ids"]
    assert align_trace(base, extended, ids, [-1.0] * len(ids)).passthrough
    assert not align_trace(extended, base, ids, [-1.0] * len(ids)).passthrough


@pytest.mark.parametrize(
    ("ids", "lps", "match"),
    [
        ([5, -32000], [-1.0, -1.0], r"token id -32000 at position 1 is outside the source vocabulary \[0, 32000\)"),
        ([-1], [-1.0], r"token id -1 at position 0 is outside"),
        ([5, 6], [-1.0], r"2 token ids but 1 log-probs"),
        ([5, 6], [-1.0, 0.5], r"log-prob 0.5 at position 1 is positive"),
        ([5, 6], [float("nan"), -1.0], r"at position 0 is NaN"),
        ([5], [float("-inf")], r"is infinite"),
        ([5, 6], [-1.0, -1e308], r"log-prob -1e\+308 at position 1 is below -10000"),
        ([5.5], [-1.0], r"token ids must be integers"),
        ([2**70], [-1.0], r"token ids must be integers"),
        ([[5]], [[-1.0]], r"flat 1-D"),
    ],
)
@pytest.mark.parametrize("container", [list, tuple, np.asarray])
def test_bad_input_names_the_problem(real_tokenizers, ids, lps, match, container):
    """The same error whether the batch comes as lists (the fast path), tuples (records) or arrays."""
    with pytest.raises(THLInputError, match=match):
        align_trace(real_tokenizers["llama2"], real_tokenizers["gpt2"], container(ids), container(lps))


def test_bad_batch_names_the_sequence(real_tokenizers):
    llama, gpt2 = real_tokenizers["llama2"], real_tokenizers["gpt2"]
    with pytest.raises(THLInputError, match=r"sequence 1: log-prob"):
        align_traces(llama, gpt2, [[5], [6]], [[-1.0], [1.0]])
    with pytest.raises(THLInputError, match=r"2 id sequences but 1 log-prob"):
        align_traces(llama, gpt2, [[5], [6]], [[-1.0]])
    with pytest.raises(THLInputError, match="outside"):  # pass-through validates too
        align_trace(llama, llama, [40000, -1], [-1.0, -1.0])


def test_a_batch_with_repeated_responses_equals_one_at_a_time(real_tokenizers):
    """Repeated responses are decoded and encoded once per batch; every sequence still gets its own
    log-probs and prompt, exactly as aligned alone (lists, tuples and arrays alike)."""
    qwen, llama = real_tokenizers["qwen1.5"], real_tokenizers["llama2"]
    texts = ["\\boxed{24}", "The answer is 7.", "\\boxed{24}", "</s> x", "The answer is 7.", "\\boxed{24}"]
    prompts = ["What is 19-5?\n", "Q\n", "What is 19-5?\n", "Q\n", "Other\n", "What is 19-5?\n"]
    rng = np.random.default_rng(3)
    ids = [qwen(t, add_special_tokens=False)["input_ids"] + [qwen.eos_token_id] for t in texts]
    lps = [(-rng.exponential(size=len(i))).tolist() for i in ids]
    lps[5] = lps[0]  # an exact duplicate too
    for batch_ids in (ids, [tuple(i) for i in ids], [np.array(i) for i in ids]):
        batch = align_traces(qwen, llama, batch_ids, lps, prompt_texts=prompts)
        for tr, i, lp, p in zip(batch, ids, lps, prompts, strict=True):
            one = align_trace(qwen, llama, i, lp, prompt_text=p)
            assert tr.text == one.text and tr.residual == one.residual and tr.eos_appended == one.eos_appended
            for a, b in ((tr.target_ids, one.target_ids), (tr.target_logprobs, one.target_logprobs),
                         (tr.prompt_ids, one.prompt_ids), (tr.word_spans, one.word_spans)):
                assert np.array_equal(a, b)
    assert not np.array_equal(batch[0].target_logprobs, batch[2].target_logprobs)
    assert batch[5] is batch[0]  # an exact repeat shares the (read-only) trace
    with pytest.raises(ValueError, match="read-only"):
        batch[0].target_logprobs[0] = 0.0
