"""Word-level trace alignment: the public :func:`align_trace` / :func:`align_traces`.

Given a peer's response ids ``y`` (tokenizer ``T_j``) with behaviour log-probs ``ℓ_k``, THL returns the
response in the learner's tokens ``ỹ`` (tokenizer ``T_i``) with log-probs ``ℓ'_n``:

1. **Text** (:mod:`mrl_llm.thl.adapt`, :mod:`mrl_llm.thl.encode`): the peer's whole-sequence
   decode with its special tokens taken out, re-encoded by the learner (after ``prompt_text`` when
   given). Every peer and learner token gets a character span of the text.
2. **Words** (:mod:`mrl_llm.thl.words`): a word is a run of whitespace followed by a maximal run of
   non-whitespace (whitespace belongs to the next word; trailing whitespace is a last,
   whitespace-only word). A token belongs to every word its span touches; an empty span belongs to
   the word at its position.
3. **Mass — pooled per word, spread uniformly.** Word ``w``'s peer mass is
   ``m_w = Σ_k a_kw ℓ_k`` and each learner token ``n`` gets ``ℓ'_n = Σ_w m_w a_nw / Σ_n' a_n'w``,
   where ``a_tw`` is token ``t``'s share of word ``w``: 1 for a token inside ``w``, 0 for a token
   outside it. Where no token crosses a word boundary this is exactly the pooling of the paper:
   ``ℓ'_n = m_w / |{n ∈ w}|`` and ``Σ_{n∈w} ℓ'_n = m_w`` (per-word conservation).
4. **The boundary rule.** A token whose span crosses word boundaries (Qwen's ``".\n\n"``, a
   SentencePiece piece ``"▁of▁the"``, a learner token straddling the prompt) has ``a_tw`` = the
   fraction of its characters inside ``w``. A peer token's mass is thus split between its words; a
   learner token draws from every word it touches. Total mass is conserved; per-word mass is not
   where a learner token mixes words: the :class:`~mrl_llm.thl.trace.Residual` measures it
   (``word_mass_error``, ``moved_mass``), and ``crossing_mass`` is the peer mass split by characters.
   A character split across byte tokens (a byte-fallback ``<0xF0>``, a byte-level piece) lies in one
   word, so it moves nothing (``n_split_chars`` counts it). A word no learner token touches (a learner
   whose encoding skips characters) gives its mass to the previous word of the sequence that has
   learner tokens (the next one if none) — moved mass, not lost.

**EOS and special tokens (the contract the trainer relies on).** The peer's EOS ids are the ids its
engine stops on: ``source_eos_ids`` (the tokenizer's ``eos_token_id`` plus its generation config's
``eos_token_id`` list, e.g. a chat model's ``<|im_end|>``; default: the tokenizer's alone). When the
peer response ends with one of them and ``append_eos=True`` (the default), ``target_ids`` end with the
learner tokenizer's EOS carrying exactly the peer EOS's log-prob — a 1:1 counterpart, not residual. With
``append_eos=False``, or a learner without an EOS token, that mass is unaligned. Every other peer
special token (BOS, template markers, padding, an EOS not at the end) is dropped from the text and its
mass goes to ``unaligned_mass``. Trailing whitespace of the text is its own last word: its mass goes
to the learner tokens that spell it, before the EOS.

**Out-of-vocabulary ids.** A peer model may have more vocabulary rows than its tokenizer has tokens
(real models pad: Qwen2.5's 151,936 rows vs its tokenizer's ~151,665) and its engine samples over all
of them, so a response can hold an id ``>= len(source_tokenizer)``. Such an id has no text: it is
treated exactly like a stripped special token — dropped from the text, its mass goes to
``unaligned_mass`` — wherever it stands (start, middle, just before the EOS; a response of only such
ids is an empty one), and :attr:`~mrl_llm.thl.trace.Residual.n_oov_tokens` counts them. The one
exception is a final id the engine stopped on (one of ``source_eos_ids``), which keeps the EOS
contract above. Negative ids, non-integer ids and bad log-probs are still refused
(:class:`~mrl_llm.thl.adapt.THLInputError`).

**Same vocabulary** (:func:`mrl_llm.thl.vocab.same_vocabulary`): ids and log-probs pass through
unchanged, no decode/re-encode (the text is decoded for information only). The EOS contract still
holds: a final peer EOS becomes the learner's EOS id when the two tokenizers name different EOS
tokens (e.g. a base and a chat tokenizer of one family), and with ``append_eos=False`` or a learner
without an EOS it is dropped and its mass is unaligned. Out-of-vocabulary ids (``>= len(source_tokenizer)``)
do not pass through either (the learner's model may have fewer rows): they are dropped, their mass
unaligned and counted, as above.

**Prompt.** With ``prompt_texts`` the learner encodes ``prompt + response`` as one string, with its
special tokens added (BOS for Llama-style tokenizers) unless ``prompt_special_tokens=False`` (a chat
prompt, whose template holds them); ``prompt_ids + target_ids`` is that encoding, so a row built from
them never repeats a character a straddling token covers.

**Empty responses** (no token, or only special or out-of-vocabulary tokens) give an empty trace: no
learner tokens (the EOS counterpart alone when the peer stopped on EOS), zero residual, and the dropped
tokens' mass unaligned.

**Invariant**: ``Σ target_logprobs + unaligned_mass = Σ source_logprobs`` (float64 rounding only).
Log-probs below :data:`shared_interfaces.records.LOGPROB_FLOOR` are refused (:class:`THLInputError`).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mrl_llm.thl.adapt import (
    Batch,
    SourceSide,
    adapt_source,
    as_arrays,
    decode_batch,
    ends_with_eos,
    oov_mask,
)
from mrl_llm.thl.encode import TargetSide, encode_target
from mrl_llm.thl.trace import AlignedTrace, Residual
from mrl_llm.thl.vocab import VocabInfo, same_vocabulary, vocab_info
from mrl_llm.thl.words import codepoints, segment_starts, word_spans


def align_trace(
    source_tokenizer: Any,
    target_tokenizer: Any,
    source_ids: Sequence[int] | Any,
    source_logprobs: Sequence[float] | Any,
    *,
    prompt_text: str | None = None,
    append_eos: bool = True,
    source_eos_ids: Collection[int] | None = None,
    prompt_special_tokens: bool = True,
) -> AlignedTrace:
    """Align one peer trace into the learner's tokens (see the module for the rule and the contract)."""
    prompts = None if prompt_text is None else [prompt_text]
    return align_traces(
        source_tokenizer, target_tokenizer, [source_ids], [source_logprobs], prompt_texts=prompts, append_eos=append_eos,
        source_eos_ids=source_eos_ids, prompt_special_tokens=prompt_special_tokens,
    )[0]


@dataclass(frozen=True)
class _Options:
    append_eos: bool
    eos_ids: np.ndarray  # the peer's EOS ids (int64, sorted)
    prompt_special_tokens: bool


def source_eos_array(source_tokenizer: Any, source_eos_ids: Collection[int] | None) -> np.ndarray:
    """The peer's EOS ids as a sorted int64 array: ``source_eos_ids`` plus the tokenizer's own EOS."""
    ids = set() if source_eos_ids is None else {int(i) for i in source_eos_ids}
    if source_tokenizer.eos_token_id is not None:
        ids.add(int(source_tokenizer.eos_token_id))
    return np.array(sorted(ids), dtype=np.int64)


def align_traces(
    source_tokenizer: Any,
    target_tokenizer: Any,
    batch_ids: Sequence[Any],
    batch_logprobs: Sequence[Any],
    *,
    prompt_texts: Sequence[str] | None = None,
    append_eos: bool = True,
    source_eos_ids: Collection[int] | None = None,
    prompt_special_tokens: bool = True,
) -> list[AlignedTrace]:
    """:func:`align_trace` for many sequences at once (batched decode and encode, vectorised pooling).

    Identical sequences (same ids, log-probs and prompt: a confident policy's group often repeats a
    response) are aligned once and share one trace (its arrays are read-only)."""
    src, tgt = vocab_info(source_tokenizer), vocab_info(target_tokenizer)
    batch = as_arrays(src, batch_ids, batch_logprobs)
    opts = _Options(append_eos, source_eos_array(source_tokenizer, source_eos_ids), prompt_special_tokens)
    if prompt_texts is not None:
        if len(prompt_texts) != len(batch.ids):
            raise ValueError(f"got {len(prompt_texts)} prompt texts for {len(batch.ids)} sequences; pass one prompt per sequence or none")
        prompt_texts = [str(p) for p in prompt_texts]
    prompts = prompt_texts if prompt_texts is not None else [None] * len(batch.ids)
    keys = [(a.tobytes(), b.tobytes(), p) for a, b, p in zip(batch.ids, batch.logprobs, prompts, strict=True)]
    first = {k: i for i, k in reversed(list(enumerate(keys)))}  # each key's first sequence
    if len(first) == len(keys):
        return _align_batch(source_tokenizer, target_tokenizer, src, tgt, batch, prompt_texts, opts)
    rows = sorted(first.values())
    at = {keys[i]: j for j, i in enumerate(rows)}
    unique = _align_batch(source_tokenizer, target_tokenizer, src, tgt, _take(batch, rows),
                          None if prompt_texts is None else [prompt_texts[i] for i in rows], opts)
    return [unique[at[k]] for k in keys]


def _take(batch: Batch, rows: list[int]) -> Batch:
    """The sequences ``rows`` of ``batch``."""
    ids, lps = [batch.ids[i] for i in rows], [batch.logprobs[i] for i in rows]
    return Batch(ids, lps, np.concatenate(ids) if ids else np.zeros(0, np.int64),
                 np.concatenate(lps) if lps else np.zeros(0), batch.lengths[rows])


def _align_batch(source_tokenizer: Any, target_tokenizer: Any, src: VocabInfo, tgt: VocabInfo, batch: Batch,
                 prompt_texts: list[str] | None, opts: _Options) -> list[AlignedTrace]:
    if same_vocabulary(source_tokenizer, target_tokenizer):
        return _passthrough(source_tokenizer, target_tokenizer, src, tgt, batch, prompt_texts, opts)
    source = adapt_source(source_tokenizer, src, batch, append_eos=opts.append_eos, eos_ids=opts.eos_ids)
    target = encode_target(target_tokenizer, tgt, source.texts, prompt_texts, add_special=opts.prompt_special_tokens)
    return _pool(source, target, tgt.eos_id)


def _passthrough(
    source_tokenizer: Any, target_tokenizer: Any, src: VocabInfo, tgt: VocabInfo, batch: Batch, prompts: list[str] | None,
    opts: _Options,
) -> list[AlignedTrace]:
    n = len(batch.ids)
    oov = oov_mask(src, batch, opts.eos_ids)  # ids beyond the peer's tokenizer: dropped, mass unaligned
    if oov.any():
        seq = np.repeat(np.arange(n, dtype=np.int64), batch.lengths)
        n_oov = np.bincount(seq[oov], minlength=n).tolist()
        oov_mass = np.bincount(seq[oov], batch.flat_logprobs[oov], minlength=n).tolist()
        keep = ~oov
        bounds = np.concatenate([[0], np.cumsum(batch.lengths)]).tolist()
        masks = [keep[bounds[i] : bounds[i + 1]] for i in range(n)]
        seq_ids = [a[m] for a, m in zip(batch.ids, masks, strict=True)]
        seq_lps = [b[m] for b, m in zip(batch.logprobs, masks, strict=True)]
    else:
        n_oov, oov_mass = [0] * n, [0.0] * n
        seq_ids, seq_lps = batch.ids, batch.logprobs
    texts = decode_batch(source_tokenizer, [a.tolist() for a in seq_ids])
    if prompts is None:
        prompt_ids = [np.zeros(0, np.int64)] * len(texts)
    else:
        prompt_ids = [np.asarray(target_tokenizer(p, add_special_tokens=opts.prompt_special_tokens)["input_ids"], np.int64)
                      for p in prompts]
    ends = ends_with_eos(batch, opts.eos_ids).tolist()  # a final EOS is never out of vocabulary (oov_mask)
    out = []
    rows = zip(seq_ids, seq_lps, texts, prompt_ids, ends, n_oov, oov_mass, strict=True)
    for a, b, text, prm, ends_eos, n_oov_i, unaligned in rows:
        a, b = a.copy(), b.copy()
        eos_kept = ends_eos and opts.append_eos and tgt.eos_id is not None
        if eos_kept:
            a[-1] = tgt.eos_id
        elif ends_eos:
            a, unaligned, b = a[:-1], unaligned + float(b[-1]), b[:-1]
        spans = np.array(word_spans(text), dtype=np.int64).reshape(-1, 2)
        res = Residual(word_mass_error=0.0, moved_mass=0.0, unaligned_mass=unaligned, crossing_mass=0.0,
                       n_words=len(spans), n_boundary_conflicts=0, n_split_chars=0, n_oov_tokens=n_oov_i)
        out.append(AlignedTrace(text, a, b, prm, spans, res, eos_kept, True))
    return out


def _pool(source: SourceSide, target: TargetSide, target_eos: int | None) -> list[AlignedTrace]:
    texts = source.texts
    n = len(texts)
    text_len = np.array([len(t) for t in texts], dtype=np.int64)
    char0 = np.concatenate([[0], np.cumsum(text_len)]).astype(np.int64)
    ws = segment_starts(codepoints("".join(texts)), char0[:-1])  # global word starts, sorted
    word_end = np.append(ws[1:], char0[-1])
    word_end = np.minimum(word_end, char0[_word_seq(ws, char0) + 1])
    n_words = np.bincount(_word_seq(ws, char0), minlength=n)
    word0 = np.concatenate([[0], np.cumsum(n_words)]).astype(np.int64)
    W = ws.size
    starts_mask = np.zeros(int(char0[-1]) + 1, dtype=bool)
    starts_mask[ws] = True
    word_of_char = np.cumsum(starts_mask) - 1  # the word of each character of the joined texts

    def place(seq: np.ndarray, s: np.ndarray, e: np.ndarray) -> tuple[np.ndarray, ...]:
        """(first word, last word, placeable, global start, global end) of tokens given local spans;
        an empty span belongs to the word at its position (the last word, at the end of the text)."""
        ok = text_len[seq] > 0
        gs, ge = s + char0[seq], e + char0[seq]
        anchor = np.maximum(np.minimum(gs, char0[seq + 1] - 1), 0)
        first = word_of_char[anchor]
        last = np.where(ge > gs, word_of_char[np.maximum(ge - 1, anchor)], first)
        return np.where(ok, first, -1), np.where(ok, last, -1), ok, gs, ge

    s_first, s_last, s_ok, s_gs, s_ge = place(source.seq, source.starts, source.ends)
    t_first, t_last, t_ok, t_gs, t_ge = place(target.seq, target.starts, target.ends)
    if not t_ok.all():
        raise RuntimeError("the learner tokenizer produced tokens for an empty response text; THL cannot place them")
    s_lp = source.logprobs[s_ok]
    s_rep, s_word, s_share = _shares(s_first[s_ok], s_last[s_ok], s_gs[s_ok], s_ge[s_ok], ws, word_end)
    t_rep, t_word, t_share = _shares(t_first, t_last, t_gs, t_ge, ws, word_end)

    # each word's peer mass (crossing peer tokens split by characters), spread over the learner tokens
    # touching the word in proportion to their characters in it
    s_w = np.bincount(s_word, s_lp[s_rep] * s_share, minlength=W)
    cover = np.bincount(t_word, t_share, minlength=W)
    word_seq = _word_seq(ws, char0)
    recipient = _recipients(cover > 0, word_seq)
    placed = recipient >= 0
    m_w = np.bincount(recipient[placed], s_w[placed], minlength=W)
    t_lp = np.bincount(t_rep, t_share * m_w[t_word] / cover[t_word], minlength=t_first.size).astype(np.float64)
    t_w = np.bincount(t_word, t_share * t_lp[t_rep], minlength=W)

    unaligned = source.special_mass.copy()
    unaligned += np.bincount(source.seq[~s_ok], source.logprobs[~s_ok], minlength=n)
    unaligned += np.bincount(word_seq[~placed], s_w[~placed], minlength=n)
    eos_ok = ~np.isnan(source.eos_logprob)
    if target_eos is None:
        unaligned[eos_ok] += source.eos_logprob[eos_ok]
        eos_ok[:] = False

    err = np.abs(t_w - s_w)
    max_err = _segment_reduce(np.maximum, err, word0)
    moved = 0.5 * _segment_reduce(np.add, err, word0)
    s_cross = s_last[s_ok] > s_first[s_ok]
    t_cross = t_last > t_first
    crossing_mass = np.bincount(source.seq[s_ok][s_cross], np.abs(s_lp[s_cross]), minlength=n).astype(np.float64)
    conflicts = np.bincount(source.seq[s_ok][s_cross], minlength=n) + np.bincount(target.seq[t_cross], minlength=n) + target.straddle
    split = _split_chars(source.seq, source.starts, source.ends, n) + _split_chars(target.seq, target.starts, target.ends, n)

    # outputs: learner ids and log-probs with the EOS counterpart inserted, cut per sequence
    t_sizes = np.fromiter((a.size for a in target.ids), dtype=np.int64, count=n)
    at = np.cumsum(t_sizes)[eos_ok]
    all_ids = np.insert(np.concatenate(target.ids) if n else np.zeros(0, np.int64), at, target_eos if target_eos is not None else 0)
    all_lp = np.insert(t_lp, at, source.eos_logprob[eos_ok])
    bounds = np.concatenate([[0], np.cumsum(t_sizes + eos_ok)]).tolist()
    spans_all = np.stack([ws - char0[word_seq], word_end - char0[word_seq]], axis=1) if W else np.zeros((0, 2), np.int64)
    w0 = word0.tolist()
    columns = zip(max_err.tolist(), moved.tolist(), unaligned.tolist(), crossing_mass.tolist(), n_words.tolist(),
                  conflicts.tolist(), split.tolist(), source.n_oov.tolist(), strict=True)
    out = []
    for i, (err_i, moved_i, unal_i, cross_i, words_i, conf_i, split_i, oov_i) in enumerate(columns):
        a, b = bounds[i], bounds[i + 1]
        res = Residual(err_i, moved_i, unal_i, cross_i, words_i, conf_i, split_i, oov_i)
        out.append(AlignedTrace(  # copies: a cached trace must not keep the whole batch alive
            texts[i], all_ids[a:b].copy(), all_lp[a:b].copy(), target.prompt_ids[i].copy(), spans_all[w0[i] : w0[i + 1]].copy(),
            res, bool(eos_ok[i]), False,
        ))
    return out


def _word_seq(ws: np.ndarray, char0: np.ndarray) -> np.ndarray:
    """The sequence each word (by global start) belongs to."""
    return np.searchsorted(char0, ws, side="right") - 1


def _recipients(has: np.ndarray, word_seq: np.ndarray) -> np.ndarray:
    """Word whose learner tokens receive each word's mass: itself when learner tokens touch it, else
    the previous such word of its sequence, else the next one, else -1 (unaligned)."""
    W = has.size
    idx = np.arange(W)
    if W == 0:
        return idx
    prev = np.maximum.accumulate(np.where(has, idx, -1))
    nxt = np.minimum.accumulate(np.where(has, idx, W)[::-1])[::-1]
    prev_ok = (prev >= 0) & (word_seq[np.maximum(prev, 0)] == word_seq)
    nxt_ok = (nxt < W) & (word_seq[np.minimum(nxt, W - 1)] == word_seq)
    return np.where(has, idx, np.where(prev_ok, prev, np.where(nxt_ok, nxt, -1)))


def _shares(first: np.ndarray, last: np.ndarray, gs: np.ndarray, ge: np.ndarray, ws: np.ndarray, we: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(token, word, share) triples: each token's share of each word it touches, by characters
    (1 for a token inside one word, or with an empty span)."""
    count = last - first + 1
    if not (count > 1).any():  # no token crosses a boundary: one (token, word, 1.0) each
        return np.arange(first.size), first, np.ones(first.size)
    rep = np.repeat(np.arange(first.size), count)
    step = np.arange(rep.size) - np.repeat(np.cumsum(count) - count, count)
    word = first[rep] + step
    share = np.ones(rep.size, dtype=np.float64)
    multi = count[rep] > 1
    if multi.any():
        r, w = rep[multi], word[multi]
        share[multi] = (np.minimum(ge[r], we[w]) - np.maximum(gs[r], ws[w])) / (ge[r] - gs[r])
    return rep, word, share


def _segment_reduce(op: np.ufunc, values: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """``op.reduce`` of ``values[bounds[i]:bounds[i+1]]`` for each i (0 for empty segments)."""
    n = bounds.size - 1
    out = np.zeros(n, dtype=np.float64)
    nonempty = bounds[1:] > bounds[:-1]
    if nonempty.any():
        out[nonempty] = op.reduceat(values, bounds[:-1][nonempty])
    return out


def _split_chars(seq: np.ndarray, starts: np.ndarray, ends: np.ndarray, n: int) -> np.ndarray:
    """Per sequence: neighbouring tokens (in order) whose spans overlap."""
    if seq.size < 2:
        return np.zeros(n, dtype=np.int64)
    overlap = (seq[1:] == seq[:-1]) & (starts[1:] < ends[:-1]) & (ends[:-1] > starts[:-1]) & (ends[1:] > starts[1:])
    return np.bincount(seq[1:][overlap], minlength=n)
