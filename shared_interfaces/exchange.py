"""The Shared Experience Exchange (SEE) contract and its two local implementations.

Contract (every implementation, including the Ray service, keeps it):

* ``publish(records)`` adds records; it is idempotent by ``record_id``: re-publishing an identical
  record is a no-op, publishing a *different* record under an existing id is an error.
* ``fetch_group(prompt_id, step, requester=..., include_own=...)`` returns a :class:`PromptGroup`
  of that prompt's rollout records for that step, in canonical order (policy id, sample index,
  record id), with or without the requester's own records. ``max_staleness=k`` widens the window to
  steps ``step - k .. step`` (bounded-staleness asynchronous training; k = 0 is synchronous).
  ``fetch_groups(prompt_ids, step, ...)`` is the same for many prompts at once.
* Records are validated on the way in (they are :class:`ExperienceRecord` instances, validated at
  construction; the on-disk log re-validates every line it replays).

:class:`InMemoryExchange` keeps records in a dict. :class:`DiskLogExchange` adds an append-only JSON
lines log; a restarted process that opens the same path replays it to the same state. A torn last
line (a crash mid-write) is dropped and truncated away on open, with a warning.
"""

from __future__ import annotations

import abc
import os
import threading
import warnings
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from shared_interfaces.records import ExperienceRecord, PromptGroup, RecordValidationError


class ExchangeConflictError(ValueError):
    """A record id was published twice with different contents."""


class ExperienceExchange(abc.ABC):
    """Abstract SEE: publish and fetch typed experience records."""

    @abc.abstractmethod
    def publish(self, records: Iterable[ExperienceRecord]) -> int:
        """Add records; return how many were new (re-published identical records do not count)."""

    @abc.abstractmethod
    def fetch_group(
        self,
        prompt_id: str,
        step: int,
        *,
        requester: str | None = None,
        include_own: bool = True,
        max_staleness: int = 0,
    ) -> PromptGroup:
        """Rollout records of ``prompt_id`` for steps ``step - max_staleness .. step``."""

    def fetch_groups(
        self,
        prompt_ids: Sequence[str],
        step: int,
        *,
        requester: str | None = None,
        include_own: bool = True,
        max_staleness: int = 0,
    ) -> dict[str, PromptGroup]:
        """:meth:`fetch_group` for each of ``prompt_ids`` (a service answers them in one call)."""
        return {p: self.fetch_group(p, step, requester=requester, include_own=include_own,
                                    max_staleness=max_staleness) for p in prompt_ids}

    @abc.abstractmethod
    def records(self) -> Iterator[ExperienceRecord]:
        """All records in publication order."""

    @abc.abstractmethod
    def __len__(self) -> int: ...

    def prompt_ids(self, step: int) -> list[str]:
        """Prompt ids that have at least one record at ``step``, sorted."""
        return sorted({r.prompt_id for r in self.records() if r.step == step})


class InMemoryExchange(ExperienceExchange):
    """A thread-safe in-process exchange."""

    def __init__(self) -> None:
        self._by_id: dict[str, ExperienceRecord] = {}
        self._order: list[str] = []
        self._index: dict[tuple[str, int], list[str]] = defaultdict(list)
        self._lock = threading.RLock()

    def _new(self, records: Iterable[ExperienceRecord]) -> list[ExperienceRecord]:
        """The records of a batch that are not published yet (first occurrence of each id), after checking
        the whole batch: a non-record or an id already held (here or earlier in the batch) with different
        contents raises before anything is added, so a refused publish leaves the exchange as it was."""
        batch: dict[str, ExperienceRecord] = {}
        for record in records:
            if not isinstance(record, ExperienceRecord):
                raise TypeError(f"publish() takes ExperienceRecord objects, got {type(record).__name__}")
            existing = self._by_id.get(record.record_id) or batch.get(record.record_id)
            if existing is None:
                batch[record.record_id] = record
            elif existing != record:
                raise ExchangeConflictError(
                    f"record id {record.record_id!r} (policy {record.policy_id!r}) was already published "
                    "with different contents; record ids must be unique per rollout"
                )
        return list(batch.values())

    def _insert(self, record: ExperienceRecord) -> None:
        self._by_id[record.record_id] = record
        self._order.append(record.record_id)
        self._index[(record.prompt_id, record.step)].append(record.record_id)

    def _add(self, record: ExperienceRecord) -> bool:
        new = self._new([record])
        if new:
            self._insert(record)
        return bool(new)

    def publish(self, records: Iterable[ExperienceRecord]) -> int:
        """Add ``records`` all or none (a refused batch adds nothing); returns how many were new."""
        with self._lock:
            new = self._new(records)
            for r in new:
                self._insert(r)
            return len(new)

    def fetch_group(
        self,
        prompt_id: str,
        step: int,
        *,
        requester: str | None = None,
        include_own: bool = True,
        max_staleness: int = 0,
    ) -> PromptGroup:
        if max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
        if not include_own and requester is None:
            raise ValueError("include_own=False needs the requester's policy id")
        with self._lock:
            out = []
            for s in range(max(0, step - max_staleness), step + 1):
                for rid in self._index.get((prompt_id, s), ()):
                    rec = self._by_id[rid]
                    if include_own or rec.policy_id != requester:
                        out.append(rec)
        return PromptGroup(prompt_id=prompt_id, step=step, records=tuple(out))

    def records(self) -> Iterator[ExperienceRecord]:
        with self._lock:
            order = list(self._order)
        return (self._by_id[rid] for rid in order)

    def get(self, record_id: str) -> ExperienceRecord | None:
        return self._by_id.get(record_id)

    def __len__(self) -> int:
        return len(self._order)


class DiskLogExchange(InMemoryExchange):
    """An :class:`InMemoryExchange` backed by an append-only JSON lines log at ``path``.

    Opening an existing log replays it (each line re-validated) to the state the writer had.
    One process writes a log at a time (under Ray the exchange actor is that process).
    ``fsync=True`` makes every ``publish`` durable before it returns.
    """

    def __init__(self, path: str | os.PathLike[str], *, fsync: bool = True) -> None:
        super().__init__()
        self._lines: dict[str, str] = {}  # record id -> its line in the log (the canonical JSON)
        self.path = Path(path)
        self.fsync = fsync
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._replay()
        self._fh = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - held for the lifetime

    def _replay(self) -> None:
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        good_end = data.rfind(b"\n") + 1
        if good_end < len(data):
            warnings.warn(
                f"exchange log {self.path}: dropping a torn last line of {len(data) - good_end} bytes "
                "(the writer stopped mid-record)",
                stacklevel=3,
            )
            with open(self.path, "r+b") as fh:
                fh.truncate(good_end)
        # split on "\n" only: str.splitlines() also breaks at U+0085, U+2028, U+2029 ..., which the
        # JSON of a record (ensure_ascii=False) carries raw when a response contains them
        try:
            text = data[:good_end].decode("utf-8")
        except UnicodeDecodeError as err:
            line_no = data.count(b"\n", 0, err.start) + 1
            raise RecordValidationError(f"exchange log {self.path}, line {line_no}: byte {err.start} is not UTF-8 "
                                        "(the log is corrupt: restore it from a backup)") from err
        for lineno, line in enumerate(text.split("\n"), start=1):
            if not line.strip():
                continue
            try:
                rec = ExperienceRecord.from_json(line)
                added = self._add(rec)
            except (RecordValidationError, ExchangeConflictError) as err:
                raise type(err)(f"exchange log {self.path}, line {lineno}: {err}") from err
            if added:
                self._lines[rec.record_id] = line

    def publish(self, records: Iterable[ExperienceRecord]) -> int:
        return self.publish_lines([(r, None) for r in records])

    def publish_lines(self, items: Iterable[tuple[ExperienceRecord, str | None]]) -> int:
        """:meth:`publish` of ``(record, line)`` pairs where ``line`` is the JSON the record was parsed
        from (a service receives records as JSON): a one-line ``line`` is logged as it is instead of
        re-encoding the record; None (or a line holding a newline) logs ``record.to_json()``."""
        with self._lock:
            items = list(items)
            new = self._new(r for r, _ in items)  # all or none: a refused batch adds nothing, logs nothing
            given = {}
            for r, line in items:
                given.setdefault(r.record_id, line)
            lines = [line if (line := given[r.record_id]) is not None and "\n" not in line else r.to_json()
                     for r in new]
            if new:  # logged first: a failed write leaves memory as it was (a retry rewrites the batch)
                self._fh.write("".join(line + "\n" for line in lines))
                self._fh.flush()
                if self.fsync:
                    os.fsync(self._fh.fileno())
                for r in new:
                    self._insert(r)
                self._lines.update(zip((r.record_id for r in new), lines, strict=True))
            return len(new)

    def line(self, record_id: str) -> str:
        """The record's line in the log: :meth:`ExperienceRecord.to_json`, serialised once at publication
        (a service that hands records on as JSON reuses it instead of re-encoding)."""
        return self._lines[record_id]

    def close(self) -> None:
        with self._lock:
            if not self._fh.closed:
                self._fh.close()

    def __enter__(self) -> DiskLogExchange:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:
            pass
