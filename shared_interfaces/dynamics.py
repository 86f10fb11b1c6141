"""Per-prompt learning dynamics of one run: every evaluation's counts per (policy, prompt), beside the success matrix.

The success matrix (:mod:`shared_interfaces.success_matrix`) holds a run's start; this file holds how every
prompt moved: what a simulator is fitted on (per-prompt training-pool and held-out curves, the sampling
entropy). ``mrl_llm`` writes one per run (``DIR/dynamics.json``; ``python -m mrl_llm dynamics --run DIR``
extracts it from an existing run directory); neither backend imports the other: both go through this module.

**Format** (JSON, ``format: "mrl-dynamics"``, ``version: 1``; ``P`` policies, ``C`` prompts, ``T``
evaluations, ``U`` training steps with an entropy)::

    {"format": "mrl-dynamics", "version": 1,
     "policies": [P names],                       # distinct
     "prompts": [C ids],                          # distinct (sorted, as the success matrix's)
     "families": [C labels] | null,               # the prompt's family (task type), when the data has one
     "split": ["train" | "heldout"] * C,          # "train": in the RL training pool; "heldout": only evaluated
     "steps": [T ints],                           # evaluation steps: 0 first, increasing
     "samples": [[[int] * C] * T] * P,            # sampled responses per (policy, step, prompt); 0: not sampled
     "successes": [[[int] * C] * T] * P,          # verified successes among them, 0 <= s <= samples
     "greedy_correct": [[[bool|null] * C] * T] * P,  # the greedy answer's correctness; null: not evaluated
     "skipped": [[int] * T] * P,                  # evaluation rows the run skipped (their cells: samples 0, null)
     "entropy": {"steps": [U ints], "values": [[float|null] * U] * P},
     "run": {"name", "seed", "regime", "steps", "prompts_per_step", "group_size", "eval_k", ...}}

* The sampled success rate of policy ``i`` on prompt ``x`` at evaluation ``t`` is ``successes / samples``
  (undefined where ``samples`` is 0: the prompt was not sampled then, or the row was skipped).
* ``entropy.values[i][u]`` is policy ``i``'s mean token entropy on its own sampled responses at training step
  ``entropy.steps[u]`` (``metrics.jsonl``'s train rows); null where it has none (no row that step, or a
  non-finite value). Steps count from 0, increasing; ``U`` may be 0 (no step trained).
* ``run`` identifies the run, so a reader can check that a dynamics file and a success matrix belong
  together (:meth:`Dynamics.mismatch`): ``name`` (string or null), ``seed``, ``regime`` (the regime
  section: ``name``, ``sgt``, ``prp``, ...), ``steps``, ``prompts_per_step``, ``group_size`` (the policies'
  largest G), ``eval_k`` (0: greedy only), under the trainer's ``config.json`` names; a writer may add keys
  (``mrl_llm`` adds ``loss`` and ``split_from``, how the split was decided). Unknown keys there are kept.

:func:`read_dynamics` validates everything and raises :class:`DynamicsError` (a
:class:`~shared_interfaces.config_io.ConfigError`) naming the file, the key and the fix. NaN is never a
value: a missing number is ``null``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from shared_interfaces.config_io import INT_MAX, ConfigError
from shared_interfaces.json_file import read_json_document, write_json_document

FORMAT = "mrl-dynamics"
VERSION = 1
KEYS = ("format", "version", "policies", "prompts", "families", "split", "steps", "samples", "successes",
        "greedy_correct", "skipped", "entropy", "run")
SPLITS = ("train", "heldout")
#: ``run`` keys that identify a run (compared by :meth:`Dynamics.mismatch`)
RUN_IDENTITY = ("name", "seed", "steps", "prompts_per_step", "group_size", "eval_k")
WRITE_HINT = "write one with `python -m mrl_llm dynamics --run RUN_DIR`"


class DynamicsError(ConfigError):
    """A dynamics file or value is malformed; the message names the key and the fix."""


@dataclass(frozen=True)
class Dynamics:
    """Validated per-prompt dynamics (module docstring). ``samples`` / ``successes`` are int ``[P, T, C]``,
    ``greedy_correct`` float ``[P, T, C]`` (1, 0, NaN: null), ``skipped`` int ``[P, T]``, ``entropy`` float
    ``[P, U]`` (NaN: null) at ``entropy_steps [U]``."""

    policies: tuple[str, ...]
    prompts: tuple[str, ...]
    split: tuple[str, ...]
    steps: np.ndarray
    samples: np.ndarray
    successes: np.ndarray
    greedy_correct: np.ndarray
    skipped: np.ndarray
    entropy_steps: np.ndarray
    entropy: np.ndarray
    run: dict[str, Any]
    families: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        for name, dtype in (("steps", np.int64), ("samples", np.int64), ("successes", np.int64), ("skipped", np.int64),
                            ("entropy_steps", np.int64), ("greedy_correct", float), ("entropy", float)):
            object.__setattr__(self, name, np.asarray(getattr(self, name), dtype=dtype))
        validate(self.to_dict(), where="dynamics")

    def split_index(self, split: str) -> np.ndarray:
        """The indices (into ``prompts``) of ``split``'s prompts ("train" or "heldout"), in order; may be empty."""
        if split not in SPLITS:
            raise DynamicsError(f"dynamics: split {split!r} is not one of {list(SPLITS)}")
        return np.array([c for c, s in enumerate(self.split) if s == split], dtype=np.int64)

    @property
    def rates(self) -> np.ndarray:
        """``[P, T, C]`` sampled success rates ``successes / samples``; NaN where ``samples`` is 0."""
        n = self.samples.astype(float)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(n > 0, self.successes / np.where(n > 0, n, 1.0), np.nan)

    def accuracy(self, split: str | None = None) -> np.ndarray:
        """``[P, T]`` sampled accuracy over ``split``'s prompts (None: all), pooled:
        ``sum_x successes[i, t, x] / sum_x samples[i, t, x]``; NaN where the sum of samples is 0 (an empty split,
        or nothing sampled at that evaluation)."""
        cols = slice(None) if split is None else self.split_index(split)
        s, n = self.successes[:, :, cols].sum(axis=2), self.samples[:, :, cols].sum(axis=2)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(n > 0, s / np.where(n > 0, n, 1), np.nan)

    def mismatch(self, run: dict[str, Any] | None) -> list[str]:
        """How ``run`` (e.g. a success matrix's ``run``) differs from this file's ``run``: ``"key: ours vs
        theirs"`` for each of :data:`RUN_IDENTITY` and the regime's name present in both; empty when they agree."""
        if not run:
            return []
        out = [f"{k}: {self.run[k]!r} vs {run[k]!r}" for k in RUN_IDENTITY
               if k in run and k in self.run and run[k] != self.run[k]]
        theirs = run.get("regime")
        theirs = theirs.get("name") if isinstance(theirs, dict) else theirs
        if theirs is not None and theirs != self.run["regime"]["name"]:
            out.append(f"regime: {self.run['regime']['name']!r} vs {theirs!r}")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": VERSION, "policies": list(self.policies), "prompts": list(self.prompts),
                "families": list(self.families) if self.families is not None else None, "split": list(self.split),
                "steps": self.steps.tolist(), "samples": self.samples.tolist(), "successes": self.successes.tolist(),
                "greedy_correct": _nullable(self.greedy_correct > 0, np.isnan(self.greedy_correct)),
                "skipped": self.skipped.tolist(),
                "entropy": {"steps": self.entropy_steps.tolist(),
                            "values": _nullable(self.entropy, ~np.isfinite(self.entropy))},
                "run": self.run}


def _nullable(values: np.ndarray, null: np.ndarray) -> list:
    """``values`` as nested lists of Python scalars, ``None`` where ``null``."""
    out = values.astype(object)
    out[null] = None
    return out.tolist()


def _fail(where: str, msg: str) -> DynamicsError:
    return DynamicsError(f"{where}: {msg}")


def _short(v: Any) -> str:
    """``repr(v)`` cut to 60 characters (an integer of more digits than Python prints is named by its size)."""
    if isinstance(v, int) and v.bit_length() > 200:
        return f"an integer of {v.bit_length()} bits"
    r = repr(v)
    return r if len(r) <= 60 else r[:57] + "..."


def _is_count(x: Any, lo: int = 0) -> bool:
    """``x`` an integer (not a bool) in ``[lo, INT_MAX]`` (what an int64 array holds)."""
    return type(x) is int and lo <= x <= INT_MAX


def _names(data: dict, key: str, where: str) -> list[str]:
    v = data.get(key)
    if not isinstance(v, list) or not v or not all(isinstance(x, str) and x for x in v):
        raise _fail(where, f"'{key}' must be a non-empty list of non-empty strings")
    seen: set[str] = set()
    dup = sorted({x for x in v if x in seen or seen.add(x)})
    if dup:
        raise _fail(where, f"'{key}' lists {dup[:3]} more than once; names must be distinct")
    return v


def _steps(v: Any, key: str, where: str, *, non_empty: bool) -> list[int]:
    if not isinstance(v, list) or (non_empty and not v) or not all(_is_count(t) for t in v):
        what = "a non-empty" if non_empty else "a"
        raise _fail(where, f"{key} must be {what} list of step numbers (integers in [0, 2**63)), got {_short(v)}")
    if any(b <= a for a, b in zip(v, v[1:], strict=False)):
        raise _fail(where, f"{key} must be increasing (each step once), got {_short(v)}")
    return v


def _cube(data: dict, key: str, dims: tuple[list, list, list], where: str, *, kind: str) -> np.ndarray:
    """``data[key]``, a ``[P][T][C]`` list of counts (``kind`` "count") or of true / false / null ("bool"), as an
    array (int64; float with NaN for null). One pass per row: a 200,000-prompt file reads in a second."""
    v = data.get(key)
    pols, steps, prompts = dims
    P, T, C = len(pols), len(steps), len(prompts)
    if not (isinstance(v, list) and len(v) == P and all(
            isinstance(a, list) and len(a) == T and all(isinstance(r, list) and len(r) == C for r in a) for a in v)):
        raise _fail(where, f"'{key}' must be [P][T][C] = [{P}][{T}][{C}] nested lists (per policy, per evaluation "
                           "step, one entry per prompt)")
    count = kind == "count"
    out = np.empty((P, T, C), dtype=np.int64 if count else float)
    for i, plane in enumerate(v):
        for t, row in enumerate(plane):
            ok = all(_is_count(x) for x in row) if count else all(x is True or x is False or x is None for x in row)
            if not ok:
                c, x = next((c, x) for c, x in enumerate(row)
                            if not (_is_count(x) if count else (x is True or x is False or x is None)))
                want = "a count (an integer >= 0, below 2**63)" if count else "true, false or null"
                raise _fail(where, f"{key}[{i}][{t}][{c}] (policy {pols[i]}, step {steps[t]}, prompt {prompts[c]}) "
                                   f"must be {want}, got {_short(x)}")
            out[i, t] = row if count else [np.nan if x is None else float(x) for x in row]
    return out


def validate(data: Any, *, where: str = "dynamics") -> dict[str, Any]:
    """Check a parsed dynamics object (module docstring); returns it. Errors name the key and the fix."""
    _parse(data, where)
    return data


def _parse(data: Any, where: str) -> dict[str, Any]:
    """The arrays of a dynamics object, validated (:func:`validate`)."""
    if not isinstance(data, dict):
        raise _fail(where, f"expected a JSON object, got {type(data).__name__}")
    if data.get("format") != FORMAT:
        raise _fail(where, f"'format' must be {FORMAT!r}, got {_short(data.get('format'))}; is this a dynamics file? "
                           f"({WRITE_HINT})")
    if data.get("version") != VERSION:
        raise _fail(where, f"version {_short(data.get('version'))} is not supported (this code reads version "
                           f"{VERSION}); write the file again with this code ({WRITE_HINT})")
    unknown = sorted(set(data) - set(KEYS))
    if unknown:
        raise _fail(where, f"unknown key(s) {unknown}; known keys: {list(KEYS)}")
    pols, prompts = _names(data, "policies", where), _names(data, "prompts", where)
    P, C = len(pols), len(prompts)
    fam = data.get("families")
    if fam is not None and (not isinstance(fam, list) or len(fam) != C or not all(isinstance(f, str) for f in fam)):
        raise _fail(where, f"'families' must be null or a list of {C} strings (one per prompt)")
    split = data.get("split")
    if not isinstance(split, list) or len(split) != C or not all(s in SPLITS for s in split):
        raise _fail(where, f"'split' must be a list of {C} entries (one per prompt), each \"train\" or \"heldout\"")
    steps = _steps(data.get("steps"), "'steps'", where, non_empty=True)
    if steps[0] != 0:
        raise _fail(where, f"'steps' must start at 0 (the evaluation before training), got {_short(steps)}")
    dims = (pols, steps, prompts)
    n = _cube(data, "samples", dims, where, kind="count")
    s = _cube(data, "successes", dims, where, kind="count")
    g = _cube(data, "greedy_correct", dims, where, kind="bool")
    if (s > n).any():
        i, t, c = np.argwhere(s > n)[0]
        raise _fail(where, f"successes[{i}][{t}][{c}] (policy {pols[i]}, step {steps[t]}, prompt {prompts[c]}) = "
                           f"{int(s[i, t, c])} exceeds samples = {int(n[i, t, c])}; successes are among the samples")
    skipped = data.get("skipped")
    if not (isinstance(skipped, list) and len(skipped) == P and all(
            isinstance(r, list) and len(r) == len(steps) and all(_is_count(x) for x in r) for r in skipped)):
        raise _fail(where, f"'skipped' must be [P][T] = [{P}][{len(steps)}] counts (integers >= 0)")
    ent_steps, ent = _entropy(data.get("entropy"), pols, where)
    _check_run(data.get("run"), where)
    return {"policies": pols, "prompts": prompts, "families": fam, "split": split, "steps": steps, "samples": n,
            "successes": s, "greedy_correct": g, "skipped": skipped, "entropy_steps": ent_steps, "entropy": ent}


def _entropy(e: Any, pols: list[str], where: str) -> tuple[list[int], np.ndarray]:
    if not isinstance(e, dict) or set(e) != {"steps", "values"}:
        raise _fail(where, "'entropy' must be an object with exactly 'steps' and 'values'")
    steps = _steps(e["steps"], "entropy.steps", where, non_empty=False)
    vals = e["values"]
    P, U = len(pols), len(steps)
    if not isinstance(vals, list) or len(vals) != P or not all(isinstance(r, list) and len(r) == U for r in vals):
        raise _fail(where, f"entropy.values must be [P][U] = [{P}][{U}] (one row per policy, one entry per step)")
    out = np.full((P, U), np.nan)
    for i, row in enumerate(vals):
        for u, x in enumerate(row):
            if x is None:
                continue
            if isinstance(x, bool) or not isinstance(x, int | float) or not math.isfinite(x) or x < 0:
                fix = "; write a missing value as null" if isinstance(x, float) and not math.isfinite(x) else ""
                raise _fail(where, f"entropy.values[{i}][{u}] (policy {pols[i]}, step {steps[u]}) must be a finite "
                                   f"number >= 0 or null, got {_short(x)}{fix}")
            out[i, u] = float(x)
    return steps, out


def _check_run(run: Any, where: str) -> None:
    if not isinstance(run, dict):
        raise _fail(where, "'run' must be an object of the run's identity and settings (name, seed, regime, steps, "
                           "prompts_per_step, group_size, eval_k)")
    for key, lo in (("steps", 1), ("prompts_per_step", 1), ("group_size", 1), ("eval_k", 0), ("seed", 0)):
        if not _is_count(run.get(key), lo):
            raise _fail(where, f"run.{key} must be an integer >= {lo} (below 2**63), got {_short(run.get(key))}")
    if "name" not in run or not (run["name"] is None or isinstance(run["name"], str)):
        raise _fail(where, f"run.name must be the run's name (a string) or null, got {_short(run.get('name'))}")
    if not isinstance(run.get("regime"), dict) or not isinstance(run["regime"].get("name"), str):
        raise _fail(where, "run.regime must be the run's regime section (an object with a 'name')")


def from_dict(data: Any, *, where: str = "dynamics") -> Dynamics:
    a = _parse(data, where)
    return Dynamics(
        policies=tuple(a["policies"]), prompts=tuple(a["prompts"]), split=tuple(a["split"]), steps=a["steps"],
        samples=a["samples"], successes=a["successes"], greedy_correct=a["greedy_correct"], skipped=a["skipped"],
        entropy_steps=a["entropy_steps"], entropy=a["entropy"], run=data["run"],
        families=tuple(a["families"]) if a["families"] is not None else None)


def read_dynamics(path: str | Path) -> Dynamics:
    """Read and validate a dynamics file; errors name the file."""
    p = Path(path)
    if p.is_dir():
        inside = p / "dynamics.json"
        hint = f"pass {inside}" if inside.is_file() else f"pass a dynamics file ({WRITE_HINT})"
        raise DynamicsError(f"dynamics {p} is a directory; {hint}")
    if not p.is_file():
        raise DynamicsError(f"dynamics {p} does not exist; {WRITE_HINT}")
    data = read_json_document(p, DynamicsError, "dynamics", WRITE_HINT)
    return from_dict(data, where=f"dynamics {p}")


def write_dynamics(path: str | Path, dynamics: Dynamics) -> Path:
    """Write ``dynamics`` as JSON, gzip-compressed when ``path`` ends in ``.gz`` (atomically: a temporary file
    renamed over ``path``)."""
    return write_json_document(path, dynamics.to_dict())
