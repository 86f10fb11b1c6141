"""Text adaptation, learner side: the response text -> learner token ids, with character spans.

Without a prompt the text is encoded alone, no special tokens added. With ``prompt_text`` (the
learner's own templated prompt) the learner encodes ``prompt_text + text`` with its special tokens
added (BOS for Llama-style tokenizers, nothing for Qwen/GPT-2: the BOS asymmetry lives in the
tokenizers' own post-processors) — or without them for a chat prompt (``add_special=False``), as the
learner tokenizes its own chat prompts. The response slice starts at the first token that ends after the
prompt; ``prompt_ids`` are the tokens before it, so ``prompt_ids + target_ids`` is exactly the
learner's encoding of prompt + response. A token that straddles the prompt/response boundary belongs
to the response (flagged, and counted as a boundary conflict). Tokens the learner's template adds
(BOS, or an EOS some tokenizers append) never belong to the response.

Spans come from the fast tokenizer's offset mapping (in the original text's characters, so a
normaliser such as Qwen's NFC is accounted for); a tokenizer without a backend gets computed spans
(:mod:`mrl_llm.thl.offsets`).

The peer's text never becomes a learner special token: where it spells one literally (``"</s>"``,
``"<|endoftext|>"``), the sequence is re-encoded with special-token parsing off for the response
(the prompt's own special tokens stay special). A tokenizer that cannot spell some text at all keeps
what it produces: a SentencePiece model reads a literal ``▁`` as a space, and a ``tokenizers``
Unigram model whose vocabulary holds ``<0xNN>`` or special pieces at ordinary scores matches them in
text (give them prohibitive scores when training one).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain
from typing import Any

import numpy as np

from mrl_llm.thl.offsets import computed_char_spans
from mrl_llm.thl.vocab import VocabInfo


@dataclass(frozen=True)
class TargetSide:
    """The learner side of a batch: the response slice of each encoding (``ids``), the tokens before
    it (``prompt_ids``), and per response token (concatenated) its sequence and span in the text."""

    ids: list[np.ndarray]
    prompt_ids: list[np.ndarray]
    seq: np.ndarray
    starts: np.ndarray
    ends: np.ndarray
    straddle: np.ndarray  # per sequence: the first response token also covers prompt characters


#: A batch of encodings, flat: ids, (n, 2) offsets, template-added mask, tokens per encoding.
_Flat = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def _flat_backend(encodings: list[Any], with_mask: bool) -> _Flat:
    ids = [e.ids for e in encodings]
    lens = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
    total = int(lens.sum())
    flat_ids = np.fromiter(chain.from_iterable(ids), dtype=np.int64, count=total)
    off = np.fromiter(chain.from_iterable(chain.from_iterable(e.offsets for e in encodings)), dtype=np.int64, count=2 * total)
    if with_mask:
        added = np.fromiter(chain.from_iterable(e.special_tokens_mask for e in encodings), dtype=bool, count=total)
    else:
        added = np.zeros(total, dtype=bool)
    return flat_ids, off.reshape(-1, 2), added, lens


def _encode_python(tokenizer: Any, text: str, add_special: bool, literal: bool) -> _Flat:
    """A tokenizer without a backend: ids from the tokenizer, spans computed from prefix decodes."""
    enc = tokenizer(text, add_special_tokens=add_special, return_special_tokens_mask=True, split_special_tokens=literal)
    ids = np.asarray(enc["input_ids"], dtype=np.int64)
    added = np.asarray(enc["special_tokens_mask"], dtype=bool) if add_special else np.zeros(ids.size, bool)
    off = np.zeros((ids.size, 2), dtype=np.int64)

    def decode(batch: list[list[int]]) -> list[str]:
        return tokenizer.batch_decode(batch, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    off[~added, 0], off[~added, 1] = computed_char_spans(decode, ids[~added].tolist(), text)
    return ids, off, added, np.array([ids.size], dtype=np.int64)


def _encode_one(tokenizer: Any, text: str, add_special: bool, literal: bool) -> _Flat:
    """One encoding with offsets; ``literal`` turns special-token parsing off (``"</s>"`` stays text)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return _encode_python(tokenizer, text, add_special, literal)
    old = backend.encode_special_tokens
    backend.encode_special_tokens = literal
    try:
        return _flat_backend([backend.encode(text, add_special_tokens=add_special)], add_special)
    finally:
        backend.encode_special_tokens = old


def _encode_literal(tokenizer: Any, info: VocabInfo, full: str, p: int, add_special: bool) -> _Flat:
    """Re-encode one sequence so that special-token spellings in the response stay text.

    With no special token parsed inside the prompt, the whole string is encoded with parsing off
    (exact). Otherwise the prompt is kept up to its last special token and the rest is encoded with
    parsing off (tokenizers split text at special tokens anyway, so this is the same segmentation).
    """
    ids, off, added, _ = _encode_one(tokenizer, full, add_special, literal=False)
    in_prompt = np.flatnonzero(~added & info.special[ids] & (off[:, 1] <= p))
    if in_prompt.size == 0:
        return _encode_one(tokenizer, full, add_special, literal=True)
    j = int(in_prompt[-1])
    c = int(off[j, 1])
    t_ids, t_off, _, _ = _encode_one(tokenizer, full[c:], False, literal=True)
    ids = np.concatenate([ids[: j + 1], t_ids])
    return ids, np.concatenate([off[: j + 1], t_off + c]), np.concatenate([added[: j + 1], np.zeros(t_ids.size, bool)]), np.array([ids.size])


def _concat(rows: list[_Flat]) -> _Flat:
    if not rows:
        return np.zeros(0, np.int64), np.zeros((0, 2), np.int64), np.zeros(0, bool), np.zeros(0, np.int64)
    ids, off, added, lens = zip(*rows, strict=True)
    return np.concatenate(ids), np.concatenate(off), np.concatenate(added), np.concatenate(lens)


def _take_rows(flat: _Flat, rows: np.ndarray) -> _Flat:
    """The encodings ``rows`` (indices into ``flat``'s encodings, repeats allowed), flat again."""
    ids, off, added, lens = flat
    first = np.cumsum(lens) - lens
    new_lens = lens[rows]
    within = np.arange(int(new_lens.sum())) - np.repeat(np.cumsum(new_lens) - new_lens, new_lens)
    idx = np.repeat(first[rows], new_lens) + within
    return ids[idx], off[idx], added[idx], new_lens


def _segment_min(values: np.ndarray, lens: np.ndarray, empty: int) -> np.ndarray:
    out = np.full(lens.size, empty, dtype=np.int64)
    nonempty = lens > 0
    if nonempty.any():
        out[nonempty] = np.minimum.reduceat(values, (np.cumsum(lens) - lens)[nonempty])
    return out


def _slice(flat: _Flat, plen: np.ndarray, text_len: np.ndarray) -> tuple[list[np.ndarray], list[np.ndarray], np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Cut each encoding into prompt and response (see the module), vectorised over the batch.

    The response of row ``i`` starts at ``k_i``, its first text token ending after ``plen[i]``; with no
    such token (an empty response) ``k_i`` is just after the last text token.
    """
    ids, off, added, lens = flat
    n = lens.size
    row0 = np.cumsum(lens) - lens
    seq = np.repeat(np.arange(n), lens)
    pos = np.arange(ids.size) - row0[seq]
    text = ~added
    resp = text & (off[:, 1] > plen[seq])
    k = _segment_min(np.where(resp, pos, np.iinfo(np.int64).max), lens, np.iinfo(np.int64).max)
    none = k == np.iinfo(np.int64).max
    if none.any():
        after_last_text = -_segment_min(np.where(text, -(pos + 1), 0), lens, 0)
        k[none] = np.where(after_last_text[none] > 0, after_last_text[none], lens[none])
    keep = text & (pos >= k[seq])
    r_seq = seq[keep]
    r_off = off[keep]
    bounds = np.concatenate([[0], np.cumsum(np.bincount(r_seq, minlength=n))])
    r_ids = ids[keep]
    targets = [r_ids[bounds[i] : bounds[i + 1]] for i in range(n)]
    prompts = [ids[row0[i] : row0[i] + k[i]] for i in range(n)]
    starts = np.clip(r_off[:, 0] - plen[r_seq], 0, text_len[r_seq])
    ends = np.clip(r_off[:, 1] - plen[r_seq], 0, text_len[r_seq])
    first = bounds[:-1]
    has = bounds[1:] > first
    straddle = np.zeros(n, dtype=bool)
    straddle[has] = r_off[first[has], 0] < plen[has]
    return targets, prompts, r_seq, starts, ends, straddle


def encode_target(tokenizer: Any, info: VocabInfo, texts: list[str], prompts: list[str] | None, *,
                  add_special: bool = True) -> TargetSide:
    """Encode each response with the learner's tokenizer (see the module) and slice the response out.
    ``add_special``: add the tokenizer's special tokens to a prompted encoding (False for a chat prompt,
    whose template holds them); an encoding without a prompt never gets them."""
    n = len(texts)
    add_special = prompts is not None and add_special
    full = texts if prompts is None else [p + t for p, t in zip(prompts, texts, strict=True)]
    plen = np.zeros(n, np.int64) if prompts is None else np.fromiter(map(len, prompts), np.int64, count=n)
    text_len = np.fromiter(map(len, texts), np.int64, count=n)
    backend = getattr(tokenizer, "backend_tokenizer", None)
    unique = list(dict.fromkeys(full))  # a group's samples often repeat a response: encode each text once
    if backend is not None:
        flat = _flat_backend(backend.encode_batch(unique, add_special_tokens=add_special), add_special)
    else:
        flat = _concat([_encode_python(tokenizer, f, add_special, literal=False) for f in unique])
    if len(unique) < n:
        row = {f: j for j, f in enumerate(unique)}
        flat = _take_rows(flat, np.fromiter(map(row.__getitem__, full), dtype=np.int64, count=n))
    targets, prompt_ids, seq, starts, ends, straddle = _slice(flat, plen, text_len)
    bad = np.unique(seq[info.special[np.concatenate(targets)]]) if n else []
    if len(bad) == 0:
        return TargetSide(targets, prompt_ids, seq, starts, ends, straddle)
    # literal special-token text in some responses: redo those rows, then reassemble
    spans = [(starts[seq == i], ends[seq == i]) for i in range(n)]
    for i in bad.tolist():
        t, pr, _, s, e, st = _slice(_encode_literal(tokenizer, info, full[i], int(plen[i]), add_special), plen[i : i + 1], text_len[i : i + 1])
        targets[i], prompt_ids[i], spans[i], straddle[i] = t[0], pr[0], (s, e), st[0]
    seq = np.repeat(np.arange(n), [t.size for t in targets])
    return TargetSide(
        targets, prompt_ids, seq, np.concatenate([s for s, _ in spans]), np.concatenate([e for _, e in spans]), straddle
    )
