"""Where a command may write its output, checked before its work so that the work is not thrown away: both
backends' ``--out`` checks (``bandit_sim run | scenario | predict``, ``mrl_llm eval | report | success-matrix |
data prepare``) and the run-directory checks of :mod:`mrl_llm.rundir` stand on these."""

from __future__ import annotations

import os
from pathlib import Path

from shared_interfaces.config_io import ConfigError


def nearest_existing(p: Path) -> Path:
    """``p`` (made absolute) or its nearest ancestor that exists."""
    p = Path(p).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def check_creatable(d: Path, *, flag: str, dest: Path) -> None:
    """Directory ``d`` (of ``flag dest``) exists or can be made: its nearest existing ancestor is a writable
    directory; else a :class:`ConfigError` saying what to give."""
    base = nearest_existing(d)
    if not base.is_dir():
        raise ConfigError(f"{flag} {dest}: {base} is a file, not a directory; give a path under a directory")
    if not os.access(base, os.W_OK | os.X_OK):
        raise ConfigError(f"{flag} {dest}: {base} is not writable (a read-only directory?); choose a writable "
                          "location")


def check_out_file(dest: Path, flag: str, *, example: str) -> None:
    """``dest`` (given as ``flag``, e.g. ``--out``) as a file a command may write: not a directory (``example``: a
    file name to suggest in it), under a directory that exists or can be made (:func:`check_creatable`), and, if
    it exists, writable."""
    dest = Path(dest)
    if dest.is_dir():
        raise ConfigError(f"{flag} {dest} is a directory; give a file path (e.g. {dest / example})")
    check_creatable(dest.parent, flag=flag, dest=dest)
    if dest.exists() and not os.access(dest, os.W_OK):
        raise ConfigError(f"{flag} {dest} is not writable; choose a writable location")
