"""What a run writes: ``summary.json``, per-step metrics (``metrics.csv`` with seed means and 95 %
intervals, ``metrics.npz`` with every seed) and, via :mod:`bandit_sim.plots`, the PNG figures.

``metrics.csv`` has a row per (step, regime, policy, metric) the metric applies to; its ``ci95`` cell is
empty where fewer than two seeds give the metric (no interval), like the summary's null ``_ci95``.

``summary.json``::

    {"config": {...}, "scenario": {...},
     "regimes": {NAME: {"policies": [{"accuracy", "rescue_accuracy", "support", "kl_to_init", "entropy",
                                      "ratio_variance", "sgt_activations", ...}, ...]}}}

Values are final-step means over seeds, null where a metric does not apply (rescue accuracy without a
rescue set, ratio variance for regimes that train on no peer samples); policies in scenario order.
``sgt_activations`` is the total number of SGT gate openings per seed over the run (mean over seeds).
Step diagnostics (ratio variances, gradient norm, clip fraction) are means over the last
``record_every`` steps; ``ratio_variance_median`` is their median over seeds (the ratio is heavy-tailed).
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np

from bandit_sim.engine import SimResult
from bandit_sim.metrics import ALL_METRICS, seed_summary
from shared_interfaces import out_paths
from shared_interfaces.config_io import ConfigError

SUMMARY_KEYS = (
    "accuracy", "rescue_accuracy", "support", "kl_to_init", "entropy", "ratio_variance", "sgt_activations",
)
EXTRA_KEYS = (
    "kl_outside_rescue", "ratio_variance_median", "true_ratio_variance", "grad_norm", "grad_norm_seed_var",
    "clip_fraction",
)


def _num(x: float) -> float | None:
    return None if x is None or not math.isfinite(float(x)) else float(x)


def final_policy_stats(result: SimResult, r: int, p: int) -> dict[str, float | None]:
    """One policy's final-step means over seeds (with ``_ci95`` half widths) under regime ``r``."""
    m = result.metrics
    out: dict[str, float | None] = {}
    for key in SUMMARY_KEYS + EXTRA_KEYS:
        if key == "sgt_activations":
            vals = m["sgt_activations_total"][-1, r, :, p]
        elif key == "grad_norm_seed_var":
            out[key] = _num(seed_summary(m["grad_norm"][-1, r, :, p], axis=0)["var"])
            continue
        elif key == "ratio_variance_median":  # the density ratio is heavy-tailed: a robust companion
            vals = m["ratio_variance"][-1, r, :, p]
            out[key] = None if np.isnan(vals).all() else _num(np.nanmedian(vals))
            continue
        else:
            vals = m[key][-1, r, :, p]
        s = seed_summary(vals, axis=0)
        out[key] = _num(s["mean"])
        if key in ("accuracy", "rescue_accuracy", "kl_to_init"):
            out[key + "_ci95"] = _num(s["ci95"])
    return out


def summary_dict(result: SimResult, scenario_info: dict | None = None) -> dict:
    return {
        "config": result.config.to_dict(),
        "scenario": {
            "policy_names": list(result.policy_names),
            "rescue_set_sizes": [int(x) for x in result.rescue_sizes],
            **(scenario_info or {}),
        },
        "wall_seconds": round(result.wall_s, 3),
        "final_step": int(result.steps[-1]),
        "regimes": {
            name: {"policies": [final_policy_stats(result, r, p) for p in range(len(result.policy_names))]}
            for r, name in enumerate(result.regimes)
        },
    }


def write_metrics(result: SimResult, out_dir: Path) -> None:
    np.savez_compressed(
        out_dir / "metrics.npz", steps=result.steps, regimes=np.array(result.regimes),
        policies=np.array(result.policy_names), **{k: result.metrics[k] for k in ALL_METRICS},
    )
    with open(out_dir / "metrics.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["step", "regime", "policy", "metric", "mean", "ci95", "seed_var"])
        for key in ALL_METRICS:
            s = seed_summary(result.metrics[key], axis=2)  # [T, R, P]
            for t, step in enumerate(result.steps):
                for r, name in enumerate(result.regimes):
                    for p, pol in enumerate(result.policy_names):
                        mean, ci, var = (s[q][t, r, p] for q in ("mean", "ci95", "var"))
                        if math.isnan(mean):
                            continue
                        w.writerow([int(step), name, pol, key, f"{mean:.6g}", "" if math.isnan(ci) else f"{ci:.6g}",
                                    f"{var:.6g}"])


#: Every file a run writes (:func:`write_run`); a rerun into the same directory removes them first, so no
#: figure of the earlier run is left beside the new summary.
RUN_FILES = ("summary.json", "metrics.csv", "metrics.npz", "learning_curves.png", "stability_support.png")


def check_out_dir(out_dir: str | Path) -> Path:
    """``out_dir`` as a path a run may be written to, checked before the run: a new or empty directory, or an
    earlier run's (which the run replaces); anything else is a :class:`ConfigError` saying what to give."""
    if not str(out_dir).strip():
        raise ConfigError("--out is empty; give a directory for the run's outputs")
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file; give a directory for the run's outputs")
    if out.is_dir() and any(out.iterdir()) and not (out / "summary.json").is_file():
        raise ConfigError(f"--out {out} is a non-empty directory that holds no bandit_sim run; give a new or "
                          "empty directory (a directory with an earlier run's summary.json is replaced)")
    out_paths.check_creatable(out, flag="--out", dest=out)
    return out


def check_out_file(path: str | Path) -> Path:
    """``path`` as a file an output may be written to (``scenario`` / ``predict --out``), checked before the
    work: not empty, not a directory, under a writable directory; else a :class:`ConfigError`."""
    if not str(path).strip():
        raise ConfigError("--out is empty; give a file name")
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"--out {p} is a directory; give a file name (e.g. {p / 'out.json'})")
    out_paths.check_out_file(p, "--out", example="out.json")
    return p


def write_run(result: SimResult, out_dir: str | Path, scenario_info: dict | None = None, plots: bool = True) -> dict:
    """Write every output of a run under ``out_dir`` (:func:`check_out_dir`'s; an earlier run's files there are
    removed first); returns the summary."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name in RUN_FILES:
        (out / name).unlink(missing_ok=True)
    summary = summary_dict(result, scenario_info)
    (out / "summary.json").write_text(json.dumps(summary, indent=2, allow_nan=False) + "\n")
    write_metrics(result, out)
    if plots:
        from bandit_sim.plots import plot_run

        plot_run(result, out)
    return summary
