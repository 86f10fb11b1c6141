"""Where a run may be written: the checks on ``--out`` / ``--resume DIR`` that both runtimes share.

* A **new run** needs ``DIR`` to be absent or an empty directory, and writable. A directory that
  already holds a run (``config.json`` with ``exchange.jsonl``, ``metrics.jsonl`` or ``checkpoints/``)
  is refused with a pointer to ``--resume``; any other non-empty directory (an HF model directory, a
  home directory, ...) is refused as it is, so nothing in it is overwritten.
* A **resumed run** needs the run's own ``config.json`` there; only :data:`RESUMABLE_CHANGES` may differ.
* A new run that **fails before its first checkpoint** (a model or dataset that does not load, a crash
  in the first steps, Ctrl-C) leaves no half-made directory behind: :func:`new_run_guard` removes what
  this invocation created — the directory itself when it made it, else the files it put into the
  empty directory it was given. Nothing is removed once a checkpoint exists (the run can be resumed),
  and a directory that was not empty is never touched (the checks above refuse it first).
* A run directory is **owned by one process** (:class:`RunDirLock`): ``DIR/.run.lock`` is ``flock``-ed for
  the run's life, before anything else is written, and the directory is checked again under it. A second
  ``train --out DIR`` or ``--resume DIR`` while it is held is refused with the holder's pid and host (written
  into the lock file). The OS releases the lock when the holder exits, however it exits (``kill -9`` included);
  the file itself stays and means nothing unlocked. Not for a run directory on a file system without
  ``flock`` (an old NFS mount): a lock there fails with the file system's error.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from mrl_llm.config import RunConfig, config_from_mapping
from mrl_llm.resume import RUN_STATE
from mrl_llm.runstate import read_json
from shared_interfaces.config_io import ConfigError, to_mapping
from shared_interfaces.out_paths import nearest_existing

log = logging.getLogger("mrl_llm.rundir")

#: Config keys that may differ between a run and its resumption.
RESUMABLE_CHANGES = ("steps", "progress", "tensorboard", "threads", "eval")
#: Keys (dotted paths) of each ``policies[]`` entry that may change on resume: a checkpoint holds the full weights
#: and the gathered optimizer state, so a run resumes on another number of ranks, sharded or replicated
#: (:mod:`mrl_llm.parallel.checkpoint`).
RESUMABLE_POLICY_CHANGES = ("ranks", "train.fsdp_unit", "train.grad_sync")


def _without(d: Any, path: str) -> Any:
    """Mapping ``d`` without the dotted ``path`` (``d`` itself when it is not a mapping or lacks it)."""
    if not isinstance(d, dict):
        return d
    head, _, rest = path.partition(".")
    if not rest:
        return {k: v for k, v in d.items() if k != head}
    return {**d, head: _without(d[head], rest)} if head in d else d


def _without_resumable(d: dict[str, Any]) -> dict[str, Any]:
    d = {k: v for k, v in d.items() if k not in RESUMABLE_CHANGES}
    if isinstance(d.get("policies"), list):
        pols = d["policies"]
        for path in RESUMABLE_POLICY_CHANGES:
            pols = [_without(p, path) for p in pols]
        d["policies"] = pols
    return d
#: A file whose presence marks a run as resumable (written with its first checkpoint, :mod:`mrl_llm.resume`).
RESUMABLE_MARKERS = (Path("checkpoints") / RUN_STATE,)


def _comparable(cfg: RunConfig) -> dict[str, Any]:
    return json.loads(json.dumps(_without_resumable(to_mapping(cfg))))


def _saved_comparable(saved: dict[str, Any], where: str) -> dict[str, Any]:
    """A run's saved ``config.json`` as this version reads it, so that a key added since it was written (at its
    default: ``few_shot``, ``template.shot_text``, ``sampling.stop_at_newline``) is no difference; as saved when this
    version cannot read it (the comparison then names what differs)."""
    try:
        return _comparable(config_from_mapping(saved, where=where))
    except (ConfigError, ValueError, TypeError):
        return _without_resumable(saved)


#: The lock file in a run directory (:class:`RunDirLock`); not part of the run (an empty directory with only it is empty).
LOCK_FILE = ".run.lock"


def _entries(out: Path) -> list[Path]:
    """What ``out`` holds besides its lock file."""
    return [p for p in out.iterdir() if p.name != LOCK_FILE]


class RunDirLockedError(FileExistsError):
    """Another process holds the run directory's lock (the message names its pid and host): the directory is
    taken, as one that holds a run is (a ``FileExistsError``, so the CLI prints it as a one-line error)."""


class RunDirLock:
    """An exclusive ``flock`` on ``out/.run.lock`` (module docstring), taken on entering (``out`` is made when
    absent, as a new run's ``--out`` is) and released on leaving; the OS releases it when the process dies.
    A held lock is a :class:`RunDirLockedError` at once (no waiting) naming the holder."""

    def __init__(self, out: Path) -> None:
        self.out = Path(out)
        self.fd: int | None = None

    def __enter__(self) -> RunDirLock:
        self.out.mkdir(parents=True, exist_ok=True)
        path = self.out / LOCK_FILE
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)  # not inherited by the run's subprocesses (PEP 446)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise RunDirLockedError(f"{self.out} is in use by another run ({holder}); wait for it to finish or stop "
                                    "it, or choose another directory (two processes on one run directory corrupt "
                                    "it)") from None
        except OSError:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname()}).encode() + b"\n", 0)
        self.fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the descriptor releases the flock
            self.fd = None


def _read_holder(fd: int) -> str:
    """``pid N on host H`` from a held lock file (what its holder wrote), or what is known."""
    try:
        info = json.loads(os.pread(fd, 4096, 0).decode() or "null")
        return f"pid {int(info['pid'])} on host {info['host']}"
    except (ValueError, TypeError, KeyError, UnicodeDecodeError):
        return "a process that has not written its pid yet"


def holds_run(out: Path) -> bool:
    """Whether ``out`` looks like a run directory (its config plus a log or checkpoints)."""
    return (out / "config.json").is_file() and any(
        (out / n).exists() for n in ("exchange.jsonl", "metrics.jsonl", "checkpoints"))


def check_run_dir(config: RunConfig, out: Path, resume: bool) -> None:
    """Refuse an ``out`` a run may not be written into (module docstring). Both runtimes check with this."""
    out = Path(out)
    if resume:
        if not (out / "config.json").is_file():
            raise FileNotFoundError(f"--resume {out}: no config.json there; nothing to resume")
        saved = read_json(out / "config.json", "run config")
        if not isinstance(saved, dict):
            raise ConfigError(f"{out / 'config.json'}: not a run config (a JSON object); nothing to resume")
        mine = _comparable(config)
        theirs = _saved_comparable(saved, str(out / "config.json"))
        diff = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
        if diff:
            raise ConfigError(f"--resume {out}: the config differs from the run's in {diff}; resume with "
                              f"the run's own config ({out / 'config.json'}); only {list(RESUMABLE_CHANGES)} "
                              f"and {', '.join(f'policies[].{k}' for k in RESUMABLE_POLICY_CHANGES)} may change")
        return
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"--out {out} is a file, not a directory; choose a new --out directory")
    if out.is_dir() and _entries(out):
        if holds_run(out) and not any((out / m).is_file() for m in RESUMABLE_MARKERS):
            raise FileExistsError(f"{out} holds a run that stopped before its first checkpoint (killed?), so there "
                                  f"is nothing to resume; remove {out} or choose a new --out directory")
        if holds_run(out):
            raise FileExistsError(f"{out} already holds a run; pass --resume {out} to continue it or choose "
                                  "a new --out directory")
        some = sorted(p.name for p in _entries(out))[:3]
        raise FileExistsError(f"--out {out} is not empty (it holds {', '.join(some)}, ...) and is not a run "
                              "directory; a new run needs a new or empty directory, so nothing there is overwritten")
    base = nearest_existing(out)
    if not base.is_dir():
        raise FileExistsError(f"--out {out}: {base} is a file, not a directory; choose an --out path under a directory")
    if not os.access(base, os.W_OK | os.X_OK):
        raise PermissionError(f"--out {out}: {base} is not writable (a read-only directory?); choose a writable "
                              "--out directory")


@contextmanager
def new_run_guard(out: Path, resume: bool, *, made: bool | None = None) -> Iterator[None]:
    """Run the body; if it fails before the run has a checkpoint, remove what it created in ``out``
    (module docstring). Call after :func:`check_run_dir`, which guarantees ``out`` is new or empty (its lock file
    aside). ``made``: whether this invocation made ``out`` (before locking it); default: whether it is absent now."""
    out = Path(out)
    existed = out.is_dir() if made is None else not made
    if resume or (out.is_dir() and _entries(out)):
        yield
        return
    try:
        yield
    except BaseException:
        if out.is_dir() and not any((out / m).is_file() for m in RESUMABLE_MARKERS):
            if existed:
                for p in out.iterdir():
                    shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
            else:
                shutil.rmtree(out, ignore_errors=True)
            log.warning("the run failed before its first checkpoint; removed what it had written to %s "
                        "(rerun the same command once the error is fixed)", out)
        raise
