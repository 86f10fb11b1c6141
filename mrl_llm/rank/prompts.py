"""A policy's prompts: each problem rendered with the policy's template and encoded, cached by prompt id.

:meth:`PromptCache.render` applies the template (:class:`~mrl_llm.templates.PromptTemplate`) and encodes the
text with the template's special-token rule; a prompt id whose rendered text is unchanged is a cache hit.
:meth:`PromptCache.set_prompt` encodes a given text (what a peer check or the contract tests set directly).
A prompt that encodes to no tokens, or to more than ``max_prompt_len``, is a ``ValueError`` naming the
policy and the prompt. :meth:`PromptCache.ids` and :meth:`PromptCache.text` read the cache; a prompt never
rendered is a ``KeyError`` naming both. The newest ``max_entries`` prompts are kept.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from mrl_llm.templates import PromptTemplate


class PromptCache:
    """Policy ``name``'s rendered prompts (module docstring)."""

    def __init__(self, name: str, tokenizer: Any, template: PromptTemplate, *, max_prompt_len: int,
                 max_entries: int = 20_000) -> None:
        self.name, self.tokenizer, self.template = name, tokenizer, template
        self.max_prompt_len, self.max_entries = max_prompt_len, max_entries
        self._prompts: OrderedDict[str, tuple[str, list[int]]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._prompts)

    def render(self, problem: Any) -> tuple[str, list[int]]:
        """The policy's prompt for ``problem`` (template applied) and its ids; cached by prompt id."""
        pid = str(problem.prompt_id)
        text = self.template.render(problem)
        hit = self._prompts.get(pid)
        if hit is not None and hit[0] == text:
            self._prompts.move_to_end(pid)
            return hit
        return self.set_prompt(pid, text)

    def set_prompt(self, pid: str, text: str) -> tuple[str, list[int]]:
        """Encode and cache the prompt text of prompt ``pid`` (what :meth:`render` stores)."""
        ids = list(self.tokenizer(text, add_special_tokens=self.template.add_special_tokens).input_ids)
        if not ids:
            raise ValueError(f"policy {self.name!r}: prompt {pid!r} encodes to no tokens; check the template")
        if len(ids) > self.max_prompt_len:
            raise ValueError(
                f"policy {self.name!r}: prompt {pid!r} has {len(ids)} tokens > max_prompt_len "
                f"{self.max_prompt_len}; raise policies[].max_prompt_len or shorten the question"
            )
        self._prompts[pid] = (text, ids)
        if len(self._prompts) > self.max_entries:
            self._prompts.popitem(last=False)
        return text, ids

    def _get(self, prompt_id: str) -> tuple[str, list[int]]:
        hit = self._prompts.get(prompt_id)
        if hit is None:
            raise KeyError(f"policy {self.name!r} has not rendered prompt {prompt_id!r}; generate() comes first")
        return hit

    def ids(self, prompt_id: str) -> list[int]:
        """The token ids of a rendered prompt."""
        return self._get(prompt_id)[1]

    def text(self, prompt_id: str) -> str:
        """The text of a rendered prompt."""
        return self._get(prompt_id)[0]
