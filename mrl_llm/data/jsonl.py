"""JSONL datasets: the row schema, the field mapping and the loader.

Schema (one JSON object per line, UTF-8; blank lines are allowed and counted)::

    {"id": "p17",                        # optional; default id = "<file stem>:<line number>"
     "question": "What is 2+3?",         # required, non-empty string
     "answer": "5",                       # required: a bare answer, or a full solution whose final
                                          #   answer is the last \\boxed{} (MATH style); a finite
                                          #   number is read as its decimal text; for multiple choice a letter
                                          #   ("B") or the text of the right option
     "choices": ["3", "5", "6"],          # optional: multiple-choice options, labelled A, B, C, ...
                                          #   (a list, or an object with keys "A", "B", ... in order)
     "family": "add",                     # optional: a category (per-family metrics, task splits)
     ...}                                 # any other key is kept, read-only, in Problem.meta

The names of these fields are configurable (:class:`FieldMap`): a dataset whose rows read
``{"problem": ..., "solution": ...}`` is loaded with ``fields: {question: problem, answer: solution}``.
``id``, ``choices`` and ``family`` are optional: used when a row has them, ignored when the mapping
sets them to ``null``. The verifier (``math``, ``mcq``, ``arithmetic``) is named once per dataset.

Nothing is dropped silently. A malformed row (bytes that are not UTF-8, bad JSON, not an object, missing or empty question or
answer, bad choices, duplicate id) raises :class:`DataError` naming the file and line; with
``on_malformed: skip`` it is skipped and listed in :class:`LoadReport`. A row whose gold answer the
verifier cannot parse (``check_gold``) is skipped with a counted warning, also listed in the report.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from mrl_llm.data.problem import CHOICE_LETTERS, Problem, ProblemError

log = logging.getLogger(__name__)


class DataError(ValueError):
    """A dataset file or row is malformed; the message names the file and line."""


@dataclass(frozen=True)
class FieldMap:
    """Which row keys hold the question, the answer and the optional id / choices / family."""

    question: str = "question"
    answer: str = "answer"
    id: str | None = "id"
    choices: str | None = "choices"
    family: str | None = "family"

    def __post_init__(self) -> None:
        if not self.question or not self.answer:
            raise DataError("fields.question and fields.answer must name row keys (non-empty strings)")
        used = [k for k in (self.question, self.answer, self.id, self.choices, self.family) if k is not None]
        if len(set(used)) != len(used):
            raise DataError(f"fields map two roles onto one row key: {used}; give each role its own key")


@dataclass(frozen=True)
class DataConfig:
    """A JSONL dataset: ``path``, the ``verifier`` that scores it, the field mapping, what to do with a
    malformed row (``error``: raise, the default; ``skip``: skip it and report it) and an optional
    ``limit`` on how many problems to keep (the first ``limit`` valid rows, in file order).

    Options of the ``math`` verifier (:class:`~mrl_llm.rewards.MathVerifier`): ``answer_format`` —
    ``boxed`` (the default: only the last ``\\boxed{}`` of a response counts) or
    ``boxed_or_answer_line`` (a response with no ``\\boxed`` may give its answer in a closing "The
    answer is: X" / "The final answer is X." phrase, :func:`~mrl_llm.rewards.answer_line`);
    ``verifier_workers`` — how many checker processes score a step's responses in parallel (2)."""

    path: str
    verifier: str = "math"
    fields: FieldMap = field(default_factory=FieldMap)
    on_malformed: Literal["error", "skip"] = "error"
    limit: int | None = None
    answer_format: Literal["boxed", "boxed_or_answer_line"] = "boxed"
    verifier_workers: int = 2

    def __post_init__(self) -> None:
        if not self.path:
            raise DataError("data.path must name a JSONL file")
        if self.answer_format not in ("boxed", "boxed_or_answer_line"):
            raise DataError(f"data.answer_format must be 'boxed' or 'boxed_or_answer_line', got {self.answer_format!r}")
        if self.verifier != "math" and self.answer_format != "boxed":
            raise DataError(f"data.answer_format applies to the math verifier only; verifier {self.verifier!r} "
                            "has its own answer format (remove answer_format)")
        if isinstance(self.verifier_workers, bool) or not isinstance(self.verifier_workers, int) or not (
                1 <= self.verifier_workers <= 64):
            raise DataError(f"data.verifier_workers must be an integer from 1 to 64, got {self.verifier_workers!r}")
        if self.on_malformed not in ("error", "skip"):
            raise DataError(f"data.on_malformed must be 'error' or 'skip', got {self.on_malformed!r}")
        if self.limit is not None and self.limit < 1:
            raise DataError(f"data.limit must be >= 1 or null, got {self.limit}")


    def verifier_options(self) -> dict[str, Any]:
        """The options :func:`mrl_llm.rewards.get_verifier` builds this dataset's verifier with."""
        if self.verifier != "math":
            return {}
        return {"answer_format": self.answer_format, "n_workers": self.verifier_workers}


@dataclass(frozen=True)
class Skipped:
    """A row that was not loaded: its line number and why."""

    line: int
    reason: str


@dataclass(frozen=True)
class LoadReport:
    """What a load read: the problems, the number of non-blank rows and blank lines, and every skipped
    row (malformed rows under ``on_malformed: skip``; rows whose gold the verifier cannot parse)."""

    path: str
    problems: tuple[Problem, ...]
    n_rows: int
    n_blank: int
    skipped: tuple[Skipped, ...]

    def summary(self) -> str:
        text = f"{self.path}: {len(self.problems)} problems from {self.n_rows} rows"
        if self.skipped:
            text += f", {len(self.skipped)} skipped (first: line {self.skipped[0].line}: {self.skipped[0].reason})"
        return text


def _as_text(value: Any) -> str | None:
    """A string, or a number as its decimal text; None for anything else, NaN and infinities among it (JSON has
    neither; Python's reader takes ``NaN`` / ``Infinity`` / ``1e400``, which a gold answer "nan" would score)."""
    if isinstance(value, bool) or (isinstance(value, float) and not math.isfinite(value)):
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)):
        return repr(value) if isinstance(value, float) else str(value)
    return None


def _choices(value: Any, where: str) -> tuple[str, ...]:
    if isinstance(value, Mapping):
        keys = list(value)
        expected = list(CHOICE_LETTERS[: len(keys)])
        if [str(k).strip().upper() for k in keys] != expected:
            raise DataError(f"{where}: choices object keys {keys} must be the letters {expected} in order")
        value = list(value.values())
    if not isinstance(value, list) or not value:
        raise DataError(f"{where}: choices must be a non-empty list of strings (or an object A, B, ...)")
    out = []
    for i, item in enumerate(value):
        text = _as_text(item)
        if text is None or not text.strip():
            raise DataError(f"{where}: choices[{i}] = {item!r} must be a non-empty string")
        out.append(text)
    return tuple(out)


def row_to_problem(row: Any, *, fields: FieldMap, verifier: str, default_id: str, where: str) -> Problem:
    """One decoded JSON row as a :class:`Problem`; :class:`DataError` naming ``where`` when malformed."""
    if not isinstance(row, dict):
        raise DataError(f"{where}: a row must be a JSON object, got {type(row).__name__}")
    question = row.get(fields.question)
    if question is None:
        raise DataError(
            f"{where}: no question field {fields.question!r} (row keys: {sorted(row)}); "
            "set data.fields.question to the key that holds the question"
        )
    if not isinstance(question, str) or not question.strip():
        raise DataError(f"{where}: the question ({fields.question!r}) is empty or not a string: {question!r}")
    if fields.answer not in row:
        raise DataError(
            f"{where}: no answer field {fields.answer!r} (row keys: {sorted(row)}); "
            "set data.fields.answer to the key that holds the gold answer"
        )
    gold = _as_text(row[fields.answer])
    if gold is None or not gold.strip():
        raise DataError(
            f"{where}: the answer ({fields.answer!r}) is empty or not a string or finite number: {row[fields.answer]!r}"
        )
    prompt_id = default_id
    if fields.id is not None and row.get(fields.id) is not None:
        pid = _as_text(row[fields.id])
        if pid is None or not pid.strip():
            raise DataError(
                f"{where}: id ({fields.id!r}) = {row[fields.id]!r} must be a non-empty string or integer"
            )
        prompt_id = pid
    choices: tuple[str, ...] = ()
    if fields.choices is not None and row.get(fields.choices) is not None:
        choices = _choices(row[fields.choices], where)
    family = None
    if fields.family is not None and row.get(fields.family) is not None:
        family = row[fields.family]
        if not isinstance(family, str) or not family.strip():
            raise DataError(f"{where}: family ({fields.family!r}) = {family!r} must be a non-empty string")
    mapped = {fields.question, fields.answer, fields.id, fields.choices, fields.family}
    meta: dict[str, Any] = {}
    for key, value in row.items():
        if key in mapped:
            continue
        if key == "meta" and isinstance(value, dict):
            meta.update(value)
        else:
            meta[key] = value
    try:
        return Problem(prompt_id, question, gold, verifier, choices=choices, family=family, meta=meta)
    except ProblemError as err:
        raise DataError(f"{where}: {err}") from err


def decode_line(raw: bytes, where: str, *, first: bool = False) -> str:
    """One line of a JSONL file as text; :class:`DataError` naming ``where`` (file:line) when it is not
    UTF-8. A byte-order mark at the start of the file (``first``) is dropped."""
    try:
        return raw.decode("utf-8-sig" if first else "utf-8")
    except UnicodeDecodeError as err:
        col = len(raw[: err.start].decode("utf-8-sig" if first else "utf-8", errors="replace")) + 1
        raise DataError(f"{where}: not valid UTF-8 (byte {raw[err.start]:#04x} at column {col}); "
                        "save the file as UTF-8") from err


class _RepeatedKey(Exception):
    """An object of the JSON being read gives a key twice (``json.loads`` keeps the last value silently)."""


def _object_once(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _RepeatedKey(key)
        out[key] = value
    return out


def parse_json(text: str, where: str) -> Any:
    """``text`` (one JSONL line, or a whole ``.json`` file) decoded; :class:`DataError` naming ``where`` when it
    is not JSON, gives a key twice in one object (JSON readers keep the last value silently), or is JSON that
    Python cannot read: an integer of more than ``sys.get_int_max_str_digits()`` digits (4300) or nesting
    deeper than the interpreter's recursion limit."""
    try:
        return json.loads(text, object_pairs_hook=_object_once)
    except _RepeatedKey as err:
        raise DataError(f"{where}: key {err.args[0]!r} is given twice in one object; keep one") from None
    except json.JSONDecodeError as err:
        raise DataError(f"{where}: not valid JSON ({err.msg} at column {err.colno})") from err
    except ValueError as err:  # an integer beyond Python's digit limit
        raise DataError(f"{where}: holds a number too long to read ({str(err).split(';')[0]}); "
                        "write such a value as a string") from err
    except RecursionError as err:
        raise DataError(f"{where}: JSON nested too deeply to read; flatten the row") from err


def load_jsonl(
    config: DataConfig, *, check_gold: Callable[[Problem], str | None] | None = None
) -> LoadReport:
    """Read ``config.path`` into problems (file order). ``check_gold(problem)`` returns ``None`` for a
    usable gold answer or the reason it is not (the verifier's ``check_gold``); such rows are skipped
    with a counted warning. Raises :class:`DataError` for a missing or unreadable file, a directory, an empty
    dataset, or (under ``on_malformed: error``) the first malformed row."""
    path = Path(config.path)
    if path.is_dir():
        raise DataError(f"dataset path {path} is a directory; set data.path to a .jsonl file")
    if not path.is_file():
        raise DataError(f"dataset file {path} not found; check data.path in the config")
    problems: list[Problem] = []
    skipped: list[Skipped] = []
    seen: dict[str, int] = {}
    n_rows = n_blank = 0
    try:
        fh = open(path, "rb")  # noqa: SIM115 - closed by the with below
    except OSError as err:  # unreadable (permissions): not the CLI's "choose a writable location"
        raise DataError(f"cannot read dataset file {path} ({err.strerror}); check data.path and the file's "
                        "permissions") from err
    with fh:
        for lineno, raw in enumerate(fh, start=1):
            if config.limit is not None and len(problems) >= config.limit:
                break
            if not raw.strip():
                n_blank += 1
                continue
            n_rows += 1
            where = f"{path}:{lineno}"
            try:
                row = parse_json(decode_line(raw, where, first=lineno == 1), where)
                problem = row_to_problem(
                    row,
                    fields=config.fields,
                    verifier=config.verifier,
                    default_id=f"{path.stem}:{lineno}",
                    where=where,
                )
                if problem.prompt_id in seen:
                    raise DataError(
                        f"{where}: duplicate id {problem.prompt_id!r} (first on line {seen[problem.prompt_id]}); "
                        "ids must be unique within a dataset"
                    )
                seen[problem.prompt_id] = lineno
            except DataError as err:
                if config.on_malformed == "error":
                    raise
                skipped.append(Skipped(lineno, str(err)))
                log.warning("skipping malformed row: %s", err)
                continue
            reason = check_gold(problem) if check_gold is not None else None
            if reason is not None:
                skipped.append(
                    Skipped(lineno, f"gold answer unusable by verifier {config.verifier!r}: {reason}")
                )
                log.warning(
                    "%s: skipping problem %r: gold answer unusable (%s)", where, problem.prompt_id, reason
                )
                continue
            problems.append(problem)
    if skipped:
        log.warning("%s: skipped %d of %d rows", path, len(skipped), n_rows)
    if not problems:
        raise DataError(
            f"dataset {path} has no usable problems ({n_rows} rows, {len(skipped)} skipped); "
            "check the file and data.fields"
        )
    return LoadReport(str(path), tuple(problems), n_rows, n_blank, tuple(skipped))


def write_jsonl(problems: Iterable[Problem], path: str | Path) -> Path:
    """Write problems as rows of the default schema (loadable with the default :class:`FieldMap`)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with open(p, "w", encoding="utf-8") as fh:
        for problem in problems:
            fh.write(json.dumps(problem.to_row(), ensure_ascii=False) + "\n")
    return p
