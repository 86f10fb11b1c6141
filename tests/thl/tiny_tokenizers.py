"""Small tokenizers trained here with the ``tokenizers`` library (no download), of the kinds the CPU
demo trains: a byte-level BPE, and SentencePiece-style BPE / Unigram models (``Metaspace``
pre-tokenizer, byte fallback) with either a Llama-style or a ``Metaspace`` decoder. Plus a pure-Python
character tokenizer without offsets (THL's computed fallback)."""

from __future__ import annotations

import json

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizer, PreTrainedTokenizerFast

_WORDS = (
    "the answer is we compute let find so thus therefore since value sum of and for with then "
    "equation solve number integer prime square root triangle angle circle area probability"
).split()
_LATEX = [r"$\frac{1}{2}$", r"\sqrt{x^2+y^2}", r"$x = 3$", r"\boxed{42}", r"$a_n = 2^n$", r"\cdot", r"\pi r^2"]


def corpus(n: int = 400) -> list[str]:
    """A deterministic English + LaTeX corpus (with a little é, ü, 日本, 😀 so merges exist for them,
    and every printable ASCII character)."""
    out = [" ".join(chr(c) for c in range(33, 127))] * 20
    for i in range(n):
        words = [_WORDS[(i * 7 + j * 3) % len(_WORDS)] for j in range(6 + i % 5)]
        words.insert(i % 4, _LATEX[i % len(_LATEX)])
        sep = "\n\n" if i % 5 == 0 else " "
        out.append(" ".join(words) + "." + sep + ("café über 日本 😀" if i % 9 == 0 else ""))
    return out


_SPECIALS = ("<unk>", "<s>", "</s>")


def _fast(tok: Tokenizer, **special: str) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(tokenizer_object=tok, **special)


def byte_level_bpe(vocab_size: int = 500, eos: str | None = "<|endoftext|>") -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = [eos] if eos else []
    tok.train_from_iterator(
        corpus(),
        trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()),
    )
    return _fast(tok, **({"eos_token": eos} if eos else {}))


def _with_byte_pieces(tok: Tokenizer) -> Tokenizer:
    """Put the 256 ``<0xNN>`` pieces into the model vocabulary and turn byte fallback on."""
    spec = json.loads(tok.to_str())
    model = spec["model"]
    pieces = [f"<0x{b:02X}>" for b in range(256)]
    if model["type"] == "BPE":
        vocab = model["vocab"]
        for p in pieces:
            vocab.setdefault(p, len(vocab))
    else:  # Unigram: a list of [piece, score]. A Unigram model matches any piece in the text itself
        # (SentencePiece's control/byte piece types do not exist here), so byte pieces and special
        # pieces get a prohibitive score: literal "<0x0A>" or "</s>" must stay text
        known = {p for p, _ in model["vocab"]}
        model["vocab"] = [[p, -1e6 if p in _SPECIALS else score] for p, score in model["vocab"]]
        model["vocab"] += [[p, -1e6] for p in pieces if p not in known]
    model["byte_fallback"] = True
    return Tokenizer.from_str(json.dumps(spec))


def metaspace(model: str = "bpe", decoder: str = "llama", vocab_size: int = 500, split: bool = True) -> PreTrainedTokenizerFast:
    """SentencePiece-style: Metaspace(prepend first) + byte fallback; ``decoder`` ``"llama"`` is
    Replace/ByteFallback/Fuse/Strip, ``"metaspace"`` is ByteFallback + Metaspace. ``split=False`` lets
    pieces span words (``"▁of▁the"``), as real SentencePiece models can."""
    specials = list(_SPECIALS)
    if model == "bpe":
        tok = Tokenizer(models.BPE(unk_token="<unk>"))
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials)
    else:
        tok = Tokenizer(models.Unigram())
        trainer = trainers.UnigramTrainer(vocab_size=vocab_size, special_tokens=specials, unk_token="<unk>")
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=split)
    tok.train_from_iterator(corpus(), trainer)
    tok = _with_byte_pieces(tok)
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=split)
    if decoder == "llama":
        tok.decoder = decoders.Sequence(
            [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
        )
    else:
        tok.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Metaspace(replacement="\u2581", prepend_scheme="first")])
    return _fast(tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")


class CharTokenizer(PreTrainedTokenizer):
    """A pure-Python character tokenizer: no backend, no offsets (THL must compute spans)."""

    def __init__(self, **kwargs):
        self._alphabet = ["<unk>", "</s>"] + [chr(c) for c in range(32, 127)] + list("\n\t\u00e9\u0301\U0001f600\u65e5\u672c")
        self._index = {c: i for i, c in enumerate(self._alphabet)}
        super().__init__(unk_token="<unk>", eos_token="</s>", **kwargs)

    @property
    def vocab_size(self) -> int:
        return len(self._alphabet)

    def get_vocab(self) -> dict[str, int]:
        return dict(self._index)

    def _tokenize(self, text: str) -> list[str]:
        return list(text)

    def _convert_token_to_id(self, token: str) -> int:
        return self._index.get(token, 0)

    def _convert_id_to_token(self, index: int) -> str:
        return self._alphabet[index]

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        return "".join(tokens)
