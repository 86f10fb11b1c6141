"""Sweep grids as YAML: a run preset, optional overrides of its keys, and the axes to vary.

A grid file (``bandit_sim/grids/NAME.yaml`` for the named grids ``paper``, ``paper-full``, ``smoke``)::

    base: paper                    # a run preset (bandit_sim.presets.RUN_PRESETS)
    overrides:                     # optional: SimConfig keys over the preset, loaded like `run --config`
      generator: {n_contexts: 128}
      seeds: 16
    axes:                          # each a non-empty list of numbers; the sweep runs the full product
      overlap: [0.2, 0.5, 0.8]     # scenario overlap (unsolved is capped at 1 - overlap)
      group_size: [4, 8, 16]       # G
      thl_sigma: [0.0, 0.5, 1.0]   # THL residual on prp_thl's denominator
      sgt_weight: [0.1, 1.0]       # SGT's lambda
      lr: [5.0, 20.0]

Unknown top-level keys, unknown axes and unknown override keys are :class:`ConfigError` naming them.
The grid's size (the product of the axes' lengths) is checked first, against ``max_points`` (default
:data:`DEFAULT_MAX_POINTS`, ``sweep --max-points``); then every point's run config is built (and so
validated) when the grid is loaded.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bandit_sim.config import SimConfig, config_from_mapping
from bandit_sim.presets import get_preset
from shared_interfaces.config_io import INT_MAX, INT_MIN, ConfigError, load_yaml, to_mapping

#: axes a sweep may vary, and what each changes in the run config (:func:`apply_point`)
SWEEP_AXES = ("overlap", "group_size", "thl_sigma", "sgt_weight", "lr")
GRID_KEYS = ("base", "overrides", "axes")
GRIDS_DIR = Path(__file__).parent / "grids"
#: the most points a grid may have unless raised (``sweep --max-points``); the paper grids have 108
DEFAULT_MAX_POINTS = 10_000


def check_grid_size(axes: Mapping[str, Any], max_points: int, *, where: str) -> int:
    """The number of points of ``axes``' full product, computed without building it; more than ``max_points`` is a
    :class:`ConfigError` giving the number and the flag that raises the limit."""
    n = math.prod(len(v) for v in axes.values())
    if n > max_points:
        sizes = " x ".join(str(len(v)) for v in axes.values())
        raise ConfigError(f"{where}: {sizes} = {n} points, more than the limit of {max_points} (each point is a whole "
                          f"run); shorten the axes, or pass --max-points {n} to run them all")
    return n


@dataclass(frozen=True)
class SweepGrid:
    """A base run config plus axes; ``points()`` is their full product in axis order (last axis fastest)."""

    base: SimConfig
    axes: dict[str, tuple[float, ...]]
    name: str = "grid"

    def __post_init__(self) -> None:
        unknown = sorted(set(self.axes) - set(SWEEP_AXES))
        if unknown:
            raise ConfigError(f"sweep grid {self.name}: unknown axes {unknown}; known: {list(SWEEP_AXES)}")
        for axis, values in self.axes.items():
            if not values:
                raise ConfigError(f"sweep grid {self.name}: axis {axis} has no values; give a list of numbers")

    def points(self) -> list[dict[str, float]]:
        pts: list[dict[str, float]] = [{}]
        for name, values in self.axes.items():
            pts = [{**p, name: v} for p in pts for v in values]
        return pts

    def to_dict(self) -> dict[str, Any]:
        """What identifies the grid's results (written beside them; a resumed sweep must match it)."""
        return {"name": self.name, "base": to_mapping(self.base), "axes": {k: list(v) for k, v in self.axes.items()}}


def apply_point(base: SimConfig, point: Mapping[str, float]) -> SimConfig:
    """The run config of one grid point; a value the point's key cannot change (overlap over a scenario file,
    which no generator makes) or that is not finite / whole where it must be is a :class:`ConfigError`."""
    cfg = base
    for name, v in point.items():
        try:
            finite = math.isfinite(v)
        except OverflowError:  # an integer beyond any float
            finite = False
        if not finite:
            shown = v if not isinstance(v, int) or v.bit_length() <= 256 else f"an integer of {v.bit_length()} bits"
            raise ConfigError(f"axis {name}: {shown} is not a finite number")
        if name == "overlap" and cfg.scenario is not None:
            raise ConfigError(f"axis overlap changes the generated scenario, but the config reads scenario "
                              f"{cfg.scenario}; remove the overlap axis or the scenario override")
        if name == "group_size" and v != int(v):
            raise ConfigError(f"axis group_size: {v} is not a whole number")
        if name == "group_size" and not INT_MIN <= v <= INT_MAX:
            raise ConfigError(f"axis group_size: {v} does not fit a signed 64-bit integer (|value| < 2**63)")
        if name == "overlap":
            gen = cfg.generator
            cfg = replace(cfg, generator=replace(gen, overlap=float(v), unsolved=min(gen.unsolved, 1.0 - float(v))))
        elif name == "group_size":
            cfg = replace(cfg, group_size=int(v))
        elif name == "sgt_weight":
            cfg = replace(cfg, sgt=replace(cfg.sgt, weight=float(v)))
        elif name in ("thl_sigma", "lr"):
            cfg = replace(cfg, **{name: float(v)})
        else:
            raise ConfigError(f"unknown sweep axis {name!r}; known: {list(SWEEP_AXES)}")
    return cfg


def grid_from_mapping(data: Any, *, where: str = "sweep grid", max_points: int = DEFAULT_MAX_POINTS) -> SweepGrid:
    """A :class:`SweepGrid` from a parsed YAML mapping (module docstring); errors name the key."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: expected a mapping with keys {list(GRID_KEYS)}, got {type(data).__name__}")
    unknown = sorted(set(data) - set(GRID_KEYS))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}; known keys: {list(GRID_KEYS)}")
    if "base" not in data or not isinstance(data["base"], str):
        raise ConfigError(f"{where}: 'base' must name a run preset, e.g. base: paper")
    base = get_preset(data["base"])
    overrides = data.get("overrides") or {}
    if not isinstance(overrides, Mapping):
        raise ConfigError(f"{where}: 'overrides' must be a mapping of SimConfig keys")
    base = config_from_mapping(overrides, base, where=f"{where}: overrides")
    axes_in = data.get("axes")
    if not isinstance(axes_in, Mapping) or not axes_in:
        raise ConfigError(f"{where}: 'axes' must be a non-empty mapping of axis -> list of numbers; known axes: "
                          f"{list(SWEEP_AXES)}")
    axes: dict[str, tuple[float, ...]] = {}
    for axis, values in axes_in.items():
        if axis not in SWEEP_AXES:
            raise ConfigError(f"{where}: unknown axis {axis!r}; known axes: {list(SWEEP_AXES)}")
        if not isinstance(values, list | tuple) or not values:
            raise ConfigError(f"{where}: axis {axis} must be a non-empty list of numbers, got {values!r}")
        bad = [v for v in values if isinstance(v, bool) or not isinstance(v, numbers.Real)]
        if bad:
            raise ConfigError(f"{where}: axis {axis} has non-numeric value(s) {bad}")
        if len(set(values)) != len(values):
            raise ConfigError(f"{where}: axis {axis} lists a value twice: {list(values)}")
        axes[str(axis)] = tuple(values)
    check_grid_size(axes, max_points, where=where)  # before the product is built
    grid = SweepGrid(base, axes, name=where)
    for point in grid.points():
        try:
            apply_point(base, point)
        except ConfigError as err:
            raise ConfigError(f"{where}: point {point} is invalid: {err}") from err
    return grid


def named_grids() -> list[str]:
    return sorted(p.stem for p in GRIDS_DIR.glob("*.yaml"))


def load_grid(name_or_path: str | Path, *, max_points: int = DEFAULT_MAX_POINTS) -> SweepGrid:
    """A named grid (``paper``, ``paper-full``, ``smoke``) or a YAML file, of at most ``max_points`` points."""
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml"):
        if not p.is_file():
            raise ConfigError(f"sweep grid file {p} does not exist")
        grid = grid_from_mapping(load_yaml(p), where=f"sweep grid {p}", max_points=max_points)
        return replace(grid, name=str(p))
    path = GRIDS_DIR / f"{name_or_path}.yaml"
    if not path.is_file():
        raise ConfigError(f"unknown sweep grid {str(name_or_path)!r}; named grids: {named_grids()}, or give a "
                          "YAML file (base + axes)")
    grid = grid_from_mapping(load_yaml(path), where=f"sweep grid {name_or_path}", max_points=max_points)
    return replace(grid, name=str(name_or_path))
