"""One JSON document on disk, as the interface formats (success matrix, dynamics) store theirs: read with one-line
errors, written atomically, gzip-compressed when the name ends in ``.gz``."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path
from typing import Any


def read_json_document(p: Path, error: type[Exception], what: str, hint: str) -> Any:
    """The parsed JSON of the existing file ``p`` (``.gz``: decompressed); ``error`` naming ``what`` and ``p`` for
    text that is not JSON, a damaged gzip file or nesting too deep to parse, each followed by ``hint``."""
    try:
        raw = gzip.decompress(p.read_bytes()) if p.suffix == ".gz" else p.read_bytes()
        return json.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as err:  # (JSONDecodeError, an integer of over 4300 digits)
        raise error(f"{what} {p} is not valid JSON: {err}; {hint}") from err
    except (OSError, EOFError) as err:  # a damaged or truncated .gz
        raise error(f"{what} {p} is not a readable gzip file: {err}; {hint}") from err
    except RecursionError as err:
        raise error(f"{what} {p} is nested too deeply to read; {hint}") from err


def write_json_document(path: str | Path, doc: Any) -> Path:
    """Write ``doc`` as JSON (NaN refused), gzip-compressed when ``path`` ends in ``.gz``, atomically: a temporary
    file renamed over ``path``."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
    text = (json.dumps(doc, allow_nan=False) + "\n").encode("utf-8")
    tmp.write_bytes(gzip.compress(text, mtime=0) if p.suffix == ".gz" else text)
    os.replace(tmp, p)
    return p
