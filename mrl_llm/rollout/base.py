"""The rollout-engine contract every engine (HF, vLLM) implements.

Behaviour log-probs are defined once: ``log_softmax(logits / temperature)`` over the full vocabulary,
at the sampled token (:func:`shared_interfaces.losses.token_logprobs`); top-p changes which tokens can
be sampled, never the recorded log-prob. Every engine returns exactly this, so the trainer's
recomputation at the same weights matches up to float error.
"""

from __future__ import annotations

import abc
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch


def release_cached_device_memory() -> None:
    """Hand the CUDA caching allocator's unused blocks back to the driver (``torch.cuda.empty_cache``; nothing where
    CUDA is not initialised, e.g. on the CPU), where verl does: after an update before sampling, and around a vLLM
    engine's sleep and wake-up, so that memory one side freed is not still held from the other."""
    torch.cuda.empty_cache()


def generation_eos_ids(model_dir: str | Path | None) -> tuple[int, ...]:
    """The ``eos_token_id`` ids (one or a list) of ``model_dir/generation_config.json``, sorted; () when the
    directory or the file is absent or names none. The engines stop on these besides the tokenizer's EOS
    (a chat model's ``<|im_end|>``), and THL maps them to the learner's EOS."""
    if model_dir is None:
        return ()
    path = Path(model_dir) / "generation_config.json"
    if not path.is_file():
        return ()
    try:
        extra = json.loads(path.read_text(encoding="utf-8")).get("eos_token_id")
    except (OSError, ValueError, AttributeError) as err:
        raise ValueError(f"{path}: cannot read it as a JSON object ({err}); fix or remove the file") from err
    if extra is None:
        return ()
    items = [extra] if isinstance(extra, int) else extra
    if not isinstance(items, list) or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in items):
        raise ValueError(f"{path}: eos_token_id must be a token id or a list of ids, got {extra!r}")
    return tuple(sorted(set(items)))


def newline_token_ids(tokenizer) -> tuple[int, ...]:
    """The ids of ``tokenizer`` whose decoded text (alone) holds a newline, sorted: what a response that ends at its
    first newline stops on (:meth:`RolloutEngine.add_stop_ids`); () for a vocabulary without one."""
    texts = tokenizer.batch_decode([[i] for i in range(len(tokenizer))])
    return tuple(i for i, t in enumerate(texts) if "\n" in t)


def graded_text(text: str, stop_at_newline: bool) -> str:
    """What a response is graded on: its text up to its first newline when it stops there, else all of it."""
    return text.split("\n", 1)[0] if stop_at_newline else text


def check_prompts(prompts: Sequence[Sequence[int]], *, vocab_size: int | None, max_len: int | None) -> None:
    """A ``ValueError`` naming the first prompt that is empty, holds an id outside ``[0, vocab_size)``, or
    leaves no room for a response within ``max_len`` positions (prompt + response; ``None``: no limit)."""
    for i, p in enumerate(prompts):
        if len(p) == 0:
            raise ValueError(f"prompt {i} has no tokens; apply the template (and BOS) first")
        if vocab_size is not None:
            bad = next((t for t in p if not 0 <= t < vocab_size), None)
            if bad is not None:
                raise ValueError(f"prompt {i}: token id {bad} is outside the model's vocabulary [0, {vocab_size}); "
                                 "encode the prompts with the policy's own tokenizer")
        if max_len is not None and len(p) >= max_len:
            raise ValueError(f"prompt {i} has {len(p)} tokens, leaving no room for a response within the model's "
                             f"{max_len} positions (max_position_embeddings / max_model_len); shorten the prompt or "
                             "lower max_prompt_len")


@dataclass(frozen=True)
class SamplingConfig:
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 64
    seed: int | None = None
    greedy: bool = False  # argmax instead of sampling (evaluation); log-probs are still recorded
    # one seed per sequence (prompt-major, n per prompt) instead of one per call: a sample then does not depend
    # on which other prompts share the call (a worker group splits a step's prompts over its ranks)
    row_seeds: tuple[int, ...] | None = None

    def check_rows(self, n_rows: int) -> None:
        """A ``ValueError`` when ``row_seeds`` is given but not one seed per sequence."""
        if self.row_seeds is not None and len(self.row_seeds) != n_rows:
            raise ValueError(f"row_seeds: {len(self.row_seeds)} seeds for {n_rows} sequences; give one per "
                             "(prompt, sample)")

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0 (use a small value for near-greedy), got {self.temperature}")
        if not (0 < self.top_p <= 1):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")


@dataclass(frozen=True)
class Sample:
    """One generated response: token ids (EOS included when generated), their behaviour log-probs,
    ``finish_reason`` (``stop`` on EOS, ``length`` when ``max_new_tokens`` or the model's positions ran out) and the decoded
    text (special tokens skipped)."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: Literal["stop", "length"]
    text: str


class RolloutEngine(abc.ABC):
    """Samples responses for one policy (its own tokenizer and weights)."""

    @abc.abstractmethod
    def generate(
        self, prompt_token_ids: Sequence[Sequence[int]], n: int, sampling: SamplingConfig
    ) -> list[list[Sample]]:
        """``n`` samples for each prompt (token ids in the policy's tokenizer, template applied); a prompt that
        :func:`check_prompts` refuses is a ``ValueError`` naming it."""

    def add_stop_ids(self, ids: Sequence[int]) -> None:
        """End a sequence also at any of ``ids`` (kept in the response with its log-prob, ``finish_reason = "stop"``,
        as at EOS), e.g. :func:`newline_token_ids`. The engines stop on their ``eos_ids``; THL still maps only the
        EOS ids it is given (:mod:`mrl_llm.thl.align`), so a peer's stop token reaches a learner as text."""
        self.eos_ids = sorted(set(self.eos_ids) | {int(i) for i in ids})

    @abc.abstractmethod
    def sync_weights(self, model: torch.nn.Module) -> None:
        """Make the engine sample from ``model``'s current weights (in place where possible)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release the engine's resources."""
