"""A run directory's checkpoint integrity: manifests, log digests, JSON state files, ``LATEST`` pointers.

Layout of ``DIR``::

    config.json               the resolved config of the run
    exchange.jsonl            the exchange log (every record, in publication order)
    metrics.jsonl eval.jsonl  one row per (step, policy) / (step, policy, prompt)
    events.jsonl              join, leave, gap, rejoin, resume
    checkpoints/<policy>/step_<s>/   model/ (HF dir), optimizer.pt, rng.pt, worker.json, manifest.json,
                                     actor.json (written last: the step dir is complete)
    checkpoints/<policy>/LATEST      name of the policy's newest step dir
    checkpoints/run_state.json       per checkpointed step, the digest of the exchange lines it covers,
                                     and the dataset's fingerprint (:mod:`mrl_llm.resume`)

Resuming (:mod:`mrl_llm.resume`, both runtimes): the resume point is the newest step every active policy
has a complete checkpoint of and ``run_state.json`` has digests for; everything is verified before the
logs are cut back to it.

Integrity (checked on every resume; a failed check is a :class:`CheckpointError` naming the file):

* **Checkpoint manifest** — ``step_<s>/manifest.json`` (:func:`write_manifest` / :func:`verify_manifest`)::

      {"version": 1, "algorithm": "sha256",
       "files": {"model/model.safetensors": {"bytes": 1234, "sha256": "<hex>"}, "optimizer.pt": {...}, ...}}

  lists every file under the step dir (relative POSIX paths; the manifest itself and ``actor.json``,
  written after it, excluded) with its size and SHA-256. Verifying re-hashes each listed file: a
  missing file, a size or digest mismatch, or a manifest that is not this JSON is an error naming
  the file. Files in the dir that the manifest does not list are errors too (nothing unchecked loads).
* **Exchange digest** — :func:`lines_digest`: SHA-256 over the exchange lines of the records with
  ``step <= s``, each as its UTF-8 bytes plus ``\\n``, in log order (``run_state.json``). Any edited byte,
  inserted or removed line among them changes the digest.
* **Dataset fingerprint** — :func:`mrl_llm.data.cursor.fingerprint`, over what the run uses of each row.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

MANIFEST = "manifest.json"
MANIFEST_VERSION = 1
#: Files of a step dir the manifest does not cover: itself, and the completion marker written after it.
UNLISTED = frozenset({MANIFEST, "actor.json"})


class CheckpointError(ValueError):
    """A checkpoint or run-state file is missing, corrupt or does not match its digest; names the file."""


def read_json(path: Path, what: str = "file") -> Any:
    """``path``'s JSON, or a :class:`CheckpointError` naming the file when it is not valid JSON / UTF-8."""
    try:
        return json.loads(Path(path).read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(f"{path}: corrupt {what} ({err}); restore it from a backup or start a new run "
                              "directory") from None


def read_json_object(path: Path, fix: str, error: type[Exception] = ValueError) -> dict[str, Any]:
    """``path``'s JSON object, or ``error`` naming the file and ending with ``fix`` (what the user can do) when it
    is not UTF-8 JSON or not an object."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except ValueError as err:  # JSONDecodeError, UnicodeDecodeError
        raise error(f"{path}: not JSON ({err}); {fix}") from None
    if not isinstance(data, dict):
        raise error(f"{path}: not a JSON object; {fix}")
    return data


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _listed_files(step_dir: Path) -> list[str]:
    return sorted(p.relative_to(step_dir).as_posix() for p in step_dir.rglob("*")
                  if p.is_file() and p.relative_to(step_dir).as_posix() not in UNLISTED)


def write_manifest(step_dir: str | Path) -> Path:
    """Write ``step_dir/manifest.json``: size and SHA-256 of every file under ``step_dir`` (module docstring)."""
    d = Path(step_dir)
    files = {rel: {"bytes": (d / rel).stat().st_size, "sha256": file_sha256(d / rel)} for rel in _listed_files(d)}
    atomic_write(d / MANIFEST, json.dumps({"version": MANIFEST_VERSION, "algorithm": "sha256", "files": files},
                                          indent=1))
    return d / MANIFEST


def verify_manifest(step_dir: str | Path) -> None:
    """Check every file of ``step_dir`` against its ``manifest.json``; a :class:`CheckpointError` naming
    the first file that is missing, unlisted, or differs in size or digest."""
    d = Path(step_dir)
    m = d / MANIFEST
    if not m.is_file():
        raise CheckpointError(f"checkpoint {d} has no {MANIFEST}; it is incomplete or was written by an older "
                              "version, so its files cannot be verified — resume from another checkpoint or "
                              "start a new run directory")
    man = read_json(m, "checkpoint manifest")
    files = man.get("files") if isinstance(man, dict) else None
    if (not isinstance(man, dict) or man.get("version") != MANIFEST_VERSION or man.get("algorithm") != "sha256"
            or not isinstance(files, dict)
            or not all(isinstance(v, dict) and isinstance(v.get("bytes"), int) and isinstance(v.get("sha256"), str)
                       for v in files.values())):
        raise CheckpointError(f"{m}: not a version-{MANIFEST_VERSION} sha256 checkpoint manifest; the checkpoint "
                              "cannot be verified — restore it or start a new run directory")
    for rel in _listed_files(d):
        if rel not in files:
            raise CheckpointError(f"checkpoint file {d / rel} is not in {m}; it was added after the checkpoint "
                                  "was written — remove it or restore the checkpoint")
    for rel, want in sorted(files.items()):
        p = d / rel
        if not p.is_file():
            raise CheckpointError(f"checkpoint file {p} is missing (listed in {m}) — restore it, or remove {d} "
                                  "to resume from the checkpoint before it (if one is kept)")
        if p.stat().st_size != want["bytes"] or file_sha256(p) != want["sha256"]:
            raise CheckpointError(f"checkpoint file {p} does not match its digest in {m}: it is corrupt or was "
                                  f"edited — restore it, or remove {d} to resume from the checkpoint before it "
                                  "(if one is kept)")


def verify_checkpoint(step_dir: str | Path) -> dict[str, Any]:
    """:func:`verify_manifest` of a policy's ``step_<s>`` dir, and its ``actor.json`` (``{"step": s,
    "version": v}``, the completion marker written after the manifest) checked and returned."""
    d = Path(step_dir)
    verify_manifest(d)
    if not (d / "actor.json").is_file():
        raise CheckpointError(f"checkpoint {d} has no actor.json; it is incomplete — resume from another checkpoint")
    meta = read_json(d / "actor.json", "checkpoint marker")
    if not isinstance(meta, dict) or not isinstance(meta.get("step"), int) or not isinstance(meta.get("version"), int):
        raise CheckpointError(f"{d / 'actor.json'}: expected {{\"step\": <int>, \"version\": <int>}}; the checkpoint "
                              "is corrupt")
    return meta


def lines_digest(lines: Iterable[str | bytes]) -> tuple[int, str]:
    """``(n, sha256)`` of ``lines`` (without their newlines), each hashed as UTF-8 bytes plus ``\\n``."""
    h, n = hashlib.sha256(), 0
    for line in lines:
        h.update(line.encode("utf-8") if isinstance(line, str) else line)
        h.update(b"\n")
        n += 1
    return n, h.hexdigest()


def check_log_digest(path: Path, lines: list[bytes], want: str, where: str) -> None:
    """Raise a :class:`CheckpointError` naming ``path`` when ``lines`` (of it) do not hash to ``want``."""
    if lines_digest(lines)[1] != want:
        raise CheckpointError(f"{path} was edited: its lines up to the checkpoint ({where}) do not match the digest "
                              "stored with the checkpoint; restore the original log or start a new run directory")


def atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


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
