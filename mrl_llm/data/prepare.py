"""``python -m mrl_llm data prepare --config FILE``: write the config's training data file from a source.

The source (``--source``) is a local ``.jsonl`` / ``.json`` file (a JSON list of objects) or a Hugging
Face dataset id, loaded with ``datasets.load_dataset(id, name=--subset, split=--split)`` (the hub cache
first; ``HF_HUB_OFFLINE=1`` uses the cache only; needs the ``datasets`` package, the ``hub`` extra).
Every row is checked with the config's ``data`` section — its field mapping and verifier
(:func:`mrl_llm.data.jsonl.row_to_problem`), a malformed row is an error naming it — and written as it
is (so the config loads the file with its own mapping), with the mapping's ``id`` key filled in as
``<source>:<row>`` where a row has none. The output is ``data.path`` (``--out`` overrides it); an
existing file is kept unless ``--force``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from mrl_llm.data.jsonl import DataConfig, DataError, row_to_problem
from mrl_llm.hub import hub_hint, is_hub_id


def read_local(path: Path) -> list[Any]:
    """Rows of a local ``.jsonl`` (one object a line, blank lines skipped) or ``.json`` (a list) file."""
    if path.suffix == ".json":
        try:
            rows = json.loads(path.read_text(encoding="utf-8"))
        except ValueError as err:
            raise DataError(f"{path}: not valid JSON ({err})") from err
        if not isinstance(rows, list):
            raise DataError(f"{path}: a .json source must hold a list of row objects")
        return rows
    out = []
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                out.append(json.loads(line))
            except ValueError as err:
                raise DataError(f"{path}:{i}: not valid JSON ({err})") from err
    return out


def read_hub(repo: str, *, split: str, subset: str | None = None) -> Iterable[Mapping[str, Any]]:
    """Rows of split ``split`` of hub dataset ``repo`` (``datasets.load_dataset``)."""
    try:
        import datasets
    except ImportError as err:
        raise DataError(f"reading the hub dataset {repo!r} needs the datasets package; pip install "
                        "'mutual-rl[hub]' (or datasets), or pass a local .jsonl file as --source") from err
    try:
        return datasets.load_dataset(repo, name=subset, split=split)
    except Exception as err:  # noqa: BLE001 - re-raised with the id and a hint
        raise DataError(f"cannot load split {split!r} of the hub dataset {repo!r}: {err}; {hub_hint(repo)}") from err


def prepare(data: DataConfig, source: str, *, out: str | Path | None = None, split: str = "train",
            subset: str | None = None, force: bool = False) -> tuple[Path, int]:
    """Write ``source``'s rows, checked against ``data``, to ``out`` (default ``data.path``); returns
    ``(path, rows written)`` (module docstring)."""
    dest = Path(out or data.path)
    if dest.exists() and not force:
        raise FileExistsError(f"{dest} exists; pass --force to overwrite it")
    local = Path(source).expanduser()
    if local.is_file():
        rows, name = read_local(local), local.stem
    elif is_hub_id(source):
        rows, name = read_hub(source, split=split, subset=subset), source
    else:
        raise DataError(f"--source {source!r} is neither a file nor a hub dataset id (owner/name)")
    fields = data.fields
    written = []
    for i, row in enumerate(rows):
        where = f"{source} row {i}"
        row = dict(row) if isinstance(row, Mapping) else row
        if isinstance(row, dict) and fields.id is not None and row.get(fields.id) in (None, ""):
            row[fields.id] = f"{name}:{i}"
        row_to_problem(row, fields=fields, verifier=data.verifier, default_id=f"{name}:{i}", where=where)
        written.append(json.dumps(row, ensure_ascii=False, default=str))
    if not written:
        raise DataError(f"--source {source!r} has no rows; nothing written")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".tmp")
    tmp.write_text("\n".join(written) + "\n", encoding="utf-8")
    tmp.replace(dest)
    return dest, len(written)
