"""What THL returns: :class:`AlignedTrace` and its :class:`Residual`."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Residual:
    """What the alignment could not carry over exactly, for one sequence.

    * ``word_mass_error`` — ``max_w |Σ_n a_nw ℓ'_n − Σ_k a_kw ℓ_k|`` over the words of the text, with
      ``a_tw`` token ``t``'s share of word ``w`` (:mod:`mrl_llm.thl.align`; 1 inside one word, the
      fraction of its characters for a token crossing words). 0 up to float error where no learner
      token crosses a word boundary and every word has learner tokens.
    * ``moved_mass`` — ``½ Σ_w |Σ_n a_nw ℓ'_n − Σ_k a_kw ℓ_k|``: the mass moved between words.
    * ``unaligned_mass`` — ``Σ source − Σ target``: the mass of the peer's special tokens, of its
      out-of-vocabulary ids, of an EOS without a learner counterpart, and of text no learner token
      covers. Exactly 0 when everything was placed.
    * ``crossing_mass`` — ``Σ |ℓ_k|`` over peer tokens that cross a word boundary (their mass is split
      between words by characters: a convention, not a measurement).
    * ``n_words`` — words of the text.
    * ``n_boundary_conflicts`` — peer and learner tokens that cross a word boundary, plus 1 when the
      first learner token straddles the prompt/response boundary.
    * ``n_split_chars`` — characters shared by two neighbouring tokens of one side (a multi-byte
      character split across byte tokens); they stay inside one word, so they move no mass.
    * ``n_oov_tokens`` — peer ids ``>= len(source_tokenizer)`` (a padded model's extra vocabulary rows,
      which have no text) dropped like special tokens, their mass in ``unaligned_mass``
      (:mod:`mrl_llm.thl.align`, "Out-of-vocabulary ids").
    """

    word_mass_error: float
    moved_mass: float
    unaligned_mass: float
    crossing_mass: float
    n_words: int
    n_boundary_conflicts: int
    n_split_chars: int
    n_oov_tokens: int = 0


@dataclass(frozen=True, eq=False)
class AlignedTrace:
    """A peer response in the learner's tokens, with the peer's behaviour log-probs aligned to them.

    ``text`` is the response text (the peer's whole-sequence decode, special tokens skipped);
    ``target_ids`` / ``target_logprobs`` are the learner's response tokens and their aligned log-probs
    (ending with the learner's EOS when ``eos_appended``); ``prompt_ids`` are the learner's prompt
    tokens when a prompt was given (``prompt_ids + target_ids`` is the learner's encoding of
    prompt + response), else empty. ``word_spans`` is an ``(n_words, 2)`` int array of the
    ``[start, end)`` character spans of the words of ``text`` (:mod:`mrl_llm.thl.words`). ``passthrough`` is True when both sides share a
    vocabulary and ids / log-probs were passed through unchanged. Arrays are read-only.
    """

    text: str
    target_ids: np.ndarray
    target_logprobs: np.ndarray
    prompt_ids: np.ndarray
    word_spans: np.ndarray
    residual: Residual
    eos_appended: bool
    passthrough: bool

    def __post_init__(self) -> None:
        for a in (self.target_ids, self.target_logprobs, self.prompt_ids, self.word_spans):
            a.flags.writeable = False
