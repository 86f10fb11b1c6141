"""``bandit_sim sweep``: run every point of a grid and write one table and one combined plot.

Outputs under ``DIR``: ``sweep.csv`` (one row per point x regime x policy: the grid values and the
final-step seed means of the summary metrics), ``sweep.json`` (the grid and the same rows) and
``sweep.png`` (per axis: final accuracy and rescue-set accuracy per regime, averaged over the other axes
and the policies).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from tqdm import tqdm  # noqa: E402

from bandit_sim.presets import SweepGrid, apply_point  # noqa: E402
from bandit_sim.results import SUMMARY_KEYS, final_policy_stats  # noqa: E402
from bandit_sim.runner import run_config, scenario_of  # noqa: E402


def run_sweep(grid: SweepGrid, out_dir: str | Path, *, workers: int = 1, progress: bool = True) -> list[dict]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    points = grid.points()
    for point in tqdm(points, desc="grid points", disable=not progress):
        cfg = apply_point(grid.base, point)
        res = run_config(cfg, scenario_of(cfg), workers=workers)
        for r, name in enumerate(res.regimes):
            for p, pol in enumerate(res.policy_names):
                stats = final_policy_stats(res, r, p)
                rows.append({**point, "regime": name, "policy": pol, **{k: stats[k] for k in SUMMARY_KEYS}})
    with open(out / "sweep.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    (out / "sweep.json").write_text(json.dumps({"axes": {k: list(v) for k, v in grid.axes.items()}, "rows": rows},
                                               indent=1) + "\n")
    plot_sweep(grid, rows, out / "sweep.png")
    return rows


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
