"""A run directory is owned by one process (:class:`mrl_llm.rundir.RunDirLock`): a second ``train`` or ``--resume``
on a directory another process holds is refused with the holder's pid and host, before anything there is
written or removed; the OS releases the lock when the holder is killed (``kill -9``)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mrl_llm.cli import one_line
from mrl_llm.config import config_from_mapping
from mrl_llm.rundir import LOCK_FILE, RunDirLock, RunDirLockedError, check_run_dir
from mrl_llm.trainer import train
from shared_interfaces.config_io import to_mapping

ROOT = Path(__file__).resolve().parents[2]
#: a process that holds ``argv[1]``'s lock until it is killed (fcntl only: no torch import, so it starts fast)
HOLDER = """
import fcntl, json, os, socket, sys, time
from pathlib import Path
out = Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
fd = os.open(out / sys.argv[2], os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
os.ftruncate(fd, 0)
os.pwrite(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname()}).encode(), 0)
print("locked", flush=True)
time.sleep(600)
"""


def _cfg():
    return config_from_mapping({"policies": [{"name": "a", "model_config": {"model_type": "llama"},
                                              "tokenizer_dir": "utf8-bytes"}]})


def _hold(out: Path, *, real: bool = True) -> subprocess.Popen:
    """A process holding ``out``'s lock: through :class:`RunDirLock` itself (``real``), or the bare ``flock`` protocol."""
    if real:
        code = ("import sys, time\nfrom mrl_llm.rundir import RunDirLock\nwith RunDirLock(sys.argv[1]):\n"
                "    print('locked', flush=True)\n    time.sleep(600)\n")
        args = [sys.executable, "-c", code, str(out)]
    else:
        args = [sys.executable, "-c", HOLDER, str(out), LOCK_FILE]
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
    return proc


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=30)


def test_a_second_train_or_resume_on_a_held_directory_is_refused_with_the_holders_pid_and_host(tmp_path):
    out = tmp_path / "run"
    holder = _hold(out)
    try:
        who = f"pid {holder.pid} on host {socket.gethostname()}"
        with pytest.raises(RunDirLockedError, match=f"is in use by another run \\({who}\\)") as err:
            train(_cfg(), out)  # a new run into the held (empty) directory
        assert "\n" not in one_line(err.value) and isinstance(err.value, FileExistsError)  # the CLI's one line
        assert sorted(p.name for p in out.iterdir()) == [LOCK_FILE]  # nothing written, nothing removed
        (out / "config.json").write_text(json.dumps(to_mapping(_cfg())))  # the holder's run, as a resume sees it
        (out / "metrics.jsonl").write_text('{"kind": "train", "step": 0, "policy": "a"}\n')
        check_run_dir(_cfg(), out, resume=True)  # a resumable directory but for the lock
        with pytest.raises(RunDirLockedError, match=who):
            train(_cfg(), out, resume=True)
        assert (out / "metrics.jsonl").read_text() == '{"kind": "train", "step": 0, "policy": "a"}\n'  # not cut back
        with pytest.raises(RunDirLockedError, match=who), RunDirLock(out):
            pass
    finally:
        _stop(holder)


def test_the_lock_is_released_when_its_holder_is_killed(tmp_path):
    out = tmp_path / "run"
    holder = _hold(out)
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait(timeout=30)
    deadline = time.monotonic() + 10
    while True:  # the OS drops a dead process's flock as it reaps it
        try:
            with RunDirLock(out) as lock:
                assert json.loads((out / LOCK_FILE).read_text()) == {"pid": os.getpid(), "host": socket.gethostname()}
                assert lock.fd is not None
            break
        except RunDirLockedError:
            assert time.monotonic() < deadline, "the killed holder's lock was not released"
            time.sleep(0.1)
    with RunDirLock(out), pytest.raises(RunDirLockedError, match=f"pid {os.getpid()}"), RunDirLock(out):
        pass  # one process, two opens: the second is refused too (flock is per open file)


def test_a_lock_file_without_a_holder_is_an_empty_directory_and_a_lock_being_written_is_named(tmp_path):
    out = tmp_path / "run"
    with RunDirLock(out):
        pass
    check_run_dir(_cfg(), out, resume=False)  # a stale lock file alone: still an empty directory for a new run
    holder = _hold(tmp_path / "bare", real=False)
    try:
        os.truncate(tmp_path / "bare" / LOCK_FILE, 0)  # held, its pid not written yet
        with pytest.raises(RunDirLockedError, match="a process that has not written its pid yet"), \
                RunDirLock(tmp_path / "bare"):
            pass
    finally:
        _stop(holder)
