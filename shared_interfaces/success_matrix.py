"""The success matrix: what an LLM run measured at its start, the interface between the two backends.

``mrl_llm`` writes one per run (``DIR/success_matrix.json``; ``python -m mrl_llm success-matrix --run DIR``
extracts it from an existing run directory); ``bandit_sim`` reads it (``python -m bandit_sim predict``)
to calibrate a scenario. Neither backend imports the other: both go through this module.

**Format** (JSON, ``format: "mrl-success-matrix"``, ``version: 2``; ``P`` policies, ``C`` prompts)::

    {"format": "mrl-success-matrix", "version": 2,
     "policies": [P names],                  # distinct
     "prompts": [C ids],                     # distinct
     "families": [C labels] | null,          # the prompt's family (task type), when the data has one
     "samples": [[int] * C] * P,             # step-0 sampled responses per (policy, prompt), >= 1
     "successes": [[int] * C] * P,           # verified successes among them, 0 <= s <= samples
     "greedy_correct": [[bool|null] * C] * P,  # the greedy answer's correctness; null: not recorded
     "run": {...} | null,                    # the run's settings (below)
     "curve": {"steps": [T ints], "accuracy": [[float|null] * T] * P} | null,
     "outcomes": {REGIME: {"final_accuracy": [P floats], "mean_accuracy": float|null,
                           "rescue_rate": float|null, "rescue_set": int|null, "seeds": int}} | null,
     "split": [C "train" | "heldout"] | null,  # version 2: the run's RL pool, or only evaluated
     "kernel": {...} | null}                 # version 2: per-policy transfer kernels (below)

* The step-0 success rate of policy ``i`` on prompt ``x`` is ``successes / samples`` (``k`` samples per
  prompt, pooled over the distinct step-0 evaluations a writer had).
* ``run`` holds the training settings a simulator needs to mirror the run, under the trainer's
  ``config.json`` names: ``steps``, ``prompts_per_step``, ``group_size`` (the policies' largest G),
  ``seed``, ``eval_k``, ``regime`` (the regime section: name, ``sgt``, ``prp``, ``advantage``), ``loss``
  (``clip_low``, ``clip_high``, ``kl_coef``, ...). Unknown keys there are kept (they are the trainer's).
* ``curve`` is the run's learning curve: per policy the **sample accuracy** (successes / samples over
  the prompts) at each evaluation step, step 0 first. A short GRPO probe's curve is what ``predict
  --probe-run`` fits the simulator's learning rate on.
* ``outcomes`` are observed results per regime: ``final_accuracy`` per policy (sample accuracy at the
  last evaluation), ``mean_accuracy`` (over the evaluations after step 0 and the policies),
  ``rescue_rate`` (share of the rescue set — prompts a policy never solved at step 0 while a peer did,
  pooled over policies — solved at the last evaluation), ``rescue_set`` its size, ``seeds`` the number
  of runs pooled. A run writes its own regime's; a fixture may hold several.

* ``split`` (version 2) says which prompts the run trained on (``train``: its RL pool) and which it only
  evaluated (``heldout``); null where the writer could not tell. :attr:`SuccessMatrix.train_index` /
  :attr:`~SuccessMatrix.heldout_index` give their positions.
* ``kernel`` (version 2): per policy a ``[C, C]`` transfer kernel over the prompts measured at the run's
  start, with its metadata (:mod:`shared_interfaces.success_kernel`, ``python -m mrl_llm kernel``).
* A version-1 file (no ``split``, no ``kernel``) still reads, with both null; a matrix is written as
  version 2.

:func:`read_success_matrix` validates everything and raises :class:`SuccessMatrixError` (a
:class:`~shared_interfaces.config_io.ConfigError`) naming the file, the key and the fix.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from shared_interfaces.config_io import INT_MAX, ConfigError
from shared_interfaces.json_file import read_json_document, write_json_document
from shared_interfaces.regimes import parse_regime
from shared_interfaces.success_kernel import kernel_dict, parse_kernel

FORMAT = "mrl-success-matrix"
VERSION = 2
#: the versions this code reads (version 1: no ``split``, no ``kernel``)
READS = (1, 2)
KEYS_V1 = ("format", "version", "policies", "prompts", "families", "samples", "successes", "greedy_correct", "run",
           "curve", "outcomes")
KEYS = (*KEYS_V1, "split", "kernel")
SPLITS = ("train", "heldout")
OUTCOME_KEYS = ("final_accuracy", "mean_accuracy", "rescue_rate", "rescue_set", "seeds")


class SuccessMatrixError(ConfigError):
    """A success-matrix file or value is malformed; the message names the key and the fix."""


@dataclass(frozen=True)
class SuccessMatrix:
    """A validated success matrix (module docstring); arrays are ``[P, C]``, ``greedy_correct`` float with NaN
    where not recorded."""

    policies: tuple[str, ...]
    prompts: tuple[str, ...]
    samples: np.ndarray
    successes: np.ndarray
    greedy_correct: np.ndarray
    families: tuple[str, ...] | None = None
    run: dict[str, Any] | None = None
    curve_steps: np.ndarray | None = None
    curve_accuracy: np.ndarray | None = None
    outcomes: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: per prompt ``train`` (the RL pool) or ``heldout`` (only evaluated); None: not known
    split: tuple[str, ...] | None = None
    #: ``[P, C, C]`` transfer kernels (NaN rows for a policy without one); None: not measured
    kernel: np.ndarray | None = None
    #: the kernel's metadata (:mod:`shared_interfaces.success_kernel`, the section without its matrices)
    kernel_meta: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if (self.kernel is None) != (self.kernel_meta is None):
            raise SuccessMatrixError("success matrix: 'kernel' and 'kernel_meta' go together; give both or neither")
        validate(self.to_dict(), where="success matrix")

    @property
    def rates(self) -> np.ndarray:
        """``[P, C]`` step-0 success rates ``successes / samples``."""
        return self.successes / self.samples

    @property
    def greedy_known(self) -> np.ndarray:
        """``[P, C]`` bool: greedy correct (an unrecorded greedy answer counts as wrong)."""
        return np.nan_to_num(self.greedy_correct, nan=0.0) > 0

    @property
    def train_index(self) -> np.ndarray:
        """Positions of the prompts the run trained on (``split == "train"``); an error when the split is unknown."""
        return self._split_index("train")

    @property
    def heldout_index(self) -> np.ndarray:
        """Positions of the prompts the run only evaluated (``split == "heldout"``); an error when unknown."""
        return self._split_index("heldout")

    def _split_index(self, which: str) -> np.ndarray:
        if self.split is None:
            raise SuccessMatrixError("this success matrix has no 'split' (a version-1 file, or a run that could not "
                                     "tell its pool); write it again with `python -m mrl_llm success-matrix --run DIR`")
        return np.array([c for c, s in enumerate(self.split) if s == which], dtype=np.int64)

    def to_dict(self) -> dict[str, Any]:
        g = [[None if math.isnan(v) else bool(v) for v in row] for row in np.asarray(self.greedy_correct, dtype=float)]
        curve = None
        if self.curve_steps is not None:
            acc = np.asarray(self.curve_accuracy, dtype=float)
            curve = {"steps": [int(s) for s in self.curve_steps],
                     "accuracy": [[None if math.isnan(v) else float(v) for v in row] for row in acc]}
        return {"format": FORMAT, "version": VERSION, "policies": list(self.policies), "prompts": list(self.prompts),
                "families": list(self.families) if self.families is not None else None,
                "samples": np.asarray(self.samples).astype(int).tolist(),
                "successes": np.asarray(self.successes).astype(int).tolist(), "greedy_correct": g,
                "run": self.run, "curve": curve, "outcomes": self.outcomes or None,
                "split": list(self.split) if self.split is not None else None,
                "kernel": None if self.kernel is None else kernel_dict(self.kernel, self.kernel_meta or {})}


def _fail(where: str, msg: str) -> SuccessMatrixError:
    return SuccessMatrixError(f"{where}: {msg}")


def _names(data: dict, key: str, where: str) -> list[str]:
    v = data.get(key)
    if not isinstance(v, list) or not v or not all(isinstance(x, str) and x for x in v):
        raise _fail(where, f"'{key}' must be a non-empty list of non-empty strings")
    seen: set[str] = set()
    dup = sorted({x for x in v if x in seen or seen.add(x)})  # one pass: 200,000 prompts in milliseconds
    if dup:
        raise _fail(where, f"'{key}' lists {dup[:3]} more than once; names must be distinct")
    return v


def _is_int(x: Any, lo: int = 0) -> bool:
    """``x`` an integer (not a bool) in ``[lo, INT_MAX]`` (what an int64 array holds)."""
    return isinstance(x, int) and not isinstance(x, bool) and lo <= x <= INT_MAX


def _matrix(data: dict, key: str, shape: tuple[int, int], where: str, *, allow_null: bool = False,
            kind: str = "int") -> np.ndarray:
    v = data.get(key)
    P, C = shape
    if not isinstance(v, list) or len(v) != P or not all(isinstance(r, list) and len(r) == C for r in v):
        raise _fail(where, f"'{key}' must be a [P, C] = [{P}, {C}] list of lists (one row per policy, one entry per "
                           "prompt)")
    out = np.full(shape, np.nan)
    for i, row in enumerate(v):
        for c, x in enumerate(row):
            if x is None and allow_null:
                continue
            ok = isinstance(x, bool) if kind == "bool" else _is_int(x, -INT_MAX - 1)  # (the range checks follow)
            if not ok:
                want = "true, false or null" if kind == "bool" else "an integer"
                bound = "" if kind == "bool" else " (a count below 2**63)"
                raise _fail(where, f"'{key}'[{i}][{c}] must be {want}, got {_short(x)}{bound}")
            out[i, c] = float(x)
    return out


def validate(data: Any, *, where: str = "success matrix") -> dict[str, Any]:
    """Check a parsed success matrix (module docstring); returns it. Errors name the key and the fix."""
    if not isinstance(data, dict):
        raise _fail(where, f"expected a JSON object, got {type(data).__name__}")
    if data.get("format") != FORMAT:
        raise _fail(where, f"'format' must be {FORMAT!r}, got {data.get('format')!r}; is this a success matrix?")
    version = data.get("version")
    if isinstance(version, bool) or version not in READS:
        raise _fail(where, f"version {version!r} is not supported (this code reads versions {list(READS)})")
    keys = KEYS_V1 if version == 1 else KEYS
    unknown = sorted(set(data) - set(keys))
    if unknown:
        hint = f"; {unknown} need version 2" if version == 1 and set(unknown) <= set(KEYS) else ""
        raise _fail(where, f"unknown key(s) {unknown}; known keys: {list(keys)}{hint}")
    pols, prompts = _names(data, "policies", where), _names(data, "prompts", where)
    shape = (len(pols), len(prompts))
    fam = data.get("families")
    if fam is not None and (not isinstance(fam, list) or len(fam) != len(prompts) or not all(isinstance(f, str) for f in fam)):
        raise _fail(where, f"'families' must be null or a list of {len(prompts)} strings (one per prompt)")
    n = _matrix(data, "samples", shape, where)
    s = _matrix(data, "successes", shape, where)
    _matrix(data, "greedy_correct", shape, where, allow_null=True, kind="bool")
    if (n < 1).any():
        i, c = np.argwhere(n < 1)[0]
        raise _fail(where, f"samples[{i}][{c}] (policy {pols[i]}, prompt {prompts[c]}) is {int(n[i, c])}; every "
                           "(policy, prompt) needs at least one step-0 sample (run the evaluation with k >= 1)")
    if ((s < 0) | (s > n)).any():
        i, c = np.argwhere((s < 0) | (s > n))[0]
        raise _fail(where, f"successes[{i}][{c}] = {int(s[i, c])} is outside [0, samples = {int(n[i, c])}]")
    run = data.get("run")
    if run is not None:
        _check_run(run, where)
    curve = data.get("curve")
    if curve is not None:
        _check_curve(curve, len(pols), where)
    outcomes = data.get("outcomes")
    if outcomes is not None:
        validate_outcomes(outcomes, len(pols), where=where)
    split = data.get("split")
    if split is not None and (not isinstance(split, list) or len(split) != len(prompts)
                              or not all(x in SPLITS for x in split)):
        raise _fail(where, f"'split' must be null or a list of {len(prompts)} entries (one per prompt), each "
                           f"'train' (the run's RL pool) or 'heldout' (only evaluated)")
    if data.get("kernel") is not None:
        parse_kernel(data["kernel"], len(pols), len(prompts), lambda msg: _fail(where, msg))
    return data


def _check_run(run: Any, where: str) -> None:
    if not isinstance(run, dict):
        raise _fail(where, "'run' must be null or an object of the run's settings")
    for key in ("steps", "prompts_per_step", "group_size"):
        v = run.get(key)
        if not _is_int(v, 1):
            raise _fail(where, f"run.{key} must be a positive integer (below 2**63), got {_short(v)}")
    k = run.get("eval_k")
    if k is not None and not _is_int(k, 1):
        raise _fail(where, f"run.eval_k must be a positive integer or null, got {_short(k)}")
    seed = run.get("seed", 0)
    if not _is_int(seed):
        raise _fail(where, f"run.seed must be an integer in [0, 2**63), got {_short(seed)}")
    if not isinstance(run.get("regime"), dict) or not isinstance(run["regime"].get("name"), str):
        raise _fail(where, "run.regime must be the run's regime section (an object with a 'name')")
    if run.get("loss") is not None and not isinstance(run["loss"], dict):
        raise _fail(where, f"run.loss must be null or the run's loss section (an object), got {_short(run['loss'])}")


def _short(v: Any) -> str:
    """``repr(v)`` cut to 60 characters (an integer of more digits than Python prints is named by its size)."""
    if isinstance(v, int) and v.bit_length() > 200:
        return f"an integer of {v.bit_length()} bits"
    r = repr(v)
    return r if len(r) <= 60 else r[:57] + "..."


def _check_curve(curve: Any, P: int, where: str) -> None:
    if not isinstance(curve, dict) or set(curve) != {"steps", "accuracy"}:
        raise _fail(where, "'curve' must be null or an object with exactly 'steps' and 'accuracy'")
    steps = curve["steps"]
    if not isinstance(steps, list) or not steps or not all(_is_int(t) for t in steps):
        raise _fail(where, "curve.steps must be a non-empty list of integers in [0, 2**63)")
    if steps != sorted(set(steps)) or steps[0] != 0:
        raise _fail(where, f"curve.steps must be increasing and start at 0, got {steps[:5]}")
    acc = curve["accuracy"]
    if not isinstance(acc, list) or len(acc) != P or not all(isinstance(r, list) and len(r) == len(steps) for r in acc):
        raise _fail(where, f"curve.accuracy must be [P, T] = [{P}, {len(steps)}] (one row per policy)")
    for i, row in enumerate(acc):
        for t, x in enumerate(row):
            if x is not None and (isinstance(x, bool) or not isinstance(x, int | float) or not 0.0 <= x <= 1.0):
                raise _fail(where, f"curve.accuracy[{i}][{t}] must be a number in [0, 1] or null, got {x!r}")


def validate_outcomes(outcomes: Any, P: int, *, where: str = "outcomes") -> None:
    """Check an ``outcomes`` object (module docstring) for ``P`` policies."""
    if not isinstance(outcomes, dict):
        raise _fail(where, "'outcomes' must be null or an object {regime: {final_accuracy, ...}}")
    named: dict[str, str] = {}
    for reg, o in outcomes.items():
        w = f"outcomes.{reg}"
        try:
            canon = parse_regime(reg).name
        except ConfigError as err:
            raise _fail(where, f"{w}: {err}") from err
        if canon in named:
            raise _fail(where, f"outcomes {named[canon]!r} and {reg!r} name one regime ({canon}); keep one of them")
        named[canon] = reg
        if not isinstance(o, dict):
            raise _fail(where, f"{w} must be an object with keys {list(OUTCOME_KEYS)}")
        unknown = sorted(set(o) - set(OUTCOME_KEYS))
        if unknown:
            raise _fail(where, f"{w}: unknown key(s) {unknown}; known: {list(OUTCOME_KEYS)}")
        fa = o.get("final_accuracy")
        if not isinstance(fa, list) or len(fa) != P or not all(isinstance(x, int | float) and 0 <= x <= 1 for x in fa):
            raise _fail(where, f"{w}.final_accuracy must be {P} numbers in [0, 1] (one per policy)")
        for key in ("mean_accuracy", "rescue_rate"):
            x = o.get(key)
            if x is not None and (isinstance(x, bool) or not isinstance(x, int | float) or not 0 <= x <= 1):
                raise _fail(where, f"{w}.{key} must be null or a number in [0, 1], got {x!r}")
        seeds = o.get("seeds", 1)
        if not _is_int(seeds, 1):
            raise _fail(where, f"{w}.seeds must be a positive integer, got {_short(seeds)}")
        size = o.get("rescue_set")
        if size is not None and not _is_int(size):
            raise _fail(where, f"{w}.rescue_set must be null or a count, got {_short(size)}")


def from_dict(data: Any, *, where: str = "success matrix") -> SuccessMatrix:
    validate(data, where=where)
    curve = data.get("curve")
    g = np.array([[np.nan if x is None else float(x) for x in row] for row in data["greedy_correct"]])
    K, meta = (parse_kernel(data["kernel"], len(data["policies"]), len(data["prompts"]), lambda m: _fail(where, m))
               if data.get("kernel") is not None else (None, None))
    return SuccessMatrix(
        policies=tuple(data["policies"]), prompts=tuple(data["prompts"]),
        samples=np.array(data["samples"], dtype=np.int64), successes=np.array(data["successes"], dtype=np.int64),
        greedy_correct=g, families=tuple(data["families"]) if data.get("families") is not None else None,
        run=data.get("run"),
        curve_steps=np.array(curve["steps"], dtype=np.int64) if curve else None,
        curve_accuracy=np.array([[np.nan if x is None else x for x in r] for r in curve["accuracy"]], dtype=float)
        if curve else None,
        outcomes=dict(data.get("outcomes") or {}),
        split=tuple(data["split"]) if data.get("split") is not None else None, kernel=K, kernel_meta=meta,
    )


def read_success_matrix(path: str | Path) -> SuccessMatrix:
    """Read and validate a success-matrix file; errors name the file."""
    p = Path(path)
    if p.is_dir():
        inside = p / "success_matrix.json"
        hint = (f"pass {inside}" if inside.is_file() else
                "pass a success-matrix file (write one with `python -m mrl_llm success-matrix --run RUN_DIR`)")
        raise SuccessMatrixError(f"success matrix {p} is a directory; {hint}")
    if not p.is_file():
        raise SuccessMatrixError(f"success matrix {p} does not exist; write one with `python -m mrl_llm success-matrix "
                                 "--run RUN_DIR`")
    data = read_json_document(p, SuccessMatrixError, "success matrix",
                              "write it again from the run (`python -m mrl_llm success-matrix --run RUN_DIR`)")
    return from_dict(data, where=f"success matrix {p}")


def write_success_matrix(path: str | Path, matrix: SuccessMatrix) -> Path:
    """Write ``matrix`` as JSON, gzip-compressed when ``path`` ends in ``.gz`` (atomically: a temporary file renamed
    over ``path``)."""
    return write_json_document(path, matrix.to_dict())
