"""A local Ray cluster that does not outlive the driver that started it.

``ray.init()`` without an address starts a cluster for this process: ``gcs_server``, the ``raylet``, the dashboard
head, the log and autoscaler monitors, and the raylet's agents (``ray::DashboardAgent``, ``ray::RuntimeEnvAgent``).
Ray ties the head processes to the driver, but a driver killed with ``kill -9`` leaves the agents running (re-parented
to init, for good). :func:`watch_local_cluster`, called right after such a ``ray.init``, starts a **watchdog**: a
small process of its own session (no terminal signal reaches it) that waits for the driver to end — its pipe from
the driver closes (the driver died, however, or called :meth:`ClusterWatchdog.close` after ``ray.shutdown``) or its
parent changes — and then kills every process of the cluster's session: each whose command line names the session
directory, and each Ray process (``ray::...`` or a program under a ``ray`` package directory) that holds a file open
in it (the agents rename themselves, but keep their logs open there). SIGTERM first, SIGKILL after
:data:`GRACE_S`. A process of another user, or one that is not Ray's (a second driver attached to the cluster), is
never touched. Linux only (``/proc``); elsewhere nothing is started.

Both backends call it where they start a local cluster (``mrl_llm train --runtime ray``, ``bandit_sim sweep
--runtime ray``); a cluster joined by address is not theirs and is not watched. This file runs as the watchdog
(``python ray_local.py SESSION_DIR DRIVER_PID``) with the standard library only.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

#: Seconds the session's processes get between SIGTERM and SIGKILL.
GRACE_S = 3.0
#: How often the watchdog checks that its parent is still the driver (seconds).
POLL_S = 0.5


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def _holds_file_in(pid: int, root: str) -> bool:
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(root):
                return True
        except OSError:
            continue
    return False


def _is_ray(argv: list[str]) -> bool:
    """Whether a command line is a Ray process's: a renamed worker or agent (``ray::...``), or a program of a ``ray``
    package (``.../ray/core/src/ray/raylet/raylet``, ``python .../ray/dashboard/agent.py``)."""
    return bool(argv) and (argv[0].startswith("ray::") or any("/ray/" in a for a in argv[:3]))


def session_processes(session_dir: str | Path, *, exclude: set[int] | frozenset[int] = frozenset()) -> list[int]:
    """The pids of this user's processes that belong to the Ray session ``session_dir`` (module docstring), other
    than ``exclude``; empty when there are none (or no ``/proc``)."""
    roots = {str(session_dir), os.path.realpath(session_dir)}  # as Ray's command lines name it, and as /proc does
    uid = os.getuid()
    out = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for e in entries:
        if not e.isdigit() or int(e) in exclude or int(e) == os.getpid():
            continue
        pid = int(e)
        try:
            if os.stat(f"/proc/{pid}").st_uid != uid:
                continue
        except OSError:
            continue
        argv = _cmdline(pid)
        if any(r in a for r in roots for a in argv) or (
                _is_ray(argv) and any(_holds_file_in(pid, r + os.sep) for r in roots)):
            out.append(pid)
    return sorted(out)


def kill_session(session_dir: str | Path, *, exclude: set[int] | frozenset[int] = frozenset(),
                 grace_s: float = GRACE_S) -> list[int]:
    """SIGTERM the session's processes (:func:`session_processes`), SIGKILL those left after ``grace_s``; returns
    the pids signalled (empty: none was left)."""
    pids = session_processes(session_dir, exclude=exclude)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace_s
    left = pids
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = [p for p in left if _alive(p)]
    for pid in [*left, *session_processes(session_dir, exclude=exclude)]:  # and any started meanwhile
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return pids


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


class ClusterWatchdog:
    """The watchdog process of one local cluster (module docstring); :meth:`close` after ``ray.shutdown``."""

    def __init__(self, session_dir: str | Path) -> None:
        self.session_dir = str(session_dir)
        self.proc: subprocess.Popen | None = subprocess.Popen(
            [sys.executable, "-I", os.path.abspath(__file__), self.session_dir, str(os.getpid())],  # stdlib only
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
            close_fds=True)

    def close(self, timeout_s: float = 30.0) -> None:
        """The driver is done with the cluster (after ``ray.shutdown()``): the watchdog kills what is left of the
        session and exits; waits for it up to ``timeout_s``. A second call does nothing."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def watch_local_cluster() -> ClusterWatchdog | None:
    """Start the watchdog of the local cluster ``ray.init`` has just started in this process (module docstring);
    None where there is nothing to watch (a cluster joined, not started: Ray's node started no process here) or no
    way to (no ``/proc``; a Ray without the node's session directory)."""
    import ray

    if not os.path.isdir("/proc/self/fd"):
        return None
    try:
        node = ray._private.worker._global_node  # Ray's own record of the node this driver started or joined
        started, session = bool(node.all_processes), node.get_session_dir_path()
    except AttributeError:
        return None
    return ClusterWatchdog(session) if started and session else None


def _watch(session_dir: str, driver: int) -> None:
    """The watchdog's body: wait for the driver to end, then clear the session."""
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):  # the clean-up must run
        signal.signal(sig, signal.SIG_IGN)
    stdin = sys.stdin.fileno()
    while os.getppid() == driver:
        ready, _, _ = select.select([stdin], [], [], POLL_S)
        if ready and not os.read(stdin, 4096):  # EOF: the driver closed the pipe or died
            break
    kill_session(session_dir, exclude={driver} if _alive(driver) else set())


if __name__ == "__main__":
    _watch(sys.argv[1], int(sys.argv[2]))
