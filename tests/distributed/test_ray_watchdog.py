"""A local Ray cluster does not outlive the driver that started it (:mod:`shared_interfaces.ray_local`): after the
driver is killed with ``kill -9`` no process of its cluster is left (Ray's dashboard and runtime-env agents were);
the watchdog's own mechanism (a session's processes found and killed when the driver dies or closes it) without
Ray; nothing found for a session that has no process."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from shared_interfaces.ray_local import ClusterWatchdog, kill_session, session_processes

ROOT = Path(__file__).resolve().parents[2]


def _mine(tmp: str) -> list[tuple[int, str]]:
    """This user's processes tied to ``tmp`` by their environment (``RAY_TMPDIR``, inherited by every process of
    the cluster), their command line or a file open under it: ``(pid, command)``."""
    found = []
    for e in os.listdir("/proc"):
        if not e.isdigit() or int(e) == os.getpid():
            continue
        try:
            env = Path(f"/proc/{e}/environ").read_bytes()
            cmd = Path(f"/proc/{e}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            fds = [os.readlink(f"/proc/{e}/fd/{fd}") for fd in os.listdir(f"/proc/{e}/fd")]
        except OSError:
            continue
        if not cmd:  # a zombie
            continue
        if f"RAY_TMPDIR={tmp}".encode() in env.split(b"\0") or tmp in cmd or any(f.startswith(tmp) for f in fds):
            found.append((int(e), cmd[:80]))
    return found


def _wait_gone(tmp: str, timeout_s: float) -> list[tuple[int, str]]:
    deadline = time.monotonic() + timeout_s
    while (left := _mine(tmp)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


def _start(args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", *args], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    assert line == "ready", line
    return proc


#: drivers that start a local cluster the way ``bandit_sim sweep --runtime ray`` and ``mrl_llm train --runtime ray``
#: do (the latter plans its policy on it and writes plan.txt), run a task, and wait
RAY_DRIVERS = {
    "bandit_sim": """
import time
from bandit_sim.sweep_ray import RayRuntime
rt = RayRuntime.start(num_cpus=1)
""",
    "mrl_llm": """
import os, time
from pathlib import Path
from mrl_llm.config import config_from_mapping
from mrl_llm.distributed.ray_trainer import ray_runtime
from tests.llm.helpers import tiny
cfg = config_from_mapping({"policies": [{"name": "a", "model_config": tiny("llama"), "tokenizer_dir": "utf8-bytes"}],
                           "runtime": {"backend": "ray", "num_cpus": 1}})
rt = ray_runtime(cfg, Path(os.environ["RAY_TMPDIR"]))
rt.__enter__()
""",
}
WAIT = """
import ray
assert ray.get(ray.remote(lambda: 1).remote()) == 1
print("ready", flush=True)
time.sleep(600)
"""


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.parametrize("how", sorted(RAY_DRIVERS))
def test_a_killed_drivers_local_cluster_leaves_no_process(how):
    pytest.importorskip("ray")
    tmp = tempfile.mkdtemp(prefix="rw", dir="/tmp")  # short: Ray's socket paths live under it
    driver = None
    try:
        driver = _start([RAY_DRIVERS[how] + WAIT], env={"RAY_TMPDIR": tmp})
        running = _mine(tmp)
        cmds = " | ".join(c for _, c in running)
        assert "raylet" in cmds and "ray::DashboardAgent" in cmds and "ray::RuntimeEnvAgent" in cmds, cmds
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait(timeout=30)
        left = _wait_gone(tmp, 30)
        assert left == [], f"left running after the driver was killed: {left}"
    finally:
        if driver is not None and driver.poll() is None:
            driver.kill()
        for pid, _ in _mine(tmp):  # never leak a cluster, whatever the outcome
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(tmp, ignore_errors=True)


#: a "driver" that starts a watchdog over a fake session (``$SESSION``) and a process of it that outlives it
FAKE_DRIVER = """
import os, subprocess, sys, time
from shared_interfaces.ray_local import ClusterWatchdog
sess = os.environ["SESSION"]
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "--session-dir=" + sess], start_new_session=True)
wd = ClusterWatchdog(sess)
print("ready", flush=True)
time.sleep(600)
"""


def test_the_watchdog_clears_the_session_when_its_driver_is_killed(tmp_path):
    sess = str(tmp_path / "session_x")
    driver = _start([FAKE_DRIVER], env={"SESSION": sess})
    try:
        deadline = time.monotonic() + 20
        while len(session_processes(sess)) < 2 and time.monotonic() < deadline:  # its process and the watchdog
            time.sleep(0.1)
        assert len(session_processes(sess)) == 2 and driver.pid not in session_processes(sess)
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait(timeout=30)
        assert _wait_gone(sess, 20) == []
    finally:
        if driver.poll() is None:
            driver.kill()
        kill_session(sess, grace_s=0)


def test_closing_the_watchdog_clears_the_session_and_an_empty_session_has_no_process(tmp_path):
    sess = str(tmp_path / "session_y")
    assert session_processes(sess) == [] and kill_session(sess) == []  # nothing there: nothing signalled
    keep = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # not the session's
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", f"--logs-dir={sess}/logs"])
    try:
        assert session_processes(sess) == [proc.pid]
        wd = ClusterWatchdog(sess)
        wd.close()
        assert proc.wait(timeout=10) == -signal.SIGTERM and keep.poll() is None
        wd.close()  # a second close does nothing
    finally:
        for p in (keep, proc):
            if p.poll() is None:
                p.kill()
            p.wait()
