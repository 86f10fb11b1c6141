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


@pytest.mark.parametrize("prompts", [None, ["Q: 1+1?\n", "Q: 2+2?\n"]])
def test_a_batch_of_only_empty_responses_gives_empty_traces(pair, prompts):
    """Every sequence empty across vocabularies (an IndexError once): empty traces, zero residual, and
    with prompts the learner's prompt ids alone."""
    qwen, llama = pair
    traces = align_traces(qwen, llama, [[], []], [[], []], prompt_texts=prompts)
    for k, tr in enumerate(traces):
        assert tr.text == "" and tr.target_ids.size == 0 and tr.target_logprobs.size == 0
        assert tr.residual.unaligned_mass == 0.0 and tr.residual.word_mass_error == 0.0 and tr.residual.n_words == 0
        want = [] if prompts is None else llama(prompts[k])["input_ids"]
        assert tr.prompt_ids.tolist() == want


def test_very_negative_finite_logprobs_are_refused_not_nan(pair):
    """-1e308 is finite but overflows when a word's mass is pooled: refused with the position named."""
    from mrl_llm.thl import THLInputError

    qwen, llama = pair
    ids = qwen("one two", add_special_tokens=False)["input_ids"]
    with pytest.raises(THLInputError, match="below -10000"):
        align_trace(qwen, llama, ids, [-1e308] * len(ids))
    ok = align_trace(qwen, llama, ids, [-1e4] * len(ids))  # the floor itself is accepted, and finite
    assert np.isfinite(ok.residual.word_mass_error) and np.isfinite(ok.target_logprobs).all()


@pytest.fixture(scope="module")
def chat_peer_dir(shared_dir, tmp_path_factory):
    """A copy of qwen1.5 whose generation_config.json adds ``<|im_end|>`` to the EOS ids (a chat model's)."""
    import json
    import shutil

    d = tmp_path_factory.mktemp("qwen-chat")
    for f in (shared_dir / "tokenizers" / "qwen1.5").iterdir():
        shutil.copy(f, d / f.name)
    gen = json.loads((d / "generation_config.json").read_text())
    gen["eos_token_id"] = [151643, 151645]
    (d / "generation_config.json").write_text(json.dumps(gen))
    return d


def test_generation_config_eos_ids_are_mapped(chat_peer_dir, real_tokenizers):
    """A peer whose engine stops on its generation config's ``<|im_end|>`` gives the learner an EOS."""
    from mrl_llm.models import load_tokenizer_dir
    from mrl_llm.rollout.base import generation_eos_ids

    qwen, llama = load_tokenizer_dir(chat_peer_dir), real_tokenizers["llama2"]
    im_end = qwen.convert_tokens_to_ids("<|im_end|>")
    assert qwen.eos_token_id != im_end and generation_eos_ids(chat_peer_dir) == (151643, im_end)
    ids = qwen("The answer is 4.", add_special_tokens=False)["input_ids"] + [im_end]
    lps = [-0.5] * (len(ids) - 1) + [-0.25]
    tr = align_trace(qwen, llama, ids, lps, source_eos_ids=generation_eos_ids(chat_peer_dir))
    assert tr.eos_appended and tr.target_ids[-1] == llama.eos_token_id and tr.target_logprobs[-1] == -0.25
    assert tr.residual.unaligned_mass == 0.0
    old = align_trace(qwen, llama, ids, lps)  # the tokenizer's EOS alone: <|im_end|> is a dropped special
    assert not old.eos_appended and old.residual.unaligned_mass == -0.25
    same = align_trace(qwen, qwen, ids, lps, source_eos_ids=[im_end])  # pass-through: the learner's own EOS id
    assert same.eos_appended and same.target_ids[-1] == qwen.eos_token_id


def test_generation_eos_ids_of_a_missing_or_bad_config(tmp_path):
    from mrl_llm.rollout.base import generation_eos_ids

    assert generation_eos_ids(tmp_path) == () and generation_eos_ids(None) == ()
    (tmp_path / "generation_config.json").write_text("{not json")
    with pytest.raises(ValueError, match="generation_config.json"):
        generation_eos_ids(tmp_path)
    (tmp_path / "generation_config.json").write_text('{"eos_token_id": "x"}')
    with pytest.raises(ValueError, match="eos_token_id"):
        generation_eos_ids(tmp_path)
