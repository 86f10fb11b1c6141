"""The Shared Experience Exchange as a Ray service, backed by the durable on-disk log.

:class:`ExchangeService` wraps :class:`shared_interfaces.exchange.DiskLogExchange`; :func:`start_exchange`
runs it as a Ray actor that Ray restarts on death (``max_restarts=-1``) and whose calls Ray retries
after a restart (``max_task_retries=-1``). A restarted actor replays the log to the state it had.

Records cross actor boundaries only as the record schema's own JSON (:meth:`ExperienceRecord.to_json`)
and are validated on receipt on both sides (:meth:`ExperienceRecord.from_json`): a bad line raises a
:class:`RecordValidationError` naming the producer, nothing is dropped silently.

Exactly once: ``publish`` is idempotent by ``record_id`` (a re-sent identical record is a no-op) and
durable before it returns (``fsync``), so Ray's at-least-once retry across a restart delivers every
record exactly once: a call that died before the write is redone, one that died after it is a no-op,
and a torn last line is truncated on replay and rewritten by the retry.

:class:`RemoteExchange` is the client: an :class:`ExperienceExchange` over an actor handle, so code
written against the SEE contract (the trainer's step functions) runs unchanged on Ray.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from shared_interfaces.exchange import DiskLogExchange, ExperienceExchange
from shared_interfaces.records import ExperienceRecord, PromptGroup, RecordValidationError


def decode_lines(lines: Iterable[str], producer: str) -> list[ExperienceRecord]:
    """Parse and validate JSON record lines received from ``producer``."""
    out = []
    for k, line in enumerate(lines):
        if not isinstance(line, str):
            raise RecordValidationError(
                f"record #{k} from {producer}: expected a JSON string (records cross actors as "
                f"ExperienceRecord.to_json), got {type(line).__name__}"
            )
        try:
            out.append(ExperienceRecord.from_json(line))
        except RecordValidationError as err:
            raise RecordValidationError(f"record #{k} received from {producer}: {err}") from err
    return out


def encode(records: Iterable[ExperienceRecord]) -> list[str]:
    return [r.to_json() for r in records]


class ExchangeService:
    """The actor body: a :class:`DiskLogExchange` whose inputs and outputs are JSON lines."""

    def __init__(self, log_path: str, fsync: bool = True) -> None:
        self.log_path = str(log_path)
        self._ex = DiskLogExchange(log_path, fsync=fsync)
        self.started_with = len(self._ex)  # records replayed from the log at (re)start

    def publish(self, lines: list[str], producer: str = "?") -> int:
        """Validate and add records; returns how many were new. A record is logged as the line it came
        in (it parsed to a valid record), not re-encoded."""
        return self._ex.publish_lines(zip(decode_lines(lines, producer), lines, strict=True))

    def fetch_group(self, prompt_id: str, step: int, requester: str | None = None,
                    include_own: bool = True, max_staleness: int = 0) -> list[str]:
        g = self._ex.fetch_group(prompt_id, step, requester=requester, include_own=include_own,
                                 max_staleness=max_staleness)
        return [self._ex.line(r.record_id) for r in g.records]

    def fetch_groups(self, prompt_ids: list[str], step: int, max_staleness: int = 0, requester: str | None = None,
                     include_own: bool = True) -> dict[str, list[str]]:
        """Many prompt groups in one call (a learner fetches its whole step at once)."""
        return {p: self.fetch_group(p, step, requester, include_own, max_staleness) for p in prompt_ids}

    def records_since(self, start: int) -> list[str]:
        """Records ``start..`` in publication order (a cursor for followers and tests)."""
        return [self._ex.line(r.record_id) for k, r in enumerate(self._ex.records()) if k >= start]

    def record_ids(self) -> list[str]:
        return [r.record_id for r in self._ex.records()]

    def prompt_ids(self, step: int) -> list[str]:
        return self._ex.prompt_ids(step)

    def count(self) -> int:
        return len(self._ex)

    def info(self) -> dict[str, Any]:
        import os

        return {"pid": os.getpid(), "count": len(self._ex), "started_with": self.started_with,
                "log_path": self.log_path}


def start_exchange(log_path: str | Path, *, name: str | None = None, fsync: bool = True,
                   namespace: str | None = None) -> Any:
    """Start the exchange actor (restartable, retried calls, no CPU reserved); returns its handle."""
    import ray

    cls = ray.remote(ExchangeService)
    opts: dict[str, Any] = dict(max_restarts=-1, max_task_retries=-1, num_cpus=0)
    if name is not None:
        opts.update(name=name, lifetime=None)
        if namespace is not None:
            opts["namespace"] = namespace
    return cls.options(**opts).remote(str(log_path), fsync)


class RemoteExchange(ExperienceExchange):
    """The SEE contract over an exchange actor handle (records travel as JSON, validated on receipt)."""

    def __init__(self, handle: Any, *, producer: str = "driver") -> None:
        self.handle = handle
        self.producer = producer

    def publish(self, records: Iterable[ExperienceRecord]) -> int:
        import ray

        return ray.get(self.handle.publish.remote(encode(records), self.producer))

    def fetch_group(self, prompt_id: str, step: int, *, requester: str | None = None,
                    include_own: bool = True, max_staleness: int = 0) -> PromptGroup:
        import ray

        lines = ray.get(self.handle.fetch_group.remote(prompt_id, step, requester, include_own, max_staleness))
        return PromptGroup(prompt_id, step, tuple(decode_lines(lines, "exchange")))

    def fetch_groups(self, prompt_ids: Sequence[str], step: int, *, requester: str | None = None,
                     include_own: bool = True, max_staleness: int = 0) -> dict[str, PromptGroup]:
        import ray

        got = ray.get(self.handle.fetch_groups.remote(list(prompt_ids), step, max_staleness, requester, include_own))
        return {p: PromptGroup(p, step, tuple(decode_lines(got[p], "exchange"))) for p in prompt_ids}

    def records(self) -> Iterator[ExperienceRecord]:
        import ray

        return iter(decode_lines(ray.get(self.handle.records_since.remote(0)), "exchange"))

    def prompt_ids(self, step: int) -> list[str]:
        import ray

        return ray.get(self.handle.prompt_ids.remote(step))

    def __len__(self) -> int:
        import ray

        return ray.get(self.handle.count.remote())
