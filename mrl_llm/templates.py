"""A policy's prompt template: the text a policy is prompted with for a problem, with the answer-format
instruction. The trainer tokenizes the text this returns.

A template is plain text with placeholders, replaced in one pass (so literal braces such as
``\\boxed{}`` may appear in the text):

* ``{question}`` (required) — the problem's question; for a multiple-choice problem whose template has
  no ``{choices}``, the question followed by its options, one per line (``A. ...``);
* ``{choices}`` — the options, one per line (empty for other problems);
* ``{instruction}`` — the answer-format instruction (default :data:`BOXED_INSTRUCTION`).

Any other ``{name}`` in the text is refused unless it is a LaTeX argument (``\\boxed{answer}``, ``x^{n}``): nothing
fills it, so it would reach the model as it is (a misspelt ``{instrution}``, or ``{answer}``).

``chat`` says whether to wrap that text as the user turn of the tokenizer's chat template
(``apply_chat_template(..., add_generation_prompt=True)``; the text stripped; ``system`` as a system
turn):
``never`` (default: plain text, what base models and tiny models want), ``auto`` (when the tokenizer
has a chat template) or ``require`` (an error if it has none). In plain mode ``system``, if set, is
put before the text, followed by a blank line.

**Few-shot examples** (:class:`mrl_llm.data.shots.FewShotConfig`, the run's ``few_shot`` section; none by
default): each problem carries its examples (``Problem.shots``, drawn once for the run by
:func:`mrl_llm.data.shots.attach_shots`, the same for every policy), and the template renders them before the
problem: in chat mode as earlier user / assistant turns (the user turn is the template text of the example's
question, the assistant turn ``shot_reply``), in plain mode as blocks of ``shot_text`` (after ``system``, before
the text). Both fill ``{question}`` and ``{gold}`` (the example's gold answer) in one pass, so ``\\boxed{{gold}}``
reads ``\\boxed{19}``. A problem without examples renders exactly as before.

Tokenize a plain prompt with the tokenizer's special tokens (``add_special_tokens=True``: BOS where
the tokenizer adds one) and a chat prompt without them (the chat template holds them);
:attr:`PromptTemplate.add_special_tokens` says which.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

from mrl_llm.data.problem import Problem, format_choices

BOXED_INSTRUCTION = "Put the final answer in \\boxed{}."
MCQ_INSTRUCTION = "Answer with the letter of the correct option, in \\boxed{}."
#: The default plain template: question, then the instruction on its own line.
DEFAULT_TEXT = "{question}\n{instruction}\n"
#: For tiny models trained from scratch on the arithmetic task: just the question and a newline.
TINY_TEXT = "{question}\n"

#: A plain-mode example block: the question and the boxed gold answer, then a blank line (item 2 of issue 41).
DEFAULT_SHOT_TEXT = "Q: {question}\nA: \\boxed{{gold}}\n\n"
#: A chat-mode example's assistant turn.
DEFAULT_SHOT_REPLY = "\\boxed{{gold}}"

ChatMode = Literal["never", "auto", "require"]
_PLACEHOLDER = re.compile(r"\{(question|choices|instruction)\}")
_SHOT_PLACEHOLDER = re.compile(r"\{(question|gold)\}")
#: ``{name}`` that reads as a placeholder: not a LaTeX argument (``\boxed{answer}``, ``x^{n}``, ``\frac{a}{b}``).
_LOOKS_LIKE_PLACEHOLDER = re.compile(r"(?<![A-Za-z0-9\\^_}\]])\{([A-Za-z_][A-Za-z0-9_]*)\}")


class TemplateError(ValueError):
    """A template config is unusable with this tokenizer; the message says what to change."""


def _check_shot_format(key: str, text: str, needs: tuple[str, ...]) -> None:
    """``text`` (``shot_text`` / ``shot_reply``) holds every placeholder of ``needs`` and no other ``{name}``."""
    missing = [f"{{{n}}}" for n in needs if f"{{{n}}}" not in text]
    if missing:
        raise TemplateError(f"template {key} {text!r} has no {', '.join(missing)} placeholder; add it")
    if "\\boxed{gold}" in text:
        raise TemplateError(f"template {key} {text!r} writes \\boxed{{gold}}, which would read \\boxed19; write "
                            "\\boxed{{gold}} (the box's braces around the {gold} placeholder)")
    unknown = [m.group(0) for m in _LOOKS_LIKE_PLACEHOLDER.finditer(text)
               if not _SHOT_PLACEHOLDER.fullmatch(m.group(0))]
    if unknown:
        raise TemplateError(f"template {key} {text!r} has {', '.join(unknown)}, which no example fills (the "
                            "placeholders are {question} and {gold}); correct the name, or remove the braces")


@dataclass(frozen=True)
class TemplateConfig:
    """A policy's prompt template (module docstring): ``text`` with ``{question}``, optional
    ``{choices}`` and ``{instruction}``; the ``instruction``; ``chat`` mode; optional ``system``; how a few-shot
    example is rendered: ``shot_text`` (plain mode, a block before the text) and ``shot_reply`` (chat mode, the
    example's assistant turn), both with ``{question}`` / ``{gold}`` (``shot_reply``: ``{gold}`` only)."""

    text: str = DEFAULT_TEXT
    instruction: str = BOXED_INSTRUCTION
    chat: ChatMode = "never"
    system: str | None = None
    shot_text: str = DEFAULT_SHOT_TEXT
    shot_reply: str = DEFAULT_SHOT_REPLY

    def __post_init__(self) -> None:
        if "{question}" not in self.text:
            raise TemplateError(f"template text {self.text!r} has no {{question}} placeholder; add one")
        unknown = [m.group(0) for m in _LOOKS_LIKE_PLACEHOLDER.finditer(self.text)
                   if not _PLACEHOLDER.fullmatch(m.group(0))]
        if unknown:
            raise TemplateError(f"template text {self.text!r} has {', '.join(unknown)}, which no problem fills (the "
                                "placeholders are {question}, {choices} and {instruction}); correct the name, or "
                                "remove the braces")
        if self.chat not in ("never", "auto", "require"):
            raise TemplateError(f"template chat must be 'never', 'auto' or 'require', got {self.chat!r}")
        _check_shot_format("shot_text", self.shot_text, ("question", "gold"))
        _check_shot_format("shot_reply", self.shot_reply, ("gold",))


def fill_shot(text: str, example: Problem) -> str:
    """``text`` (``shot_text`` / ``shot_reply``) with ``{question}`` and ``{gold}`` of ``example``, in one pass."""
    values = {"question": example.question, "gold": example.gold}
    return _SHOT_PLACEHOLDER.sub(lambda m: values[m.group(1)], text)


def has_chat_template(tokenizer: Any) -> bool:
    """Whether ``tokenizer`` (a transformers tokenizer) carries a chat template."""
    return bool(getattr(tokenizer, "chat_template", None))


class PromptTemplate:
    """A :class:`TemplateConfig` bound to a tokenizer (needed only for chat templates)."""

    def __init__(self, config: TemplateConfig, tokenizer: Any = None, *, policy: str = "policy"):
        self.config = config
        self.tokenizer = tokenizer
        if config.chat == "never":
            self.uses_chat = False
        elif has_chat_template(tokenizer):
            self.uses_chat = True
        elif config.chat == "require":
            raise TemplateError(
                f"{policy}: template.chat is 'require' but its tokenizer has no chat template; "
                "set template.chat to 'auto' or 'never', or use a tokenizer that has one"
            )
        else:
            self.uses_chat = False

    @property
    def add_special_tokens(self) -> bool:
        """Tokenize the rendered prompt with special tokens (plain) or without (chat)."""
        return not self.uses_chat

    def user_text(self, question: str, choices: tuple[str, ...] = ()) -> str:
        """The template text with the placeholders filled (the user turn, in chat mode)."""
        problem_choices = format_choices(tuple(choices))
        q = question
        if choices and "{choices}" not in self.config.text:
            q = question.rstrip() + "\n" + problem_choices
        values = {"question": q, "choices": problem_choices, "instruction": self.config.instruction}
        return _PLACEHOLDER.sub(lambda m: values[m.group(1)], self.config.text)

    def render(self, problem: Problem | str) -> str:
        """The full prompt text for ``problem`` (a :class:`Problem`, or a bare question string)."""
        shots: tuple[Problem, ...] = ()
        if isinstance(problem, Problem):
            user, shots = self.user_text(problem.question, problem.choices), problem.shots
        else:
            user = self.user_text(problem)
        cfg = self.config
        if not self.uses_chat:
            user = "".join(fill_shot(cfg.shot_text, s) for s in shots) + user
            return user if cfg.system is None else f"{cfg.system}\n\n{user}"
        messages = [] if cfg.system is None else [{"role": "system", "content": cfg.system}]
        for s in shots:
            messages += [{"role": "user", "content": self.user_text(s.question, s.choices).strip()},
                         {"role": "assistant", "content": fill_shot(cfg.shot_reply, s)}]
        messages.append({"role": "user", "content": user.strip()})
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        if not isinstance(text, str):
            raise TemplateError(f"the tokenizer's chat template returned {type(text).__name__}, not text")
        return text


def render_prompt(config: TemplateConfig, problem: Problem | str, tokenizer: Any = None) -> str:
    """The prompt text for ``problem`` under ``config`` (see :class:`PromptTemplate`)."""
    return PromptTemplate(config, tokenizer).render(problem)
