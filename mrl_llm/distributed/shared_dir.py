"""The run directory must be one filesystem for the driver and every actor (issue 15 item 8).

Checkpoints, exports and the exchange log go to the run directory, which every node must see. When an
actor (or a worker group's rank) starts, the driver checks it: it has written a random token to
``DIR/.shared-fs/<token>``; the actor reads it back there and writes ``<token>-<policy>-<rank>`` beside it
(:func:`probe`), and the driver then looks for that file (:func:`check_answer`). An actor on a node with
its own disk sees no token (or its answer never reaches the driver) and the run stops with one line
saying that a shared filesystem is needed. On one machine the check always passes.
"""

from __future__ import annotations

import socket
import uuid
from pathlib import Path
from typing import Any

PROBE_DIR = ".shared-fs"


def write_token(run_dir: str | Path) -> str:
    """Write a fresh token under ``run_dir`` (the driver, once) and return it."""
    token = uuid.uuid4().hex
    d = Path(run_dir) / PROBE_DIR
    d.mkdir(parents=True, exist_ok=True)
    (d / token).write_text(token)
    return token


def probe(run_dir: str | Path, token: str, policy: str, rank: int | str) -> dict[str, Any]:
    """What an actor sees of the run directory: ``ok`` when it reads ``token`` there and wrote its answer.
    ``rank``: the actor's rank in its policy's worker group, or a name (a split policy's ``rollout-<i>``)."""
    where = f"policy {policy!r} {f'rank {rank}' if isinstance(rank, int) else rank} on node {socket.gethostname()}"
    d = Path(run_dir) / PROBE_DIR
    try:
        ok = (d / token).read_text() == token
        if ok:
            (d / f"{token}-{policy}-{rank}").write_text(token)
    except OSError:
        ok = False
    return {"ok": ok, "where": where, "policy": policy, "rank": rank}


def check_answer(run_dir: str | Path, token: str, answers: list[dict[str, Any]]) -> None:
    """Raise a ``RuntimeError`` (one line) unless every answer is ``ok`` and its file reached the driver; then
    remove the answer files."""
    d = Path(run_dir) / PROBE_DIR
    for a in answers:
        answer = d / f"{token}-{a['policy']}-{a['rank']}"
        if not a["ok"] or not answer.is_file():
            raise RuntimeError(
                f"{a['where']} cannot read and write the run directory {Path(run_dir).resolve()} that the driver "
                "writes (checkpoints, exports and the exchange log go there); a run on several nodes needs a shared "
                "filesystem mounted at the same path on every node (e.g. NFS), or run on one node")
        answer.unlink()


def remove_token(run_dir: str | Path, token: str) -> None:
    d = Path(run_dir) / PROBE_DIR
    (d / token).unlink(missing_ok=True)
    try:
        d.rmdir()
    except OSError:  # not empty (another driver's token) or gone
        pass
