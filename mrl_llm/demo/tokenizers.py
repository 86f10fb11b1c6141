"""Two genuinely different tokenizers, trained here with the ``tokenizers`` library on the task's text.

The demo needs heterogeneous vocabularies without downloading any (``../shared`` is not assumed), so
it trains two small ones, of the two families real LLMs use, on the training prompts and reference
responses of the synthetic arithmetic task (``What is 12+7?`` / ``\\boxed{19}``):

* ``bytebpe`` — GPT-2 / Qwen style: byte-level BPE with the GPT-2 pre-split regex (so ``" 12"`` and
  ``"19"`` are whole-number pieces), no BOS added, ``<|endoftext|>`` as EOS (and BOS, as GPT-2),
  ``<|pad|>`` as pad.
* ``spbpe`` — Llama / SentencePiece style: BPE over ``Metaspace`` (``▁`` for spaces, prepended to
  the first word), digits split one by one (Llama's ``split_digits``), byte fallback (``<0x0A>`` for
  the newline, which the training text does not contain: prompts and responses are trained as
  separate texts), the Llama decoder (Replace / ByteFallback / Fuse / Strip) and a post-processor
  that puts ``<s>`` in front; ``</s>`` EOS, ``<unk>``, ``<pad>``.

A third kind, for the study (:mod:`mrl_llm.demo.study`; the demo does not build it):

* ``char`` — character-level (ByT5 / CANINE style, over characters rather than bytes): one token per
  character of the task's alphabet (plus ``\n``), a ``WordLevel`` model over single characters, no
  merges at all, ``<bos>`` prepended, ``<eos>``, ``<unk>``, ``<pad>``; numbers are spelled digit by
  digit and ``\boxed{`` takes seven tokens.

So the same prompt is tokenised differently (whole numbers vs digits, ``Ġ`` vs ``▁``, BOS or not)
and THL has real work to do. Both are deterministic functions of the task text (the trainers run
single-threaded over a fixed-order corpus; a test pins it). :func:`save_demo_tokenizers` writes each
as a ``transformers.PreTrainedTokenizerFast`` directory that ``AutoTokenizer.from_pretrained`` loads.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

from mrl_llm.rewards import ArithmeticTask, reference_response

KINDS = ("bytebpe", "spbpe")
#: Every kind :func:`build_tokenizer` knows (the demo builds :data:`KINDS`; the study adds ``char``).
ALL_KINDS = (*KINDS, "char")


def task_texts(task: ArithmeticTask) -> list[str]:
    """The corpus: every training prompt's question and its reference response, in the task's order."""
    out: list[str] = []
    for p in task.problems("train"):
        out += [p.question, reference_response(p)]
    return out


def _single_threaded() -> None:
    # the tokenizers trainers parallelise with rayon; one thread keeps merges in a fixed order
    os.environ.setdefault("RAYON_NUM_THREADS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def byte_level_bpe(texts: Sequence[str], vocab_size: int = 320):
    """The ``bytebpe`` tokenizer (module docstring) as a ``PreTrainedTokenizerFast``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    _single_threaded()
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    specials = ["<|endoftext|>", "<|pad|>"]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(list(texts), trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|endoftext|>",
                                   pad_token="<|pad|>", clean_up_tokenization_spaces=False)


def sentencepiece_bpe(texts: Sequence[str], vocab_size: int = 96):
    """The ``spbpe`` tokenizer (module docstring) as a ``PreTrainedTokenizerFast``; ``vocab_size``
    counts the trained pieces, the 256 byte pieces come on top."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    _single_threaded()
    specials = ["<unk>", "<s>", "</s>", "<pad>"]
    pre = pre_tokenizers.Sequence([
        pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=True),
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.Split(Regex("\n"), behavior="isolated"),
    ])
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tok.pre_tokenizer = pre
    tok.train_from_iterator(list(texts), trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                                             show_progress=False))
    spec = json.loads(tok.to_str())
    vocab = spec["model"]["vocab"]
    for b in range(256):  # the byte pieces SentencePiece's byte fallback uses
        vocab.setdefault(f"<0x{b:02X}>", len(vocab))
    tok = Tokenizer.from_str(json.dumps(spec))
    tok.pre_tokenizer = pre
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                   pad_token="<pad>", clean_up_tokenization_spaces=False)


def char_level(texts: Sequence[str]):
    """The ``char`` tokenizer (module docstring) as a ``PreTrainedTokenizerFast``: its vocabulary is the
    special tokens then the sorted characters of ``texts`` and ``\n``."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<bos>", "<eos>", "<unk>"]
    chars = sorted(set("".join(texts)) | {"\n"})
    vocab = {t: i for i, t in enumerate(specials + chars)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", pair="<bos> $A <bos> $B",
                                                       special_tokens=[("<bos>", vocab["<bos>"])])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", unk_token="<unk>",
                                   pad_token="<pad>", clean_up_tokenization_spaces=False)


def build_tokenizer(kind: str, task: ArithmeticTask):
    """The ``kind`` tokenizer (one of :data:`ALL_KINDS`) trained on ``task``'s text."""
    texts = task_texts(task)
    if kind == "bytebpe":
        return byte_level_bpe(texts)
    if kind == "spbpe":
        return sentencepiece_bpe(texts)
    if kind == "char":
        return char_level(texts)
    raise ValueError(f"unknown demo tokenizer kind {kind!r}; choose one of {list(ALL_KINDS)}")


def save_demo_tokenizers(out_dir: str | Path, task: ArithmeticTask,
                         kinds: Sequence[str] = KINDS) -> dict[str, Path]:
    """Train and save each tokenizer to ``out_dir/<kind>``; ``{kind: dir}``."""
    out = {}
    for kind in kinds:
        d = Path(out_dir) / kind
        build_tokenizer(kind, task).save_pretrained(str(d))
        out[kind] = d
    return out
