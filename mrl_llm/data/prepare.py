"""``python -m mrl_llm data prepare --config FILE``: write the config's training data file from a source.

The source (``--source``) is a local ``.jsonl`` / ``.json`` file (a JSON list of objects) or a Hugging
Face dataset id, loaded with ``datasets.load_dataset(id, name=--subset, split=--split)`` (the hub cache
first; ``HF_HUB_OFFLINE=1`` uses the cache only; needs the ``datasets`` package, the ``hub`` extra).
Every row is checked as training will load it (:func:`mrl_llm.data.jsonl.load_jsonl`): the config's field
mapping (:func:`mrl_llm.data.jsonl.row_to_problem`), unique ids, and a gold answer the config's verifier can
parse (its ``check_gold``). A row that fails (or a ``.jsonl`` line that is not UTF-8 or not JSON) is an
error naming the file and line (``row N`` for a ``.json`` list or a hub split) or, under
``data.on_malformed: skip``, left out with a counted warning — so what is written always loads in
``train``. Rows are written as they are (so the config loads the file with its own mapping), with the
mapping's ``id`` key filled in as ``<source>:<row>`` where a row has none. The output is ``data.path``
(``--out`` overrides it), checked before any source is read (a file path under a writable directory, made
if missing); an existing file is kept unless ``--force``; it is written through a temporary file that no
failure leaves behind.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from mrl_llm.data.jsonl import DataConfig, DataError, decode_line, parse_json, row_to_problem
from mrl_llm.hub import hub_hint, is_hub_id, looks_like_path

log = logging.getLogger(__name__)


def read_local(path: Path) -> list[tuple[str, Any]]:
    """``(where, row)`` for each row of a local ``.jsonl`` (one object a line, blank lines skipped; ``where`` is
    ``file:line``) or ``.json`` (a list; ``where`` is ``file row N``) file. A ``.jsonl`` line that is not UTF-8
    or not JSON comes as a :class:`DataError` in place of its row (the caller raises or skips it, as
    ``on_malformed`` says); a ``.json`` file that is not UTF-8 JSON holding a list is a :class:`DataError`."""
    raw = path.read_bytes()
    if path.suffix == ".json":
        try:
            text = raw.decode("utf-8-sig")
        except UnicodeDecodeError:
            for lineno, line in enumerate(raw.split(b"\n"), 1):
                decode_line(line, f"{path}:{lineno}", first=lineno == 1)  # raises, naming the line
            raise
        rows = parse_json(text, str(path))
        if not isinstance(rows, list):
            raise DataError(f"{path}: a .json source must hold a list of row objects")
        return [(f"{path} row {i}", row) for i, row in enumerate(rows)]
    out: list[tuple[str, Any]] = []
    for lineno, line in enumerate(raw.split(b"\n"), 1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            out.append((where, parse_json(decode_line(line, where, first=lineno == 1), where)))
        except DataError as err:
            out.append((where, err))
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
    from mrl_llm import rewards
    from shared_interfaces.out_paths import check_out_file

    dest = Path(out or data.path)
    check_out_file(dest, "--out" if out else "data.path", example="train.jsonl")
    if dest.exists() and not force:
        raise FileExistsError(f"{dest} exists; pass --force to overwrite it")
    local = Path(source).expanduser()
    rows: Iterable[tuple[str, Any]]
    if local.is_file():
        rows, name = read_local(local), local.stem
    elif looks_like_path(source) or local.exists():
        what = "is a directory, not a file" if local.exists() else "does not exist"
        raise DataError(f"--source {source!r}: {local.absolute()} {what} (it reads as a path, not a hub dataset id "
                        "owner/name); give an existing .jsonl / .json file")
    elif is_hub_id(source):
        rows = ((f"{source} row {i}", r) for i, r in enumerate(read_hub(source, split=split, subset=subset)))
        name = source
    else:
        raise DataError(f"--source {source!r} is neither a file nor a hub dataset id (owner/name)")
    fields = data.fields
    skip_hint = ("; or set data.on_malformed: skip to leave such rows out" if data.on_malformed == "error"
                 else "")
    written: list[str] = []
    skipped: list[str] = []
    seen: dict[str, str] = {}
    verifier = rewards.get_verifier(data.verifier, **data.verifier_options())
    check_gold = rewards.gold_checker(verifier)
    try:
        for i, (where, row) in enumerate(rows):
            try:
                if isinstance(row, DataError):
                    raise row
                row = dict(row) if isinstance(row, Mapping) else row
                if isinstance(row, dict) and fields.id is not None and row.get(fields.id) in (None, ""):
                    row[fields.id] = f"{name}:{i}"
                problem = row_to_problem(row, fields=fields, verifier=data.verifier, default_id=f"{name}:{i}",
                                         where=where)
                pid = problem.prompt_id
                if pid in seen:  # the rule train's loader applies (load_jsonl)
                    raise DataError(f"{where}: duplicate id {pid!r} (first at {seen[pid]}); train refuses a "
                                    f"file with repeated ids: give each row its own id{skip_hint}")
                seen[pid] = where
                reason = check_gold(problem)
                if reason is not None:
                    raise DataError(f"{where}: gold answer unusable by verifier {data.verifier!r}: {reason}; "
                                    f"fix the answer{skip_hint}")
            except DataError as err:
                if data.on_malformed == "error":
                    raise
                skipped.append(str(err))
                log.warning("skipping row: %s", err)
                continue
            written.append(json.dumps(row, ensure_ascii=False, default=str))
    finally:
        rewards.close_verifier(verifier)
    if skipped:
        log.warning("--source %s: skipped %d of %d rows (data.on_malformed: skip; first: %s)",
                    source, len(skipped), len(skipped) + len(written), skipped[0])
    if not written:
        if skipped:
            raise DataError(f"--source {source!r} has no usable rows ({len(skipped)} skipped; first: "
                            f"{skipped[0]}); nothing written")
        raise DataError(f"--source {source!r} has no rows; nothing written")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".tmp")
    try:
        tmp.write_text("\n".join(written) + "\n", encoding="utf-8")
        tmp.replace(dest)
    except BaseException:
        if tmp.is_file():
            tmp.unlink()
        raise
    return dest, len(written)
