"""Prompt templates: plain text with the answer-format instruction, multiple-choice options, chat templates."""

from __future__ import annotations

import re

import pytest

from mrl_llm.data import Problem
from mrl_llm.templates import (
    BOXED_INSTRUCTION,
    MCQ_INSTRUCTION,
    TINY_TEXT,
    PromptTemplate,
    TemplateConfig,
    TemplateError,
    render_prompt,
)

MCQ = Problem("q", "Capital of France?", "B", "mcq", choices=("London", "Paris"))


def test_default_plain_template_has_the_boxed_instruction():
    text = render_prompt(TemplateConfig(), Problem("p", "What is 2+3?", "5", "arithmetic"))
    assert text == "What is 2+3?\nPut the final answer in \\boxed{}.\n"
    assert BOXED_INSTRUCTION in text


def test_tiny_template_and_bare_question():
    assert render_prompt(TemplateConfig(text=TINY_TEXT), "What is 2+3?") == "What is 2+3?\n"


def test_literal_braces_and_system_in_plain_mode():
    cfg = TemplateConfig(text="Q: {question}\nWrite \\boxed{answer}.\nA:", system="Be brief.")
    assert render_prompt(cfg, "1+1?") == "Be brief.\n\nQ: 1+1?\nWrite \\boxed{answer}.\nA:"


def test_question_text_is_not_re_substituted():
    assert (
        render_prompt(TemplateConfig(text="{question}|{instruction}", instruction="I"), "say {instruction}")
        == "say {instruction}|I"
    )


def test_multiple_choice_options():
    auto = render_prompt(TemplateConfig(instruction=MCQ_INSTRUCTION), MCQ)
    assert auto == "Capital of France?\nA. London\nB. Paris\n" + MCQ_INSTRUCTION + "\n"
    explicit = render_prompt(
        TemplateConfig(text="{question}\nOptions:\n{choices}\n{instruction}", instruction="Pick."), MCQ
    )
    assert explicit == "Capital of France?\nOptions:\nA. London\nB. Paris\nPick."


def test_config_errors():
    with pytest.raises(TemplateError, match="no \\{question\\}"):
        TemplateConfig(text="Answer:")
    with pytest.raises(TemplateError, match="chat"):
        TemplateConfig(chat="sometimes")


@pytest.mark.parametrize("text, unknown", [
    ("{question}\n{instrution}\n", "{instrution}"),  # misspelt: reached the model as "{instrution}"
    ("{question}\n{Instruction}", "{Instruction}"),
    ("Q: {question} (id {id})\nA: {answer}", "{id}, {answer}"),
])
def test_a_placeholder_no_problem_fills_is_refused(text, unknown):
    with pytest.raises(TemplateError, match=rf"has {re.escape(unknown)}, which no problem fills .* correct the name"):
        TemplateConfig(text=text)


@pytest.mark.parametrize("text", [
    "Q: {question}\nWrite \\boxed{answer}.", "{question} with x^{n} and \\frac{a}{b}{c}", "{question}\n{}\n{ x }",
    "{question}{choices}{instruction}",
])
def test_latex_arguments_and_other_braces_stay_literal(text):
    expect = text.replace("{question}", "q").replace("{choices}", "").replace("{instruction}", "I")
    assert render_prompt(TemplateConfig(text=text, instruction="I"), "q") == expect


def test_chat_modes_with_real_tokenizers(shared_dir):
    from transformers import AutoTokenizer

    qwen = AutoTokenizer.from_pretrained(shared_dir / "tokenizers" / "qwen1.5")
    llama = AutoTokenizer.from_pretrained(shared_dir / "tokenizers" / "llama2")
    chat = PromptTemplate(TemplateConfig(chat="auto", system="You are a careful solver."), qwen)
    text = chat.render(Problem("p", "What is 2+3?", "5", "math"))
    assert chat.uses_chat and not chat.add_special_tokens
    assert text.startswith("<|im_start|>system\nYou are a careful solver.<|im_end|>")
    assert "<|im_start|>user\nWhat is 2+3?\nPut the final answer in \\boxed{}.<|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")
    fallback = PromptTemplate(TemplateConfig(chat="auto"), llama)
    assert not fallback.uses_chat and fallback.add_special_tokens
    assert fallback.render("1+1?") == "1+1?\n" + BOXED_INSTRUCTION + "\n"
    with pytest.raises(TemplateError, match="policy B: template.chat is 'require'"):
        PromptTemplate(TemplateConfig(chat="require"), llama, policy="policy B")
    assert not PromptTemplate(TemplateConfig(chat="never"), qwen).uses_chat


def test_config_from_yaml_mapping():
    from shared_interfaces.config_io import ConfigError, from_mapping

    cfg = from_mapping(TemplateConfig, {"text": "{question}\n", "chat": "auto"})
    assert cfg == TemplateConfig(text=TINY_TEXT, chat="auto")
    with pytest.raises(ConfigError, match="unknown key"):
        from_mapping(TemplateConfig, {"txt": "{question}"})
