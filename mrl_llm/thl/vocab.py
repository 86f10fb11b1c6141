"""Per-tokenizer facts THL needs, computed once per tokenizer object and cached.

:class:`VocabInfo` holds, for every id ``0 <= id < len(tokenizer)``:

* **token bytes** — the UTF-8 bytes the token spells *inside* a sequence, so that the bytes of a
  sequence are the concatenation of its tokens' bytes. No per-token decode (it cannot represent a
  byte-fallback token or half of a multi-byte character). Two families are known, from the backend's
  decoder:

  - ``"byte_level"`` (GPT-2, Qwen; decoder ``ByteLevel``): each symbol of the token string maps back
    to one byte through GPT-2's ``bytes_to_unicode`` table;
  - ``"metaspace"`` (Llama-2, Mistral, and ``tokenizers``-trained SentencePiece-style models; a decoder
    built only from ``Replace(▁→' ')`` / ``Metaspace``, ``ByteFallback``, ``Fuse``, ``Strip``): the
    replacement symbol ``▁`` reads as a space and, when the chain has ``ByteFallback``, ``<0xNN>`` is
    byte ``NN``. These decoders drop the leading space(s) of a sequence (SentencePiece's dummy
    prefix); the byte view keeps them and :mod:`mrl_llm.thl.adapt` measures the difference against
    the real decode, per sequence.

  Added tokens spell their literal content. Any other decoder is ``"unknown"``: THL then uses the
  computed spans of :mod:`mrl_llm.thl.offsets` (exact, slower). The byte view is never trusted
  blindly: :mod:`mrl_llm.thl.adapt` checks it against the tokenizer's own whole-sequence decode.
* **special** — whether the id is a special token (``all_special_ids`` and added tokens marked
  special).
* **fingerprint** — a hash of the id → token map, the added tokens and the decoder;
  :func:`same_vocabulary` decides the pass-through from the token lists themselves.
"""

from __future__ import annotations

import hashlib
import json
import weakref
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal

import numpy as np

from mrl_llm.byte_tokenizer import bytes_to_unicode

Kind = Literal["byte_level", "metaspace", "unknown"]

_CACHE: weakref.WeakKeyDictionary[Any, VocabInfo] = weakref.WeakKeyDictionary()
_SAME: dict[tuple[str, str], bool] = {}

_METASPACE_PARTS = {"Replace", "Metaspace", "ByteFallback", "Fuse", "Strip"}


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """Inverse of GPT-2's ``bytes_to_unicode``: printable stand-in symbol -> byte value."""
    return {sym: b for b, sym in bytes_to_unicode().items()}


def _backend_json(tokenizer: Any) -> dict[str, Any] | None:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    try:
        return json.loads(backend.to_str())
    except Exception:  # noqa: BLE001 - a backend we cannot serialise is simply "unknown"
        return None


def decoder_family(decoder: dict[str, Any] | None) -> tuple[Kind, str, bool]:
    """``(family, replacement symbol, byte fallback)`` of a backend decoder spec (see the module)."""
    if not decoder:
        return "unknown", "", False
    parts = decoder.get("decoders", []) if decoder.get("type") == "Sequence" else [decoder]
    types = [p.get("type") for p in parts]
    if types == ["ByteLevel"]:
        return "byte_level", "", False
    if not types or not set(types) <= _METASPACE_PARTS:
        return "unknown", "", False
    replacement = ""
    for p in parts:
        if p.get("type") == "Metaspace":
            replacement = p.get("replacement", "\u2581")
        elif p.get("type") == "Replace" and p.get("content") == " ":
            replacement = (p.get("pattern") or {}).get("String", "")
    if len(replacement) != 1:
        return "unknown", "", False
    return "metaspace", replacement, "ByteFallback" in types


def _token_bytes(kind: Kind, replacement: str, byte_fallback: bool, token: str) -> bytes:
    if kind == "byte_level":
        table = _byte_decoder()
        try:
            return bytes(table[ch] for ch in token)
        except KeyError:  # a symbol outside the byte alphabet: spelled literally
            return token.encode("utf-8")
    if kind == "metaspace":
        if byte_fallback and len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
            try:
                return bytes([int(token[3:5], 16)])
            except ValueError:
                pass
        return token.replace(replacement, " ").encode("utf-8")
    return b""


@dataclass(frozen=True, eq=False)
class VocabInfo:
    """Cached per-tokenizer tables (see the module docstring). Arrays are indexed by token id."""

    size: int
    kind: Kind
    tokens: tuple[str, ...]
    pool: np.ndarray  # uint8: every token's bytes, concatenated
    starts: np.ndarray  # int64: start of token id's bytes in ``pool``
    lengths: np.ndarray  # int64: number of bytes of token id
    special: np.ndarray  # bool
    fingerprint: str
    decoder_key: str
    eos_id: int | None
    has_backend: bool

    def gather_bytes(self, ids: np.ndarray) -> bytes:
        """The concatenated bytes of ``ids`` (vectorised gather from the pool)."""
        if ids.size == 0:
            return b""
        lens = self.lengths[ids]
        total = int(lens.sum())
        if total == 0:
            return b""
        ends = np.cumsum(lens)
        # output byte j of token k reads pool[starts[id_k] + (j - first byte of k)]
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
    decoder = (spec or {}).get("decoder")
    kind, replacement, byte_fallback = decoder_family(decoder)
    size = len(tokenizer)
    tokens = tuple("" if t is None else str(t) for t in tokenizer.convert_ids_to_tokens(list(range(size))))
    special = np.zeros(size, dtype=bool)
    added_dec = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    for i in list(tokenizer.all_special_ids) + [int(i) for i, t in added_dec.items() if getattr(t, "special", False)]:
        if 0 <= i < size:
            special[i] = True
    added = {int(i): str(getattr(t, "content", t)) for i, t in added_dec.items()}
    chunks = [
        added[i].encode("utf-8") if i in added else _token_bytes(kind, replacement, byte_fallback, tok)
        for i, tok in enumerate(tokens)
    ]
    lengths = np.fromiter((len(c) for c in chunks), dtype=np.int64, count=size)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    pool = np.frombuffer(b"".join(chunks), dtype=np.uint8)
    decoder_key = json.dumps(decoder, sort_keys=True) if spec is not None else f"python:{type(tokenizer).__name__}"
    h = hashlib.sha256()
    h.update("\x00".join(tokens).encode("utf-8", "surrogatepass"))
    h.update(decoder_key.encode())
    h.update(json.dumps(sorted(added.items())).encode())
    info = VocabInfo(
        size=size,
        kind=kind,
        tokens=tokens,
        pool=pool,
        starts=starts,
        lengths=lengths,
        special=special,
        fingerprint=h.hexdigest(),
        decoder_key=decoder_key,
        eos_id=tokenizer.eos_token_id,
        has_backend=spec is not None,
    )
    try:
        _CACHE[tokenizer] = info
    except TypeError:
        pass
    return info


def same_vocabulary(source: Any, target: Any) -> bool:
    """True when every source id means the same token to the target (directional).

    Holds when the target's first ``len(source)`` tokens equal the source's tokens one by one, the
    special flags agree there, and both decode the same way (same decoder spec). A target with extra
    tokens at the end (e.g. Qwen2.5 → Qwen3) still qualifies; the reverse direction does not.
    """
    if source is target:
        return True
    a, b = vocab_info(source), vocab_info(target)
    key = (a.fingerprint, b.fingerprint)
    if key not in _SAME:
        _SAME[key] = (
            a.size <= b.size
            and a.decoder_key == b.decoder_key
            and a.tokens == b.tokens[: a.size]
            and bool(np.array_equal(a.special, b.special[: a.size]))
        )
    return _SAME[key]
