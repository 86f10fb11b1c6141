"""Resuming a run directory (``train --resume DIR``), in-process or on Ray: the one resume mechanism.

Each policy's actor checkpoints itself (``checkpoints/<policy>/step_<s>/``, ``actor.json`` written after
the worker's files, then the ``LATEST`` pointer), the exchange (in-process, or the Ray service) appends to
``exchange.jsonl`` and the driver to ``metrics.jsonl`` / ``eval.jsonl`` / ``events.jsonl``, each at its
own pace (on Ray concurrently). There is no single run-state file to trust, so the resume point is
derived from the checkpoints themselves:

* ``S`` (:func:`resume_step`) is the newest step at which every policy active at that step
  (``join_step <= S < leave_step``) has a complete checkpoint.
* :func:`restore_run_dir` cuts the directory back to the end of step ``S``: each policy's checkpoints
  after ``S`` are deleted and ``LATEST`` points at ``step_<S>`` (a policy that joins after ``S`` loses
  its pointer and starts from its initial weights, as it did the first time; one that left keeps its
  own); exchange records of steps after ``S`` are dropped (they are generated again, identically in
  synchronous mode); train rows after ``S``, evaluation rows after ``S + 1`` (evaluation ``S + 1``
  measures the weights of checkpoint ``S``) and events after ``S`` are dropped; a ``resume`` event is
  appended; ``summary.json`` and ``dynamics.json`` (the end's) are removed. A log's torn last line (a kill while writing it) is dropped — and with it evaluation ``S + 1``
  when the torn row may be one of its rows (it is done again) — unless it is a row of a step ``<= S``,
  which only an edit can tear: the resume refuses, naming the file and line.

The data cursor needs no state: the driver draws step ``s``'s batch by replaying the seeded cursor.

Integrity: when the actors have checkpointed step ``s`` the driver records, in
``checkpoints/run_state.json`` (:func:`record_checkpoint`)::

    {"version": 2, "dataset_fingerprint": "<sha256>",
     "steps": {"<s>": {"exchange_records": n, "exchange_sha256": "<hex>"}, ...}}

the digest of the exchange lines of records with ``step <= s`` (computed by the exchange,
:meth:`~mrl_llm.distributed.backends.LocalBackend.exchange_digest` or the Ray service's
:meth:`~mrl_llm.distributed.exchange_actor.ExchangeService.digest`) and the dataset's fingerprint. A step is
a resume point only once it is recorded there, and :func:`verify_run_dir` checks, before anything in the
directory changes, that those log lines, the dataset and each policy's checkpoint files
(:func:`mrl_llm.runstate.verify_manifest`) are unedited: a mismatch is a
:class:`~mrl_llm.runstate.CheckpointError` (or, for the dataset, a ``ValueError``) naming the file.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mrl_llm.config import RunConfig
from mrl_llm.runstate import (
    CheckpointError,
    atomic_write,
    check_log_digest,
    point_latest,
    read_json,
    step_dirs,
    verify_checkpoint,
)

RUN_STATE = "run_state.json"
RUN_STATE_VERSION = 2  # 2: one file for both runtimes (version 1 was the in-process line-count state)


def load_run_state(out: Path) -> dict[str, Any] | None:
    """``checkpoints/run_state.json`` of a run directory (None when there is none)."""
    p = Path(out) / "checkpoints" / RUN_STATE
    if not p.is_file():
        return None
    st = read_json(p, "run state")
    if (not isinstance(st, dict) or st.get("version") != RUN_STATE_VERSION or not isinstance(st.get("steps"), dict)
            or not all(isinstance(v, dict) and isinstance(v.get("exchange_sha256"), str) for v in st["steps"].values())):
        raise CheckpointError(f"{p}: not a version-{RUN_STATE_VERSION} run state; restore it or start a new run "
                              "directory")
    return st


def _active(p: Any, step: int) -> bool:
    return step >= p.join_step and (p.leave_step is None or step < p.leave_step)


def record_checkpoint(out: Path, step: int, exchange: tuple[int, str], dataset_fingerprint: str) -> None:
    """Record that step ``step`` is checkpointed, with its exchange digest ``(n, sha256)`` (module docstring)."""
    st = load_run_state(out) or {"version": RUN_STATE_VERSION, "dataset_fingerprint": dataset_fingerprint, "steps": {}}
    st["steps"][str(step)] = {"exchange_records": int(exchange[0]), "exchange_sha256": exchange[1]}
    (out / "checkpoints").mkdir(parents=True, exist_ok=True)
    atomic_write(out / "checkpoints" / RUN_STATE, json.dumps(st, indent=1))


def _lines_up_to(path: Path, step: int) -> list[bytes]:
    """The complete lines of the exchange log whose record has ``step <= step`` (bytes, in log order)."""
    if not path.is_file():
        return []
    out = []
    for k, line in enumerate(path.read_bytes().split(b"\n")[:-1], start=1):
        if not line.strip():
            continue
        try:
            s = json.loads(line)["step"]
        except (ValueError, KeyError, TypeError) as err:
            raise CheckpointError(f"{path}, line {k}: not an exchange record ({type(err).__name__}); the log was "
                                  "edited or corrupted — restore it or start a new run directory") from None
        if isinstance(s, int) and s <= step:
            out.append(line)
    return out


def verify_run_dir(config: RunConfig, out: Path, step: int, dataset_fingerprint: str, dataset: str) -> None:
    """Check the exchange log up to ``step``, the dataset and each policy's checkpoint of ``step`` against
    what was recorded (module docstring); changes nothing."""
    st = load_run_state(out) or {}
    rec = st.get("steps", {}).get(str(step))
    if rec is None:
        raise CheckpointError(f"{out / 'checkpoints' / RUN_STATE} has no record of step {step}; nothing to verify it "
                              "against — start a new run directory")
    if st.get("dataset_fingerprint") != dataset_fingerprint:
        raise ValueError(f"cannot resume: {dataset} differs from the dataset the run was trained on (its fingerprint "
                         "over prompt ids, questions, gold answers and choices changed); resume with the run's own "
                         "dataset, unedited")
    ex = out / "exchange.jsonl"
    check_log_digest(ex, _lines_up_to(ex, step), rec["exchange_sha256"], f"records of steps <= {step}")
    for p in config.policies:
        d = out / "checkpoints" / p.name / f"step_{step}"
        if (d / "actor.json").is_file():
            verify_checkpoint(d)


def checkpoint_steps(policy_dir: Path) -> set[int]:
    """Steps with a complete checkpoint (``actor.json`` is written after the worker's files)."""
    return {s for s, d in step_dirs(policy_dir) if (d / "actor.json").is_file()}


def resume_step(config: RunConfig, out: Path) -> int:
    """The newest step every policy active at it has a complete checkpoint of, recorded in
    ``run_state.json`` (module docstring)."""
    ckpt = out / "checkpoints"
    have = {p.name: checkpoint_steps(ckpt / p.name) for p in config.policies}
    recorded = {int(k) for k in (load_run_state(out) or {}).get("steps", {})}
    for s in sorted(set().union(*have.values()) & recorded, reverse=True):
        active = [p.name for p in config.policies if _active(p, s)]
        if active and all(s in have[n] for n in active):
            return s
    raise FileNotFoundError(
        f"--resume {out}: no step has a complete checkpoint of every policy active at it "
        f"and a record in checkpoints/{RUN_STATE} (found {({n: sorted(v) for n, v in have.items()})}, recorded "
        f"{sorted(recorded)}); nothing to resume — start a new run directory"
    )


_TORN_FIELDS = re.compile(rb'"(step|kind)": ?(\d+|"[a-z]+")')


def _kept_lines(path: Path, keep: Callable[[dict[str, Any]], bool], step: int) -> tuple[list[bytes] | None, int | None]:
    """The lines of ``path`` whose row ``keep`` accepts (None without a file), and the step of a torn last line
    it dropped (None: there is none; ``step + 1`` when its step cannot be read). A line that is not JSON is a
    :class:`CheckpointError` naming the file and line. A torn last line (no newline: the run was killed while
    writing it) is dropped, unless it is a row of a step ``<= step``: those are written before the step is
    recorded, so only an edit tears one, and the resume refuses."""
    if not path.is_file():
        return None, None
    kept = []
    *lines, tail = path.read_bytes().split(b"\n")
    for k, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            raise CheckpointError(f"{path}, line {k}: not a JSON row; the log is corrupt — repair or remove the line") \
                from None
        if keep(row):
            kept.append(line)
    fields = {m[0].decode(): json.loads(m[1]) for m in _TORN_FIELDS.findall(tail)} if tail.strip() else {}
    torn = None if not tail.strip() else fields["step"] if isinstance(fields.get("step"), int) else step + 1
    if torn is not None and torn <= step:
        raise CheckpointError(f"{path}, line {len(lines) + 1}: a row of step {torn} cut off mid-write (no newline), "
                              f"which the resume to step {step} keeps — restore the file, or remove the line to "
                              "resume without it")
    return kept, torn


def restore_run_dir(config: RunConfig, out: Path, step: int) -> dict[str, Any]:
    """Cut ``out`` back to the end of ``step`` (module docstring); returns what was kept. The logs are
    read (and a corrupt line reported) before anything is changed."""
    logs = {
        "exchange_records": (out / "exchange.jsonl", lambda r: r["step"] <= step),
        "metrics_rows": (out / "metrics.jsonl", lambda r: r["step"] <= (step + 1 if r.get("kind") == "eval" else step)),
        "eval_rows": (out / "eval.jsonl", lambda r: r["step"] <= step + 1),
        "events": (out / "events.jsonl", lambda r: r.get("step", 0) <= step),
    }
    lines, torn = {}, set()
    for k, (path, keep) in logs.items():
        rows, cut = _kept_lines(path, keep, step)
        lines[k] = (path, rows)
        if k in ("metrics_rows", "eval_rows"):
            torn.add(cut)
    if step + 1 in torn:  # killed while logging evaluation S + 1: it is dropped from both logs and done again
        for k, is_it in (("metrics_rows", lambda r: r.get("kind") == "eval"), ("eval_rows", lambda r: True)):
            path, rows = lines[k]
            if rows is not None:
                lines[k] = (path, [x for x in rows if not (is_it(r := json.loads(x)) and r["step"] == step + 1)])
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
    kept = {}
    for k, (path, rows) in lines.items():
        kept[k] = len(rows or [])
        if rows is not None:
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_bytes(b"".join(line + b"\n" for line in rows))
            os.replace(tmp, path)
    with open(out / "events.jsonl", "a", encoding="utf-8") as fh:
        fh.write(json.dumps({"event": "resume", "step": step + 1, "checkpoint_step": step, **kept}) + "\n")
    (out / "summary.json").unlink(missing_ok=True)
    (out / "dynamics.json").unlink(missing_ok=True)  # (every evaluation's: the cut-back run writes it again at its end)
    atomic_write(out / "resume.json", json.dumps({"checkpoint_step": step, **kept}, indent=1))
    return kept
