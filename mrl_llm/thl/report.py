"""``python -m mrl_llm.thl report``: the residual statistics of a tokenizer pair on a text file.

A user checks a (peer → learner) pair before training. Each text of the JSONL file stands for a peer
response: it is encoded by the peer tokenizer (special-token spellings kept as text), followed by the
peer's EOS, and given synthetic behaviour log-probs ``ℓ ~ −Exponential(1)`` (seeded; the token and
boundary counts do not depend on them, the mass figures scale with them). THL aligns the batch and the
report prints what came back: text round-trips, token counts, boundary conflicts, and the residual
(``word_mass_error``, ``moved_mass``, ``crossing_mass`` relative to the total mass, ``unaligned_mass``,
and ``oov_tokens``: peer ids beyond the peer tokenizer, always 0 here since the peer tokenizer encoded the texts).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import unicodedata
from pathlib import Path
from typing import Any

import numpy as np

from mrl_llm.thl.align import align_traces
from mrl_llm.thl.vocab import same_vocabulary, vocab_info
from shared_interfaces.config_io import int_at_least

TEXT_FIELDS = ("response", "text", "answer", "solution", "completion", "output")


class ReportError(Exception):
    """A bad input of the report; :func:`main` prints it as one line and exits 2."""


def load_tokenizer(path: str, flag: str) -> Any:
    from transformers import AutoTokenizer

    from mrl_llm.models import ModelLoadError, require_tokenizer_files

    p = Path(path)
    if not p.is_dir():
        raise ReportError(f"tokenizer dir {path} not found; pass {flag} DIR (a folder with tokenizer.json or vocab.json + merges.txt)")
    try:
        require_tokenizer_files(p, flag)
    except ModelLoadError as err:
        raise ReportError(str(err)) from err
    try:
        return AutoTokenizer.from_pretrained(p)
    except Exception as exc:  # noqa: BLE001 - report what went wrong and how to fix it
        raise ReportError(f"could not load a tokenizer from {path} ({exc}); pass {flag} a folder saved by save_pretrained") from exc


def load_texts(path: str, field: str | None, limit: int | None) -> list[str]:
    """The text field of each row of a JSONL file; a bad row (not UTF-8, not JSON, not an object, no text
    field) or a file with no rows exits with a message naming the file and line."""
    from mrl_llm.data.jsonl import DataError, decode_line

    p = Path(path)
    if not p.is_file():
        raise ReportError(f"data file {path} not found; pass --data FILE.jsonl (one JSON object a line)")
    texts = []
    with p.open("rb") as f:
        for n, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                row = json.loads(decode_line(raw, f"{path}:{n}", first=n == 1))
            except DataError as err:
                raise ReportError(str(err)) from err
            except json.JSONDecodeError as err:
                raise ReportError(f"{path}:{n}: not valid JSON ({err.msg} at column {err.colno})") from err
            if not isinstance(row, dict):
                raise ReportError(f"{path}:{n}: a row must be a JSON object, got {type(row).__name__}")
            key = field or next((k for k in TEXT_FIELDS if isinstance(row.get(k), str)), None)
            if key is None or not isinstance(row.get(key), str):
                raise ReportError(f"{path}:{n}: no text field {field or '/'.join(TEXT_FIELDS)}; pass --field NAME")
            texts.append(row[key])
            if limit is not None and len(texts) >= limit:
                break
    if not texts:
        raise ReportError(f"{path} has no text rows; pass --data a JSONL file with one JSON object a line")
    return texts


def _encode_literal(tokenizer: Any, text: str) -> list[int]:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    old = backend.encode_special_tokens
    backend.encode_special_tokens = True
    try:
        return backend.encode(text, add_special_tokens=False).ids
    finally:
        backend.encode_special_tokens = old


def pair_report(source: Any, target: Any, texts: list[str], *, seed: int = 0, batch_size: int = 256) -> dict[str, Any]:
    """Align ``texts`` as peer responses of ``source`` into ``target``; return the statistics."""
    rng = np.random.default_rng(seed)
    eos = [] if source.eos_token_id is None else [source.eos_token_id]
    ids = [_encode_literal(source, t) + eos for t in texts]
    lps = [-rng.exponential(1.0, size=len(x)) for x in ids]
    vocab_info(source), vocab_info(target)  # the per-tokenizer tables, built once, are not timed
    t0 = time.perf_counter()
    traces = [tr for i in range(0, len(ids), batch_size) for tr in align_traces(source, target, ids[i : i + batch_size], lps[i : i + batch_size])]
    seconds = time.perf_counter() - t0
    total_mass = float(sum(np.abs(lp).sum() for lp in lps)) or 1.0
    res = [tr.residual for tr in traces]
    learner_text = [target.decode(tr.target_ids[: tr.target_ids.size - tr.eos_appended].tolist(), skip_special_tokens=False) for tr in traces]
    n_words = sum(r.n_words for r in res)
    return {
        "source": {"kind": vocab_info(source).kind, "size": len(source), "bos": source.bos_token_id, "eos": source.eos_token_id},
        "target": {"kind": vocab_info(target).kind, "size": len(target), "bos": target.bos_token_id, "eos": target.eos_token_id},
        "same_vocabulary": same_vocabulary(source, target),
        "sequences": len(traces),
        "source_tokens": sum(len(x) for x in ids),
        "target_tokens": sum(tr.target_ids.size for tr in traces),
        "words": n_words,
        "peer_text_equal": sum(tr.text == t for tr, t in zip(traces, texts, strict=True)),
        "peer_text_equal_nfc": sum(tr.text == unicodedata.normalize("NFC", t) or tr.text == t for tr, t in zip(traces, texts, strict=True)),
        "learner_text_equal": sum(d == tr.text for d, tr in zip(learner_text, traces, strict=True)),
        "learner_text_equal_normalised": sum(
            d in (tr.text, unicodedata.normalize("NFC", tr.text), tr.text[1:] if tr.text.startswith(" ") else tr.text)
            for d, tr in zip(learner_text, traces, strict=True)
        ),
        "eos_counterparts": sum(tr.eos_appended for tr in traces),
        "boundary_conflicts": sum(r.n_boundary_conflicts for r in res),
        "conflicts_per_1000_words": 1000.0 * sum(r.n_boundary_conflicts for r in res) / max(n_words, 1),
        "sequences_with_conflicts": sum(r.n_boundary_conflicts > 0 for r in res),
        "split_chars": sum(r.n_split_chars for r in res),
        "oov_tokens": sum(r.n_oov_tokens for r in res),
        "word_mass_error_max": max((r.word_mass_error for r in res), default=0.0),
        "word_mass_error_mean": float(np.mean([r.word_mass_error for r in res])) if res else 0.0,
        "moved_mass_fraction": sum(r.moved_mass for r in res) / total_mass,
        "crossing_mass_fraction": sum(r.crossing_mass for r in res) / total_mass,
        "unaligned_mass": sum(r.unaligned_mass for r in res),
        "mass_identity_max_error": max(
            (abs(tr.target_logprobs.sum() + tr.residual.unaligned_mass - lp.sum()) for tr, lp in zip(traces, lps, strict=True)), default=0.0
        ),
        "seconds": seconds,
        "source_tokens_per_second": sum(len(x) for x in ids) / max(seconds, 1e-9),
    }


def format_report(source_dir: str, target_dir: str, data: str, s: dict[str, Any]) -> str:
    n = max(s["sequences"], 1)
    lines = [
        f"THL report: {source_dir} (peer) -> {target_dir} (learner) on {data}",
        f"  peer    : {s['source']['kind']}, {s['source']['size']} tokens, BOS {s['source']['bos']}, EOS {s['source']['eos']}",
        f"  learner : {s['target']['kind']}, {s['target']['size']} tokens, BOS {s['target']['bos']}, EOS {s['target']['eos']}",
        f"  same vocabulary (pass-through): {s['same_vocabulary']}",
        f"  sequences {s['sequences']}, peer tokens {s['source_tokens']}, learner tokens {s['target_tokens']} "
        f"({s['target_tokens'] / max(s['source_tokens'], 1):.3f} per peer token), words {s['words']}",
        f"  peer text == input: {s['peer_text_equal']}/{n} ({s['peer_text_equal_nfc']}/{n} up to NFC)",
        f"  learner decode == text: {s['learner_text_equal']}/{n} "
        f"({s['learner_text_equal_normalised']}/{n} up to NFC / SentencePiece leading space)",
        f"  EOS counterparts: {s['eos_counterparts']}/{n}",
        f"  boundary conflicts: {s['boundary_conflicts']} ({s['conflicts_per_1000_words']:.1f} per 1000 words; "
        f"{s['sequences_with_conflicts']}/{n} sequences); characters split across tokens: {s['split_chars']}",
        f"  word_mass_error: max {s['word_mass_error_max']:.4f}, mean over sequences {s['word_mass_error_mean']:.4f} (nats)",
        f"  moved mass: {100 * s['moved_mass_fraction']:.3f}% of |peer mass|; split by characters (crossing peer tokens): "
        f"{100 * s['crossing_mass_fraction']:.3f}%",
        f"  unaligned mass: {s['unaligned_mass']:.6g} (out-of-vocabulary peer tokens: {s['oov_tokens']}); "
        f"mass identity max error {s['mass_identity_max_error']:.2e}",
        f"  time: {s['seconds']:.2f} s ({s['source_tokens_per_second']:,.0f} peer tokens/s)",
        "  (synthetic log-probs ~ -Exponential(1); counts do not depend on them)",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mrl_llm.thl", description="Tokenizer Heterogeneity Layer tools")
    sub = ap.add_subparsers(dest="command", required=True)
    rp = sub.add_parser("report", help="residual statistics of a tokenizer pair on a JSONL text file")
    rp.add_argument("--source", required=True, help="peer tokenizer folder")
    rp.add_argument("--target", required=True, help="learner tokenizer folder")
    rp.add_argument("--data", required=True, help="JSONL file; each row's text field is one peer response")
    rp.add_argument("--field", default=None, help=f"text field (default: the first of {', '.join(TEXT_FIELDS)})")
    rp.add_argument("--limit", type=int_at_least(1), default=None, help="use the first N rows")
    rp.add_argument("--seed", type=int_at_least(0), default=0, help="seed of the synthetic log-probs")
    rp.add_argument("--json", action="store_true", help="print the statistics as JSON")
    args = ap.parse_args(argv)
    try:
        source = load_tokenizer(args.source, "--source")
        target = load_tokenizer(args.target, "--target")
        texts = load_texts(args.data, args.field, args.limit)
    except ReportError as err:
        print(f"mrl_llm.thl report: {err}", file=sys.stderr)
        return 2
    stats = pair_report(source, target, texts, seed=args.seed)
    print(json.dumps(stats, indent=2) if args.json else format_report(args.source, args.target, args.data, stats))
    return 0
