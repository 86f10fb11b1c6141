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

Pipelined publishing: a policy actor does not wait for its publish to be written
(:meth:`RemoteExchange.publish_async`); a learner's ``fetch_groups(..., expect={peer: n})`` waits in
the service until each peer's ``n`` records of the step are in (a peer whose publish of that step was
refused is not waited for). The service is a threaded actor, so publishes land while fetches wait.
A peer that never delivers (it died between sampling and publishing) is given up after
``wait_timeout_s``, with a warning; its records are then simply absent from that step.

:class:`RemoteExchange` is the client: an :class:`ExperienceExchange` over an actor handle, so code
written against the SEE contract (the trainer's step functions) runs unchanged on Ray. The policy actors get it
by the exchange actor's name (:meth:`RemoteExchange.named`), not with a handle inside their constructor
arguments: Ray does not count a handle nested in an actor's constructor arguments for that actor's restarts
(ray-project/ray#53727; it logs an error for every such actor), and a name is resolved again by the restarted
actor.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from shared_interfaces.exchange import DiskLogExchange, ExchangeConflictError, ExperienceExchange
from shared_interfaces.records import ExperienceRecord, PromptGroup, RecordValidationError, make_record_id


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


log = logging.getLogger("mrl_llm.exchange")


class ExchangeService:
    """The actor body: a :class:`DiskLogExchange` whose inputs and outputs are JSON lines."""

    def __init__(self, log_path: str, fsync: bool = True, wait_timeout_s: float = 120.0) -> None:
        self.log_path = str(log_path)
        self.wait_timeout_s = wait_timeout_s
        self._ex = DiskLogExchange(log_path, fsync=fsync)
        self.started_with = len(self._ex)  # records replayed from the log at (re)start
        self._arrived = threading.Condition()
        self._counts: Counter[tuple[str, int]] = Counter((r.policy_id, r.step) for r in self._ex.records())
        self._refused: set[tuple[str, int]] = set()  # (producer, step) of refused publishes

    def publish(self, lines: list[str], producer: str = "?", step: int | None = None) -> int:
        """Validate and add records; returns how many were new. A record is logged as the line it came
        in (it parsed to a valid record), not re-encoded. ``step``: the step the lines are from (a
        refused publish then releases the fetches waiting for it). With ``step``, every record must be
        ``producer``'s of that step (the fetches wait for ``(producer, step)``); a record of another policy or
        step, a record id that is not :func:`~shared_interfaces.records.make_record_id`'s, an invalid line and a
        record id already published with other contents refuse the whole publish."""
        try:
            recs = decode_lines(lines, producer)
            if step is not None:
                other = next((r for r in recs if (r.policy_id, r.step) != (producer, step)), None)
                if other is not None:
                    raise RecordValidationError(
                        f"publish from {producer} for step {step} holds record {other.record_id!r} of policy "
                        f"{other.policy_id!r}, step {other.step}: a policy publishes only its own records of the step")
                odd = next((r for r in recs if r.record_id != make_record_id(r.policy_id, r.step, r.prompt_id,
                                                                             r.sample_index)), None)
                if odd is not None:  # one sample under two ids would count twice in the pooled statistics
                    raise RecordValidationError(
                        f"publish from {producer}: record id {odd.record_id!r} is not the canonical "
                        f"{make_record_id(odd.policy_id, odd.step, odd.prompt_id, odd.sample_index)!r} "
                        "(policy/step/prompt/sample); build ids with shared_interfaces.records.make_record_id")
            with self._arrived:
                fresh = {r.record_id: r for r in recs if self._ex.get(r.record_id) is None}
                new = self._ex.publish_lines(zip(recs, lines, strict=True))
                self._counts.update((r.policy_id, r.step) for r in fresh.values())
                self._arrived.notify_all()
        except (RecordValidationError, ExchangeConflictError):
            if step is not None:
                with self._arrived:
                    self._refused.add((producer, step))
                    self._arrived.notify_all()
            raise
        return new

    def count(self, policy_id: str | None = None, step: int | None = None) -> int:
        """All records, or those of ``policy_id`` at ``step``."""
        if policy_id is None:
            return len(self._ex)
        return self._counts[(policy_id, step)]

    def _wait_for(self, step: int, expect: Mapping[str, int]) -> None:
        """Block until each producer in ``expect`` has that many records of ``step`` here (or had its
        publish of ``step`` refused), at most ``wait_timeout_s``."""
        deadline = time.monotonic() + self.wait_timeout_s
        with self._arrived:
            while True:
                missing = {p: n - self._counts[(p, step)] for p, n in expect.items()
                           if self._counts[(p, step)] < n and (p, step) not in self._refused}
                left = deadline - time.monotonic()
                if not missing:
                    return
                if left <= 0:
                    log.warning("step %d: gave up waiting %.0f s for records %s (missing counts by producer); "
                                "fetching without them", step, self.wait_timeout_s, missing)
                    return
                self._arrived.wait(left)

    def fetch_group(self, prompt_id: str, step: int, requester: str | None = None,
                    include_own: bool = True, max_staleness: int = 0) -> list[str]:
        g = self._ex.fetch_group(prompt_id, step, requester=requester, include_own=include_own,
                                 max_staleness=max_staleness)
        return [self._ex.line(r.record_id) for r in g.records]

    def fetch_groups(self, prompt_ids: list[str], step: int, max_staleness: int = 0, requester: str | None = None,
                     include_own: bool = True, expect: Mapping[str, int] | None = None) -> dict[str, list[str]]:
        """Many prompt groups in one call (a learner fetches its whole step at once), after the
        ``expect``-ed records of ``step`` have arrived (module docstring)."""
        if expect:
            self._wait_for(step, expect)
        return {p: self.fetch_group(p, step, requester, include_own, max_staleness) for p in prompt_ids}

    def records_since(self, start: int) -> list[str]:
        """Records ``start..`` in publication order (a cursor for followers and tests)."""
        return [self._ex.line(r.record_id) for k, r in enumerate(self._ex.records()) if k >= start]

    def digest(self, max_step: int) -> tuple[int, str]:
        """``(n, sha256)`` of the log lines of the records with ``step <= max_step``, in log order
        (:func:`mrl_llm.runstate.lines_digest`): what a checkpoint at ``max_step`` stores of the log."""
        from mrl_llm.runstate import lines_digest

        with self._arrived:
            lines = [self._ex.line(r.record_id) for r in self._ex.records() if r.step <= max_step]
        return lines_digest(lines)

    def record_ids(self) -> list[str]:
        return [r.record_id for r in self._ex.records()]

    def prompt_ids(self, step: int) -> list[str]:
        return self._ex.prompt_ids(step)

    def info(self) -> dict[str, Any]:
        import os

        return {"pid": os.getpid(), "count": len(self._ex), "started_with": self.started_with,
                "log_path": self.log_path}


def start_exchange(log_path: str | Path, *, name: str | None = None, fsync: bool = True,
                   namespace: str | None = None, wait_timeout_s: float = 120.0, max_concurrency: int = 32) -> Any:
    """Start the exchange actor (restartable, retried calls, no CPU reserved, ``max_concurrency``
    threads so publishes land while fetches wait); returns its handle."""
    import ray

    cls = ray.remote(ExchangeService)
    opts: dict[str, Any] = dict(max_restarts=-1, max_task_retries=-1, num_cpus=0, max_concurrency=max_concurrency)
    if name is not None:
        opts.update(name=name, lifetime=None)
        if namespace is not None:
            opts["namespace"] = namespace
    return cls.options(**opts).remote(str(log_path), fsync, wait_timeout_s)


class RemoteExchange(ExperienceExchange):
    """The SEE contract over an exchange actor handle (records travel as JSON, validated on receipt)."""

    def __init__(self, handle: Any, *, producer: str = "driver", name: str | None = None,
                 namespace: str | None = None) -> None:
        if handle is None and not name:
            raise ValueError("RemoteExchange needs the exchange actor's handle (start_exchange's return) or its name "
                             "(RemoteExchange.named, after start_exchange(name=...))")
        self._handle = handle
        self.producer = producer
        self.name = name or None  # named(): the handle is looked up, and not pickled
        self.namespace = namespace

    @classmethod
    def named(cls, name: str, namespace: str | None, *, producer: str) -> RemoteExchange:
        """The client of the exchange actor named ``name`` in Ray ``namespace``, looked up on first use in the
        process that uses it (module docstring)."""
        return cls(None, producer=producer, name=name, namespace=namespace)

    @property
    def handle(self) -> Any:
        if self._handle is None:
            import ray

            try:
                self._handle = ray.get_actor(self.name, namespace=self.namespace)
            except ValueError as err:
                raise RuntimeError(f"the experience exchange actor {self.name!r} (Ray namespace {self.namespace!r}) "
                                   "is gone: the run's driver ended or killed it; restart the run (--resume)") from err
        return self._handle

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        if self.name is not None:
            state["_handle"] = None  # looked up again by name where it lands
        return state

    def publish(self, records: Iterable[ExperienceRecord]) -> int:
        import ray

        return ray.get(self.handle.publish.remote(encode(records), self.producer))

    def publish_async(self, records: Iterable[ExperienceRecord], step: int) -> Any:
        """Send ``step``'s records without waiting for the write; returns the call's ObjectRef (its
        ``ray.get`` is the number of new records, or the validation error)."""
        return self.handle.publish.remote(encode(records), self.producer, step)

    def fetch_group(self, prompt_id: str, step: int, *, requester: str | None = None,
                    include_own: bool = True, max_staleness: int = 0) -> PromptGroup:
        import ray

        lines = ray.get(self.handle.fetch_group.remote(prompt_id, step, requester, include_own, max_staleness))
        return PromptGroup(prompt_id, step, tuple(decode_lines(lines, "exchange")))

    def fetch_groups(self, prompt_ids: Sequence[str], step: int, *, requester: str | None = None,
                     include_own: bool = True, max_staleness: int = 0,
                     expect: Mapping[str, int] | None = None) -> dict[str, PromptGroup]:
        """The SEE ``fetch_groups``; ``expect={producer: n}`` first waits in the service for those
        records of ``step`` (pipelined publishing, module docstring)."""
        import ray

        got = ray.get(self.handle.fetch_groups.remote(list(prompt_ids), step, max_staleness, requester, include_own,
                                                      dict(expect) if expect else None))
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
