"""Point functions for the sweep tests: a point that always fails, one that fails on its first try only
(the marker files live in a directory, so that Ray worker processes see them too)."""

from __future__ import annotations

from pathlib import Path

from bandit_sim.sweep import run_point


def fail_on_overlap(base, point, workers, *, overlap: float = 0.8):
    if point.get("overlap") == overlap:
        raise RuntimeError(f"injected failure at overlap {overlap}")
    return run_point(base, point, workers)


def fail_first_try(base, point, workers, *, marker_dir: str):
    marker = Path(marker_dir) / ",".join(f"{k}={v}" for k, v in point.items())
    if not marker.exists():
        marker.write_text("tried once")
        raise RuntimeError("injected first-try failure")
    return run_point(base, point, workers)


def niceness_point(base, point, workers):
    """No run: the niceness of the process the point ran in (kept in the point's file)."""
    import os

    return {"rows": [], "wall_s": 0.0, "nice": os.nice(0)}
