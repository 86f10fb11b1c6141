"""THL fixtures: the four real tokenizers of ../shared and small locally trained ones, loaded once."""

from __future__ import annotations

import json
import unicodedata
from itertools import permutations
from pathlib import Path

import pytest

from tests.thl import tiny_tokenizers as tiny

REPO_ROOT = Path(__file__).resolve().parents[2]
REAL = ("qwen1.5", "llama2", "mistral", "gpt2")
REAL_PAIRS = list(permutations(REAL, 2))


@pytest.fixture(scope="session")
def real_tokenizers(shared_dir):
    from transformers import AutoTokenizer

    return {name: AutoTokenizer.from_pretrained(shared_dir / "tokenizers" / name) for name in REAL}


@pytest.fixture(scope="session")
def tiny_tokenizers():
    return {
        "tiny_bl": tiny.byte_level_bpe(),
        "tiny_sp_bpe": tiny.metaspace("bpe", "llama"),
        "tiny_sp_uni": tiny.metaspace("unigram", "metaspace"),
        "tiny_sp_nosplit": tiny.metaspace("bpe", "llama", split=False),
    }


@pytest.fixture(scope="session")
def math500(shared_dir):
    with open(shared_dir / "data" / "math500.jsonl", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def learner_normalisations(text: str) -> set[str]:
    """The documented ways a learner's decode of its own encoding may differ from the text: Unicode
    NFC (Qwen's normaliser), SentencePiece's dropped leading space, and a SentencePiece tokenizer
    reading a literal U+2581 ``▁`` as a space."""
    out = {text, unicodedata.normalize("NFC", text), text.replace("\u2581", " ")}
    out |= {t[1:] for t in out if t.startswith(" ")}
    return out
