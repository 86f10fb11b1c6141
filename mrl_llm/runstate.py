"""A run directory's checkpoint bookkeeping: what ``--resume`` restores.

Layout of ``DIR``::

    config.json               the resolved config of the run
    exchange.jsonl            the exchange log (every record, in publication order)
    metrics.jsonl eval.jsonl  one row per (step, policy) / (step, policy, prompt)
    checkpoints/<policy>/step_<s>/   model/ (HF dir), optimizer.pt, rng.pt, worker.json, actor.json
    checkpoints/<policy>/LATEST      name of the policy's newest step dir
    checkpoints/run_state.json       written LAST, atomically: the step every policy saved, the data
                                     cursor, and how many lines of exchange.jsonl / metrics.jsonl /
                                     eval.jsonl belong to the run up to that step (the exchange cursor)

Resuming from ``run_state.json`` at step ``s``: every policy's ``LATEST`` is pointed at ``step_<s>``
(a policy may have saved a newer one before a crash), the logs are cut back to their recorded line
counts (records of a half-done step are regenerated identically from the same seeds), and the data
cursor continues where it was.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

RUN_STATE = "run_state.json"
STATE_VERSION = 1


def atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def count_lines(path: Path) -> int:
    if not path.is_file():
        return 0
    with open(path, "rb") as fh:
        return sum(1 for line in fh if line.endswith(b"\n"))


def truncate_lines(path: Path, n: int) -> None:
    """Keep the first ``n`` complete lines of ``path`` (drop the rest, including a torn last line)."""
    if not path.is_file():
        if n:
            raise FileNotFoundError(f"{path} is missing but the checkpoint expects {n} lines in it")
        return
    with open(path, "rb") as fh:
        data = fh.read()
    end, seen = 0, 0
    while seen < n:
        nl = data.find(b"\n", end)
        if nl < 0:
            raise ValueError(f"{path} has only {seen} complete lines; the checkpoint expects {n}")
        end, seen = nl + 1, seen + 1
    if end < len(data):
        with open(path, "r+b") as fh:
            fh.truncate(end)


def save_run_state(ckpt_root: Path, state: dict[str, Any]) -> None:
    ckpt_root.mkdir(parents=True, exist_ok=True)
    atomic_write(ckpt_root / RUN_STATE, json.dumps({"version": STATE_VERSION, **state}, indent=1))


def load_run_state(ckpt_root: Path) -> dict[str, Any] | None:
    p = ckpt_root / RUN_STATE
    if not p.is_file():
        return None
    state = json.loads(p.read_text())
    if state.get("version") != STATE_VERSION:
        raise ValueError(f"{p}: run state version {state.get('version')!r} is not {STATE_VERSION}")
    return state


def point_latest(policy_dir: Path, step: int) -> None:
    """Make ``policy_dir/LATEST`` name ``step_<step>`` (which must exist)."""
    d = policy_dir / f"step_{step}"
    if not (d / "worker.json").is_file():
        raise FileNotFoundError(f"checkpoint {d} is missing or incomplete; cannot resume this policy")
    atomic_write(policy_dir / "LATEST", d.name)


def step_dirs(policy_dir: Path) -> list[tuple[int, Path]]:
    """The policy's ``step_<s>`` directories as ``(s, path)``, oldest first."""
    return sorted((int(p.name[5:]), p) for p in policy_dir.glob("step_*") if p.name[5:].isdigit())


def prune(policy_dir: Path, keep: int) -> None:
    """Delete all but the newest ``keep`` ``step_*`` directories (never the one LATEST names)."""
    latest = (policy_dir / "LATEST").read_text().strip() if (policy_dir / "LATEST").is_file() else None
    steps = step_dirs(policy_dir)
    for _, p in steps[:-keep] if keep > 0 else steps:
        if p.name != latest:
            shutil.rmtree(p, ignore_errors=True)
