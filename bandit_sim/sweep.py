"""``bandit_sim sweep``: run every point of a grid, one result file per point, then one table and one plot.

**The schedule** (:func:`run_sweep`, one loop whatever the runtime): the points not yet finished in
``DIR/points/`` are handed to a runtime — ``sequential`` (one point after another in this process, each
sharded over ``workers`` processes, :func:`bandit_sim.runner.run_config`) or ``ray`` (points as Ray
tasks in parallel, :mod:`bandit_sim.sweep_ray`). Each finished point is written at once and atomically
(a temporary file renamed) to ``DIR/points/<key>.json``; a failing point is retried once, then written to
``DIR/failed/<key>.json`` with its error, and the sweep goes on. ``--resume DIR`` skips the finished
points (a failed one is tried again); the grid must be the one ``DIR/grid.json`` records. A progress bar
counts points with an ETA.

**Outputs** under ``DIR``, from the point files in grid order (so a resumed sweep, a Ray sweep and a
sequential one give the same rows): ``sweep.csv`` (one row per point x regime x policy: the grid values,
the final-step seed means of the summary metrics and the 95 % half widths of accuracy, rescue accuracy and
KL), ``sweep.json`` (the grid, the rows, the failed points with their errors, the runtime and wall time)
and ``sweep.png`` (per axis: final accuracy and rescue-set accuracy per regime, averaged over the other
axes and the policies).
"""

from __future__ import annotations

import csv
import json
import math
import os
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from tqdm import tqdm  # noqa: E402

from bandit_sim.config import SimConfig  # noqa: E402
from bandit_sim.results import SUMMARY_KEYS, final_policy_stats  # noqa: E402
from bandit_sim.runner import run_config, scenario_of  # noqa: E402
from bandit_sim.sweep_config import SweepGrid, apply_point  # noqa: E402
from shared_interfaces import out_paths  # noqa: E402
from shared_interfaces.config_io import ConfigError  # noqa: E402

ROW_CI_KEYS = ("accuracy_ci95", "rescue_accuracy_ci95", "kl_to_init_ci95")
ATTEMPTS = 2  # a failing point is tried twice, then reported
PointFn = Callable[[SimConfig, dict, int], dict]


def _value_key(v: float) -> str:
    """``v`` as short as it can be written and read back exactly: ``0.2``, ``5``, ``0.1234561`` (``:g`` keeps 6
    digits, so 0.1234561 and 0.1234562 would share a point file)."""
    short = f"{v:g}"
    return short if float(short) == v else repr(v)


def point_key(point: dict[str, float]) -> str:
    """The point's file name stem, e.g. ``overlap=0.2,group_size=4``; distinct points have distinct keys."""
    return ",".join(f"{k}={_value_key(v)}" if isinstance(v, float) else f"{k}={v}"
                    for k, v in point.items()) or "base"


def run_point(base: SimConfig, point: dict[str, float], workers: int = 1) -> dict[str, Any]:
    """Run one grid point: ``{"rows": [...], "wall_s"}`` (rows as in ``sweep.csv``)."""
    t0 = time.perf_counter()
    cfg = apply_point(base, point)
    res = run_config(cfg, scenario_of(cfg), workers=workers)
    rows = []
    for r, name in enumerate(res.regimes):
        for p, pol in enumerate(res.policy_names):
            stats = final_policy_stats(res, r, p)
            rows.append({**point, "regime": name, "policy": pol,
                         **{k: stats[k] for k in SUMMARY_KEYS + ROW_CI_KEYS}})
    return {"rows": rows, "wall_s": time.perf_counter() - t0}


class Runtime(Protocol):
    """Where points run: ``submit`` queues one, ``results`` yields ``(tag, value, error)`` as they finish
    (``error`` a one-line string when the point raised) until nothing is queued."""

    def submit(self, tag: Any, base: SimConfig, point: dict) -> None: ...

    def results(self) -> Iterator[tuple[Any, dict | None, str | None]]: ...

    def close(self) -> None: ...


def describe_error(err: BaseException) -> str:
    """One line: the exception's type and message, and where it was raised."""
    tb = traceback.extract_tb(err.__traceback__)
    where = f" (at {Path(tb[-1].filename).name}:{tb[-1].lineno})" if tb else ""
    msg = " ".join(str(err).split()) or "no message"
    return f"{type(err).__name__}: {msg}{where}"


@dataclass
class SequentialRuntime:
    """Points one after another in this process, each sharded over ``workers`` processes."""

    workers: int = 1
    point_fn: PointFn = run_point
    queue: deque = field(default_factory=deque)

    def submit(self, tag: Any, base: SimConfig, point: dict) -> None:
        self.queue.append((tag, base, point))

    def results(self) -> Iterator[tuple[Any, dict | None, str | None]]:
        while self.queue:
            tag, base, point = self.queue.popleft()
            try:
                yield tag, self.point_fn(base, point, self.workers), None
            except Exception as err:  # a failing point is reported, never raised out of the sweep
                yield tag, None, describe_error(err)

    def close(self) -> None:
        pass


@dataclass
class SweepResult:
    """The rows of every finished point (grid order), the failed points, and how the run went."""

    rows: list[dict]
    failures: list[dict]
    points: int
    ran: int
    wall_s: float


def write_atomic(path: Path, data: dict) -> None:
    """Write JSON to ``path`` through a temporary file renamed over it (never a half-written file)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1, allow_nan=False) + "\n")
    os.replace(tmp, path)


def prepare_dir(grid: SweepGrid, out: Path, *, resume: bool) -> dict[str, dict]:
    """Create ``out`` (or check it on resume); returns the finished points' files by key."""
    ident = grid.to_dict()
    ident_path = out / "grid.json"
    if resume:
        if not ident_path.is_file():
            raise ConfigError(f"--resume {out}: no grid.json there; it is not a sweep directory (start one with --out)")
        old = read_grid_record(ident_path)
        if {k: old.get(k) for k in ("base", "axes")} != {k: ident[k] for k in ("base", "axes")}:
            raise ConfigError(f"--resume {out}: that sweep was made by another grid ({old.get('name')}); resume it with "
                              "the same grid, or start a new --out")
        if list(old["axes"]) != list(ident["axes"]):
            raise ConfigError(f"--resume {out}: that sweep's axes were {list(old['axes'])}, this grid's are "
                              f"{list(ident['axes'])} (the same in another order names every point anew); list "
                              "them in the recorded order")
    else:
        if out.exists() and not out.is_dir():
            raise ConfigError(f"--out {out} is a file; give a directory for the sweep's outputs")
        if (out / "points").is_dir() and any((out / "points").glob("*.json")):
            raise ConfigError(f"--out {out} already holds a sweep's points; continue it with --resume {out} or pick "
                              "a new directory")
        if out.is_dir() and any(out.iterdir()) and not ident_path.is_file():
            raise ConfigError(f"--out {out} is a non-empty directory that holds no sweep (no grid.json); give a new "
                              "or empty directory")
        out_paths.check_creatable(out, flag="--out", dest=out)
        out.mkdir(parents=True, exist_ok=True)
        write_atomic(ident_path, ident)
    for sub in ("points", "failed"):
        if (out / sub).exists() and not (out / sub).is_dir():
            raise ConfigError(f"{out / sub} is a file where the sweep keeps its {sub} points; move it away")
        (out / sub).mkdir(exist_ok=True)
    keys = {point_key(p): p for p in grid.points()}
    fields = {*grid.axes, "regime", "policy", *SUMMARY_KEYS, *ROW_CI_KEYS}  # a row of run_point
    done = {}
    for f in sorted((out / "points").glob("*.json")):
        done[f.stem] = read_point_file(f, keys, fields)
    return done


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def read_point_file(f: Path, keys: dict[str, dict], fields: set[str]) -> dict[str, Any]:
    """A finished point's file ``points/<key>.json``, checked before a resume uses it (and before anything is
    rewritten): a UTF-8 JSON object (no NaN / Infinity) ``{"key", "point", "rows", ...}`` whose ``key`` is the
    file's name and the key of its ``point``, a point of this grid, and whose rows have this grid's fields, the
    point's axis values, names as strings and metrics as finite numbers or null. Anything else is a
    :class:`ConfigError` naming the file and saying to delete it (a resume then reruns that point)."""
    fix = "delete it and --resume to rerun that point"
    if not f.is_file():
        raise ConfigError(f"{f} is not a file (a directory or a special file is in a point's place); remove it and "
                          "--resume to rerun that point")
    try:
        data = json.loads(f.read_bytes().decode("utf-8"), parse_constant=_no_constant)
    except UnicodeDecodeError as err:
        raise ConfigError(f"{f} is not valid JSON (not UTF-8 text: {err.reason} at byte {err.start}); {fix}") from err
    except (json.JSONDecodeError, ValueError, RecursionError) as err:
        msg = "nested too deeply" if isinstance(err, RecursionError) else err
        raise ConfigError(f"{f} is not valid JSON ({msg}); {fix}") from err
    rows = data.get("rows") if isinstance(data, dict) else None
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise ConfigError(f"{f} is not a sweep point's result (no list of rows); {fix}")
    bad = next((r for r in rows if set(r) != fields), None) if rows else {}
    if bad is not None:
        raise ConfigError(f"{f} is not a sweep point's result of this grid (a row needs the fields "
                          f"{sorted(fields)}, got {sorted(bad)}); {fix}")
    point = data.get("point")
    axes = list(next(iter(keys.values()), {}))
    if not isinstance(point, dict) or list(point) != axes or not all(_is_number(v) for v in point.values()):
        raise ConfigError(f"{f}: its 'point' is not a mapping of this grid's axes {axes} to numbers ({point!r:.80}); "
                          f"{fix}")
    own = point_key(point)
    if data.get("key") != f.stem or own != f.stem:
        raise ConfigError(f"{f} holds the result of point {data.get('key')!r} (its point {own}), not of {f.stem}: a "
                          f"point file copied or renamed over another's; {fix}")
    if f.stem not in keys or keys[f.stem] != point:
        raise ConfigError(f"{f}: point {f.stem} is not a point of this grid; {fix}")
    for i, r in enumerate(rows):
        wrong = next((k for k in point if r[k] != point[k] or not _is_number(r[k])), None)
        wrong = wrong or next((k for k in ("regime", "policy") if not isinstance(r[k], str)), None)
        wrong = wrong or next((k for k in (*SUMMARY_KEYS, *ROW_CI_KEYS)
                               if r[k] is not None and not (_is_number(r[k]) and math.isfinite(r[k]))), None)
        if wrong is not None:
            raise ConfigError(f"{f}: rows[{i}].{wrong} = {r[wrong]!r:.60} is not this point's value (axes: the "
                              f"point's numbers; regime, policy: names; metrics: finite numbers or null); {fix}")
    return data


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def read_grid_record(path: Path) -> dict[str, Any]:
    """A sweep directory's ``grid.json`` (:meth:`SweepGrid.to_dict`), checked: a mapping with ``name``, ``base``
    (a mapping) and ``axes`` (axis -> list of numbers)."""
    try:
        data = json.loads(path.read_bytes().decode("utf-8"), parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as err:  # JSONDecodeError is a ValueError
        msg = "nested too deeply" if isinstance(err, RecursionError) else err
        raise ConfigError(f"{path} is not valid JSON ({msg}); pass the sweep's --grid to rewrite it") from err
    if (not isinstance(data, dict) or set(data) != {"name", "base", "axes"} or not isinstance(data["base"], dict)
            or not isinstance(data["axes"], dict) or not all(isinstance(v, list) for v in data["axes"].values())):
        raise ConfigError(f"{path}: not a grid record (keys name, base, axes; axes: lists of values); pass the "
                          "sweep's --grid")
    return data


def make_runtime(runtime: str, *, workers: int, ray_address: str | None, point_fn: PointFn) -> Runtime:
    if runtime == "sequential":
        return SequentialRuntime(workers=workers, point_fn=point_fn)
    if runtime == "ray":
        from bandit_sim.sweep_ray import RayRuntime

        return RayRuntime.start(address=ray_address, point_fn=point_fn)
    raise ConfigError(f"unknown sweep runtime {runtime!r}; use sequential or ray")


def run_sweep(grid: SweepGrid, out_dir: str | Path, *, runtime: Literal["sequential", "ray"] = "sequential",
              workers: int = 1, resume: bool = False, ray_address: str | None = None, progress: bool = True,
              point_fn: PointFn = run_point) -> SweepResult:
    """Run the grid's unfinished points on ``runtime`` and write the outputs (module docstring)."""
    out = Path(out_dir)
    done = prepare_dir(grid, out, resume=resume)
    points = grid.points()
    keys = [point_key(p) for p in points]
    todo = [(k, p) for k, p in zip(keys, points, strict=True) if k not in done]
    t0 = time.perf_counter()
    failures: list[dict] = []
    if todo:
        rt = make_runtime(runtime, workers=workers, ray_address=ray_address, point_fn=point_fn)
        bar = tqdm(total=len(points), initial=len(points) - len(todo), desc="grid points", unit="point",
                   disable=not progress, smoothing=0.0)
        try:
            failures = _schedule(rt, grid.base, todo, out, done, bar)
        finally:
            bar.close()
            rt.close()
    for k in done:
        (out / "failed" / f"{k}.json").unlink(missing_ok=True)
    rows = [row for k in keys if k in done for row in done[k]["rows"]]
    result = SweepResult(rows, failures, len(points), len(todo), time.perf_counter() - t0)
    write_outputs(grid, out, result, runtime=runtime, workers=workers)
    return result


def _schedule(rt: Runtime, base: SimConfig, todo: list[tuple[str, dict]], out: Path, done: dict[str, dict],
              bar: tqdm) -> list[dict]:
    attempts: dict[str, int] = {}
    point_of = dict(todo)
    for k, p in todo:
        attempts[k] = 1
        rt.submit(k, base, p)
    failures = []
    for k, value, error in rt.results():
        if error is None:
            data = {"key": k, "point": point_of[k], "attempts": attempts[k], **value}
            write_atomic(out / "points" / f"{k}.json", data)
            done[k] = data
            bar.update(1)
        elif attempts[k] < ATTEMPTS:
            attempts[k] += 1
            rt.submit(k, base, point_of[k])
        else:
            fail = {"key": k, "point": point_of[k], "attempts": attempts[k], "error": error}
            write_atomic(out / "failed" / f"{k}.json", fail)
            failures.append(fail)
            bar.update(1)
    return failures


def write_outputs(grid: SweepGrid, out: Path, result: SweepResult, *, runtime: str, workers: int) -> None:
    rows = result.rows
    if rows:
        tmp = out / "sweep.csv.tmp"
        with open(tmp, "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
        os.replace(tmp, out / "sweep.csv")  # a failure half-way leaves the earlier table whole
        plot_sweep(grid, rows, out / "sweep.png")
    summary = {"grid": grid.name, "axes": {k: list(v) for k, v in grid.axes.items()}, "points": result.points,
               "finished": result.points - len(result.failures), "ran_now": result.ran, "runtime": runtime,
               "workers": workers, "wall_s": round(result.wall_s, 3), "failures": result.failures, "rows": rows}
    write_atomic(out / "sweep.json", summary)


def plot_sweep(grid: SweepGrid, rows: list[dict], path: Path) -> Path:
    axes_names = list(grid.axes)
    regimes = list(dict.fromkeys(r["regime"] for r in rows))
    cmap = plt.get_cmap("tab10")
    fig, axs = plt.subplots(2, len(axes_names), figsize=(3.4 * len(axes_names), 5.6), squeeze=False)
    for c, axis in enumerate(axes_names):
        values = grid.axes[axis]
        for m, key in enumerate(("accuracy", "rescue_accuracy")):
            ax = axs[m, c]
            for k, reg in enumerate(regimes):
                ys = []
                for v in values:
                    sel = [r[key] for r in rows if r["regime"] == reg and r[axis] == v and r[key] is not None]
                    ys.append(np.mean(sel) if sel else np.nan)
                ax.plot(values, ys, "o-", color=cmap(k), label=reg, ms=4)
            ax.set_xlabel(axis)
            ax.set_ylabel(key.replace("_", " "), fontsize=9)
            ax.grid(alpha=0.3)
    axs[0, 0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path
