"""Resuming a Ray run directory (``train --resume DIR`` with ``runtime.backend: ray``).

Under Ray each policy's actor checkpoints itself (``checkpoints/<policy>/step_<s>/``, ``actor.json``
written after the worker's files, then the ``LATEST`` pointer), the exchange service appends to
``exchange.jsonl`` and the driver to ``metrics.jsonl`` / ``eval.jsonl`` / ``events.jsonl``, each at
its own pace. There is no single run-state file to trust, so the resume point is derived from the
checkpoints themselves:

* ``S`` (:func:`resume_step`) is the newest step at which every policy active at that step
  (``join_step <= S < leave_step``) has a complete checkpoint.
* :func:`restore_run_dir` cuts the directory back to the end of step ``S``: each policy's checkpoints
  after ``S`` are deleted and ``LATEST`` points at ``step_<S>`` (a policy that joins after ``S`` loses
  its pointer and starts from its initial weights, as it did the first time; one that left keeps its
  own); exchange records of steps after ``S`` are dropped (they are generated again, identically in
  synchronous mode); train rows after ``S``, evaluation rows after ``S + 1`` (evaluation ``S + 1``
  measures the weights of checkpoint ``S``) and events after ``S`` are dropped; a ``resume`` event is
  appended.

The data cursor needs no state: the driver draws step ``s``'s batch by replaying the seeded cursor.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mrl_llm.config import RunConfig
from mrl_llm.distributed.driver import Membership
from mrl_llm.runstate import atomic_write, point_latest, step_dirs


def checkpoint_steps(policy_dir: Path) -> set[int]:
    """Steps with a complete checkpoint (``actor.json`` is written after the worker's files)."""
    return {s for s, d in step_dirs(policy_dir) if (d / "actor.json").is_file()}


def resume_step(config: RunConfig, out: Path) -> int:
    """The newest step every policy active at it has a complete checkpoint of (module docstring)."""
    ckpt = out / "checkpoints"
    have = {p.name: checkpoint_steps(ckpt / p.name) for p in config.policies}
    for s in sorted(set().union(*have.values()), reverse=True):
        active = [p.name for p in config.policies if Membership(p.join_step, p.leave_step).active(s)]
        if active and all(s in have[n] for n in active):
            return s
    raise FileNotFoundError(
        f"--resume {out}: no step has a complete checkpoint of every policy active at it "
        f"(found {({n: sorted(v) for n, v in have.items()})}); nothing to resume — start a new run directory"
    )


def _filter_jsonl(path: Path, keep: Callable[[dict[str, Any]], bool]) -> int:
    """Rewrite ``path`` with the rows ``keep`` accepts (a torn last line is dropped); returns the rows kept."""
    if not path.is_file():
        return 0
    lines = path.read_bytes().split(b"\n")
    kept = []
    for line in lines[:-1]:  # the part after the last newline is empty or a torn line
        if line.strip() and keep(json.loads(line)):
            kept.append(line)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(b"".join(line + b"\n" for line in kept))
    os.replace(tmp, path)
    return len(kept)


def restore_run_dir(config: RunConfig, out: Path, step: int) -> dict[str, Any]:
    """Cut ``out`` back to the end of ``step`` (module docstring); returns what was kept."""
    ckpt = out / "checkpoints"
    for p in config.policies:
        d = ckpt / p.name
        for s, x in step_dirs(d):
            if s > step:
                shutil.rmtree(x, ignore_errors=True)
        if (d / f"step_{step}" / "actor.json").is_file():
            point_latest(d, step)
        elif p.join_step > step and (d / "LATEST").is_file():  # it joins again later, from its initial weights
            (d / "LATEST").unlink()
    kept = {
        "exchange_records": _filter_jsonl(out / "exchange.jsonl", lambda r: r["step"] <= step),
        "metrics_rows": _filter_jsonl(out / "metrics.jsonl",
                                      lambda r: r["step"] <= (step + 1 if r.get("kind") == "eval" else step)),
        "eval_rows": _filter_jsonl(out / "eval.jsonl", lambda r: r["step"] <= step + 1),
        "events": _filter_jsonl(out / "events.jsonl", lambda r: r.get("step", 0) <= step),
    }
    with open(out / "events.jsonl", "a", encoding="utf-8") as fh:
        fh.write(json.dumps({"event": "resume", "step": step + 1, "checkpoint_step": step, **kept}) + "\n")
    (out / "summary.json").unlink(missing_ok=True)
    atomic_write(out / "resume.json", json.dumps({"checkpoint_step": step, **kept}, indent=1))
    return kept
