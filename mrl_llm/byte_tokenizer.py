"""A real Hugging Face tokenizer whose ids are the UTF-8 bytes of the text (tokenizer id ``utf8-bytes``).

Id ``b`` (0..255) is byte ``b``; ``<|eos|>`` is 256 and ``<|pad|>`` 257. It is a byte-level BPE with no
merges (GPT-2's byte-to-symbol table, no pre-split), so THL treats it like any byte-level tokenizer. The
contract cases (``tests/contract``) write their records in these ids.
"""

from __future__ import annotations

from functools import lru_cache

BYTE_TOKENIZER_ID = "utf8-bytes"


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's table: byte -> printable stand-in symbol (byte-level BPE vocabularies spell bytes with these)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs, strict=True)}


@lru_cache(maxsize=1)
def byte_tokenizer():
    """The ``utf8-bytes`` tokenizer (a ``PreTrainedTokenizerFast``; cached, treat as read-only)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {sym: b for b, sym in bytes_to_unicode().items()}
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tk.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|eos|>", pad_token="<|pad|>")
    tok.name_or_path = BYTE_TOKENIZER_ID
    return tok
