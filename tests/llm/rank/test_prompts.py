"""A policy's prompt cache (:mod:`mrl_llm.rank.prompts`) alone: no model."""

from __future__ import annotations

import pytest

from mrl_llm.byte_tokenizer import byte_tokenizer
from mrl_llm.data import Problem
from mrl_llm.rank.prompts import PromptCache
from mrl_llm.templates import PromptTemplate, TemplateConfig


def cache(text: str = "Q: {question}", **kw) -> PromptCache:
    tok = byte_tokenizer()
    return PromptCache("a", tok, PromptTemplate(TemplateConfig(text=text, instruction=""), tok), **kw)


def problem(pid: str, question: str) -> Problem:
    return Problem(prompt_id=pid, question=question, gold="1", verifier="math")


def test_render_encodes_the_template_text_and_caches_it_by_prompt_id():
    c = cache(max_prompt_len=64)
    assert len(c) == 0
    text, ids = c.render(problem("p0", "1+1?"))
    assert text == "Q: 1+1?" and ids == list(text.encode())  # the byte tokenizer's ids are the bytes
    assert c.render(problem("p0", "1+1?")) is c.render(problem("p0", "1+1?"))  # a hit: the cached pair
    assert c.render(problem("p0", "2+2?"))[0] == "Q: 2+2?"  # the text changed: encoded again
    assert (c.ids("p0"), c.text("p0")) == (list(b"Q: 2+2?"), "Q: 2+2?") and len(c) == 1


def test_an_unrendered_prompt_is_an_error_naming_the_policy_and_prompt():
    c = cache(max_prompt_len=64)
    with pytest.raises(KeyError, match="policy 'a' has not rendered prompt 'nope'"):
        c.ids("nope")
    with pytest.raises(KeyError, match="'nope'"):
        c.text("nope")


def test_empty_and_too_long_prompts_are_refused_naming_the_fix():
    c = cache(max_prompt_len=8)
    with pytest.raises(ValueError, match="policy 'a': prompt 'e' encodes to no tokens"):
        c.set_prompt("e", "")
    with pytest.raises(ValueError, match="prompt 'long' has 12 tokens > max_prompt_len 8"):
        c.set_prompt("long", "x" * 12)
    assert len(c) == 0  # nothing cached from a refused prompt


def test_the_oldest_prompt_is_dropped_beyond_max_entries():
    c = cache(max_prompt_len=64, max_entries=2)
    c.render(problem("p0", "x"))
    c.set_prompt("p1", "p1")
    c.render(problem("p0", "x"))  # a hit: p0 is the newest, p1 now the oldest
    c.set_prompt("p2", "p2")
    assert len(c) == 2 and c.text("p2") == "p2" and c.text("p0") == "Q: x"
    with pytest.raises(KeyError):
        c.ids("p1")
