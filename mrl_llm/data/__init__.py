"""Datasets: the typed :class:`Problem`, JSONL loading with a field mapping, and the resumable
per-step prompt cursor."""

from mrl_llm.data.cursor import DataCursor, epoch_order, fingerprint
from mrl_llm.data.jsonl import (
    DataConfig,
    DataError,
    FieldMap,
    LoadReport,
    Skipped,
    load_jsonl,
    row_to_problem,
    write_jsonl,
)
from mrl_llm.data.problem import CHOICE_LETTERS, Problem, ProblemError, format_choices

__all__ = [
    "CHOICE_LETTERS",
    "DataConfig",
    "DataCursor",
    "DataError",
    "FieldMap",
    "LoadReport",
    "Problem",
    "ProblemError",
    "Skipped",
    "epoch_order",
    "fingerprint",
    "format_choices",
    "load_jsonl",
    "row_to_problem",
    "write_jsonl",
]
