"""With ``prompt_text``: the target ids are the response slice of the learner's encoding of
prompt + response (BOS asymmetry, straddling tokens, chat templates, literal special-token text)."""

from __future__ import annotations

import numpy as np
import pytest

from mrl_llm.thl import align_trace, align_traces
from tests.thl.conftest import REAL

PROMPTS = {
    "plain": "Question: What is 2+2?\nAnswer:",
    "newline": "Solve: x + 1 = 3.\n",
    "space": "[INST] What is 2+2? [/INST] ",
    "chat": "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
}
RESPONSES = [" The answer is $4$.\n\nDone.", "\n\nWe have 2+2=4.", "4", "", "Trailing  \n"]


@pytest.mark.parametrize("tgt", REAL)
@pytest.mark.parametrize("prompt", list(PROMPTS))
def test_prompt_ids_plus_target_ids_is_the_learner_encoding(real_tokenizers, tgt, prompt):
    gpt2, learner = real_tokenizers["gpt2"], real_tokenizers[tgt]
    if tgt == "gpt2":
        gpt2 = real_tokenizers["qwen1.5"]
    p = PROMPTS[prompt]
    ids = [gpt2(r, add_special_tokens=False)["input_ids"] + [gpt2.eos_token_id] for r in RESPONSES]
    lps = [-np.full(len(x), 0.5) for x in ids]
    traces = align_traces(gpt2, learner, ids, lps, prompt_texts=[p] * len(ids))
    for r, lp, tr in zip(RESPONSES, lps, traces, strict=True):
        assert tr.text == r
        full = learner(p + r, add_special_tokens=True)["input_ids"]
        assert tr.prompt_ids.tolist() + tr.target_ids[:-1].tolist() == full
        assert tr.target_ids[-1] == learner.eos_token_id
        assert abs(tr.target_logprobs.sum() - lp.sum()) < 1e-9 and tr.residual.unaligned_mass == 0.0
        if learner.bos_token_id is not None and tgt in ("llama2", "mistral"):
            assert tr.prompt_ids[0] == learner.bos_token_id  # Llama-style BOS goes with the prompt
        if tgt == "qwen1.5":
            assert learner.bos_token_id is None or tr.prompt_ids[0] != learner.bos_token_id


def test_straddling_token_belongs_to_the_response(real_tokenizers):
    """Llama merges the prompt's trailing space with the response's first word: '▁The'."""
    gpt2, llama = real_tokenizers["gpt2"], real_tokenizers["llama2"]
    ids = gpt2("The end", add_special_tokens=False)["input_ids"]
    tr = align_trace(gpt2, llama, ids, [-1.0, -2.0], prompt_text="[INST] q [/INST] ", append_eos=False)
    assert llama.convert_ids_to_tokens(tr.target_ids.tolist())[0] == "\u2581The"
    assert tr.residual.n_boundary_conflicts == 1
    assert np.isclose(tr.target_logprobs.sum(), -3.0)


@pytest.mark.parametrize("tgt", REAL)
def test_literal_special_token_text_stays_text(real_tokenizers, tgt):
    """A peer that spells '</s>' or '<|endoftext|>' in text never makes a learner special token."""
    src = real_tokenizers["mistral" if tgt != "mistral" else "gpt2"]
    learner = real_tokenizers[tgt]
    text = "a </s> b <|endoftext|> c <|im_end|>"
    backend = src.backend_tokenizer
    backend.encode_special_tokens = True
    try:
        ids = backend.encode(text, add_special_tokens=False).ids
    finally:
        backend.encode_special_tokens = False
    lps = -np.full(len(ids), 0.25)
    for prompt in (None, PROMPTS["plain"], PROMPTS["chat"]):
        tr = align_trace(src, learner, ids, lps, prompt_text=prompt)
        assert tr.text == text
        assert not set(tr.target_ids.tolist()) & set(learner.all_special_ids)
        full = tr.prompt_ids.tolist() + tr.target_ids.tolist()
        if full and full[0] == learner.bos_token_id and tgt in ("llama2", "mistral"):
            full = full[1:]  # the BOS the learner's template adds
        assert learner.decode(full, skip_special_tokens=False) == (prompt or "") + text
        if prompt == PROMPTS["chat"] and tgt == "qwen1.5":  # the template's own specials stay special
            assert learner.convert_tokens_to_ids("<|im_start|>") in tr.prompt_ids.tolist()
        assert np.isclose(tr.target_logprobs.sum(), lps.sum())


def test_prompt_count_must_match(real_tokenizers):
    gpt2, llama = real_tokenizers["gpt2"], real_tokenizers["llama2"]
    with pytest.raises(ValueError, match="prompt"):
        align_traces(gpt2, llama, [[1], [2]], [[-1.0], [-1.0]], prompt_texts=["only one"])
