"""Run a checker in a child process with a per-request deadline, from any thread.

math-verify's own timeout uses ``signal.alarm``, which only works in the main thread, and a Python
thread cannot be stopped (a sympy computation on a huge integer holds the GIL inside C for minutes).
So the checker runs in a child process (:class:`DeadlineWorker`) that speaks JSON lines over pipes:
the parent waits for each reply with ``select`` until a deadline, and on a timeout kills the child and
starts a fresh one for the next request. The child is a plain script run with ``sys.executable`` (no
``multiprocessing``: no pickling, no re-import of ``__main__``, safe to start from any thread or a Ray
actor). As a second guard against an orphaned, runaway child, each request carries ``kill_after_s``:
the child arms ``SIGALRM`` with the default (terminate) action, which the kernel delivers even while
the interpreter is stuck in C.

:class:`WorkerPool` holds ``n`` workers; :meth:`WorkerPool.request` is thread-safe (a caller checks
out one worker for the duration of its request).
"""

from __future__ import annotations

import json
import os
import queue
import select
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path
from typing import Any


class WorkerTimeout(Exception):
    """The request ran past its deadline; the worker was killed (a fresh one starts on the next request)."""


class WorkerFailed(RuntimeError):
    """The worker died or answered garbage; it was discarded (a fresh one starts on the next request)."""


def _kill(holder: dict[str, Any]) -> None:
    proc = holder.get("proc")
    holder["proc"] = None
    if proc is None:
        return
    if proc.poll() is None:
        proc.kill()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:  # pragma: no cover - a killed process that will not die
        pass
    for stream in (proc.stdin, proc.stdout):
        if stream is not None:
            stream.close()


class DeadlineWorker:
    """One child process running ``script``; ``request(payload, timeout_s)`` returns its JSON reply."""

    def __init__(self, script: str | Path, *, startup_timeout_s: float = 120.0, kill_grace_s: float = 5.0):
        self.script = str(script)
        self.startup_timeout_s = startup_timeout_s
        self.kill_grace_s = kill_grace_s
        self.starts = 0
        self._holder: dict[str, Any] = {"proc": None}
        self._buf = b""
        self._next_id = 0
        self._lock = threading.Lock()
        self._finalizer = weakref.finalize(self, _kill, self._holder)

    @property
    def pid(self) -> int | None:
        proc = self._holder["proc"]
        return proc.pid if proc is not None else None

    def _start(self) -> None:
        proc = subprocess.Popen(
            [sys.executable, "-u", self.script],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=None,
            close_fds=True,
        )
        self._holder["proc"] = proc
        self._buf = b""
        self.starts += 1
        try:
            ready = self._read_line(time.monotonic() + self.startup_timeout_s)
        except WorkerTimeout as err:
            _kill(self._holder)
            raise WorkerFailed(
                f"checker worker {self.script} did not start within {self.startup_timeout_s} s "
                "(is math-verify installed? pip install 'mutual-rl[llm]')"
            ) from err
        if ready.get("ready") is not True:
            _kill(self._holder)
            raise WorkerFailed(f"checker worker {self.script} sent {ready!r} instead of its ready line")

    def _read_line(self, deadline: float) -> dict[str, Any]:
        proc = self._holder["proc"]
        fd = proc.stdout.fileno()
        while b"\n" not in self._buf:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise WorkerTimeout("deadline passed")
            readable, _, _ = select.select([fd], [], [], remaining)
            if not readable:
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                code = proc.poll()
                _kill(self._holder)
                raise WorkerFailed(f"checker worker exited (code {code}); see its stderr above")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        try:
            return json.loads(line)
        except json.JSONDecodeError as err:
            _kill(self._holder)
            raise WorkerFailed(f"checker worker sent a line that is not JSON: {line[:200]!r}") from err

    def request(self, payload: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """Send ``payload`` and wait up to ``timeout_s`` seconds for the reply (starting the worker first
        if needed; start-up is not counted against ``timeout_s``). Raises :class:`WorkerTimeout` or
        :class:`WorkerFailed`; either way the worker is replaced on the next request."""
        with self._lock:
            if self._holder["proc"] is None or self._holder["proc"].poll() is not None:
                _kill(self._holder)
                self._start()
            self._next_id += 1
            msg = dict(payload, id=self._next_id, kill_after_s=timeout_s + self.kill_grace_s)
            proc = self._holder["proc"]
            try:
                proc.stdin.write((json.dumps(msg) + "\n").encode("utf-8"))
                proc.stdin.flush()
            except (BrokenPipeError, OSError) as err:
                _kill(self._holder)
                raise WorkerFailed(f"checker worker is gone ({err})") from err
            try:
                reply = self._read_line(time.monotonic() + timeout_s)
            except WorkerTimeout:
                _kill(self._holder)
                raise
            if reply.get("id") != self._next_id:
                _kill(self._holder)
                raise WorkerFailed(f"checker worker replied to request {reply.get('id')} instead of {self._next_id}")
            return reply

    def close(self) -> None:
        with self._lock:
            _kill(self._holder)


class WorkerPool:
    """``n`` :class:`DeadlineWorker` s over one script; thread-safe; workers start lazily."""

    def __init__(self, script: str | Path, n: int = 1, *, startup_timeout_s: float = 120.0):
        if n < 1:
            raise ValueError(f"a worker pool needs n >= 1 workers, got {n}")
        self.workers = [DeadlineWorker(script, startup_timeout_s=startup_timeout_s) for _ in range(n)]
        self._free: queue.Queue[DeadlineWorker] = queue.Queue()
        for w in self.workers:
            self._free.put(w)

    def request(self, payload: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        worker = self._free.get()
        try:
            return worker.request(payload, timeout_s)
        finally:
            self._free.put(worker)

    @property
    def starts(self) -> int:
        """Worker processes started so far (1 per worker, plus one per restart after a timeout/crash)."""
        return sum(w.starts for w in self.workers)

    def close(self) -> None:
        for w in self.workers:
            w.close()
