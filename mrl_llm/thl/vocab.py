"""Per-tokenizer facts THL needs, computed once per tokenizer object and cached.

:class:`VocabInfo` holds, for every id ``0 <= id < len(tokenizer)``:

* ``token bytes`` — the UTF-8 bytes the token spells inside a sequence, so that the bytes of a
  sequence are the concatenation of its tokens' bytes (no per-token decode, which cannot represent
  a byte-fallback token or half of a multi-byte character). Two families are known:

  - **byte-level BPE** (GPT-2, Qwen; decoder ``ByteLevel``): each symbol of the token string maps
    back to one byte through GPT-2's ``bytes_to_unicode`` table;
  - **SentencePiece with byte fallback** (Llama-2, Mistral; decoder ``Replace(▁→' ')``,
    ``ByteFallback``, ``Fuse``, ``Strip``): ``<0xNN>`` is byte ``NN``, other pieces are their text
    with ``▁`` read as a space. A SentencePiece decode strips one leading space (the dummy prefix);
    the byte view keeps it (see :mod:`mrl_llm.thl.adapt`).

  Added tokens spell their literal content (special tokens are removed from responses before the
  byte view is used, but they may occur in a learner's prompt). For any other family ``kind`` is
  ``"unknown"`` and THL uses the computed fallback of :mod:`mrl_llm.thl.offsets`.
* ``special`` — whether the id is a special token (``tokenizer.all_special_ids``).
* ``fingerprint`` — a hash of the full id → token map and the decoder, used for the
  same-vocabulary pass-through.
"""

from __future__ import annotations

import hashlib
import json
import weakref
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal

import numpy as np

Kind = Literal["byte_level", "sentencepiece", "unknown"]

_CACHE: weakref.WeakKeyDictionary[Any, VocabInfo] = weakref.WeakKeyDictionary()


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """Inverse of GPT-2's ``bytes_to_unicode``: printable stand-in symbol -> byte value."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs, strict=True)}


def _backend_json(tokenizer: Any) -> dict[str, Any] | None:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    try:
        return json.loads(backend.to_str())
    except Exception:  # noqa: BLE001 - a backend we cannot serialise is simply "unknown"
        return None


def _decoder_kind(spec: dict[str, Any] | None) -> tuple[Kind, bool]:
    """(family, whether decode strips one leading space) from the backend's decoder spec."""
    if spec is None:
        return "unknown", False
    dec = spec.get("decoder") or {}
    if dec.get("type") == "ByteLevel":
        return "byte_level", False
    if dec.get("type") == "Sequence":
        parts = dec.get("decoders", [])
        types = [p.get("type") for p in parts]
        replaces_space = any(
            p.get("type") == "Replace" and p.get("pattern", {}).get("String") == "\u2581" and p.get("content") == " "
            for p in parts
        )
        if replaces_space and "ByteFallback" in types:
            strips = any(p.get("type") == "Strip" and p.get("content") == " " and p.get("start") == 1 for p in parts)
            return "sentencepiece", strips
    return "unknown", False


def _token_bytes(kind: Kind, token: str) -> bytes:
    if kind == "byte_level":
        table = _byte_decoder()
        try:
            return bytes(table[ch] for ch in token)
        except KeyError:  # a symbol outside the byte alphabet: an added token spelled literally
            return token.encode("utf-8")
    if len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
        try:
            return bytes([int(token[3:5], 16)])
        except ValueError:
            pass
    return token.replace("\u2581", " ").encode("utf-8")


@dataclass(frozen=True, eq=False)
class VocabInfo:
    """Cached per-tokenizer tables (see the module docstring). Arrays are indexed by token id."""

    size: int
    kind: Kind
    strips_leading_space: bool
    pool: np.ndarray  # uint8: every token's bytes, concatenated
    starts: np.ndarray  # int64: start of token id's bytes in ``pool``
    lengths: np.ndarray  # int64: number of bytes of token id
    special: np.ndarray  # bool
    fingerprint: str
    bos_id: int | None
    eos_id: int | None

    def gather_bytes(self, ids: np.ndarray) -> bytes:
        """The concatenated bytes of ``ids`` (vectorised gather from the pool)."""
        if ids.size == 0:
            return b""
        lens = self.lengths[ids]
        total = int(lens.sum())
        if total == 0:
            return b""
        ends = np.cumsum(lens)
        # position j of the output reads pool[starts[id_k] + (j - first_j_of_k)]
        shift = np.repeat(self.starts[ids] - (ends - lens), lens)
        return self.pool[np.arange(total, dtype=np.int64) + shift].tobytes()


def vocab_info(tokenizer: Any) -> VocabInfo:
    """The :class:`VocabInfo` of ``tokenizer`` (an HF tokenizer), built once and cached weakly."""
    try:
        cached = _CACHE.get(tokenizer)
    except TypeError:  # not weak-referenceable: build every time
        cached = None
    if cached is not None:
        return cached
    spec = _backend_json(tokenizer)
    kind, strips = _decoder_kind(spec)
    size = len(tokenizer)
    tokens = tokenizer.convert_ids_to_tokens(list(range(size)))
    special = np.zeros(size, dtype=bool)
    for i in tokenizer.all_special_ids:
        if 0 <= i < size:
            special[i] = True
    added = {int(i): tok.content for i, tok in getattr(tokenizer, "added_tokens_decoder", {}).items()}
    chunks: list[bytes] = []
    for i, tok in enumerate(tokens):
        tok = "" if tok is None else tok
        if i in added:
            chunks.append(added[i].encode("utf-8"))
        elif kind == "unknown":
            chunks.append(b"")
        else:
            chunks.append(_token_bytes(kind, tok))
    lengths = np.fromiter((len(c) for c in chunks), dtype=np.int64, count=size)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    pool = np.frombuffer(b"".join(chunks), dtype=np.uint8)
    h = hashlib.sha256()
    h.update("\x00".join("" if t is None else t for t in tokens).encode("utf-8", "surrogatepass"))
    h.update(json.dumps((spec or {}).get("decoder"), sort_keys=True).encode())
    h.update(json.dumps(sorted(added.items())).encode())
    info = VocabInfo(
        size=size,
        kind=kind,
        strips_leading_space=strips,
        pool=pool,
        starts=starts,
        lengths=lengths,
        special=special,
        fingerprint=h.hexdigest(),
        bos_id=tokenizer.bos_token_id,
        eos_id=tokenizer.eos_token_id,
    )
    try:
        _CACHE[tokenizer] = info
    except TypeError:
        pass
    return info


def same_vocabulary(a: Any, b: Any) -> bool:
    """True when ``a`` and ``b`` map every id to the same token and decode the same way."""
    return a is b or vocab_info(a).fingerprint == vocab_info(b).fingerprint
