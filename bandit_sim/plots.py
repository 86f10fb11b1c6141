"""PNG figures of a run (matplotlib, Agg backend, small files).

* ``learning_curves.png``: accuracy, rescue-set accuracy, KL to the initial policy and entropy against
  the step, one line per regime (policies averaged), bands = 95 % intervals over seeds;
* ``stability_support.png``: the stability–support picture — final rescue-set accuracy (y) against
  KL(pi_t || pi_0) (left) and against PRP's density-ratio variance ``Var[pi_old / mu]`` (right), one point per regime and
  policy, with 95 % intervals.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from bandit_sim.metrics import seed_summary  # noqa: E402

CURVES = (
    ("accuracy", "expected accuracy"),
    ("rescue_accuracy", "rescue-set accuracy"),
    ("kl_to_init", "KL(pi_t || pi_0)"),
    ("entropy", "entropy"),
)
MARKERS = "osD^v<>"
DPI = 80


def _colors(n: int):
    cmap = plt.get_cmap("tab10")
    return [cmap(i % 10) for i in range(n)]


def plot_learning_curves(result, path: Path) -> Path:
    fig, axes = plt.subplots(1, len(CURVES), figsize=(4.0 * len(CURVES), 3.2))
    colors = _colors(len(result.regimes))
    for ax, (key, label) in zip(axes, CURVES, strict=True):
        vals = np.nanmean(result.metrics[key], axis=3) if not np.isnan(result.metrics[key]).all() else None
        if vals is None:
            ax.set_visible(False)
            continue
        s = seed_summary(vals, axis=2)  # [T, R]
        for r, name in enumerate(result.regimes):
            m, h = s["mean"][:, r], s["ci95"][:, r]
            if np.isnan(m).all():
                continue
            ax.plot(result.steps, m, color=colors[r], label=name, lw=1.4)
            ax.fill_between(result.steps, m - h, m + h, color=colors[r], alpha=0.2, lw=0)
        ax.set_title(label, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def plot_stability_support(result, path: Path) -> Path:
    fig, axes = plt.subplots(1, 2, figsize=(9.0, 3.6))
    colors = _colors(len(result.regimes))
    y = result.metrics["rescue_accuracy"][-1]  # [R, S, P]
    for ax, xkey, xlabel in (
        (axes[0], "kl_to_init", "KL(pi_t || pi_0), final"),
        (axes[1], "ratio_variance", "Var[pi_old / mu] of peer samples (PRP)"),
    ):
        x = result.metrics[xkey][-1]
        for r, name in enumerate(result.regimes):
            for p, pol in enumerate(result.policy_names):
                sx, sy = seed_summary(x[r, :, p], axis=0), seed_summary(y[r, :, p], axis=0)
                if np.isnan(sx["mean"]) or np.isnan(sy["mean"]):
                    continue
                ax.errorbar(sx["mean"], sy["mean"], xerr=sx["ci95"], yerr=sy["ci95"], fmt=MARKERS[p % len(MARKERS)],
                            color=colors[r], ms=6, capsize=2, label=f"{name} / {pol}")
        ax.set_xlabel(xlabel, fontsize=9)
        ax.set_ylabel("rescue-set accuracy, final", fontsize=9)
        ax.grid(alpha=0.3)
    for ax in axes:
        ax.set_ylim(-0.05, 1.05)
    if axes[1].has_data():
        axes[1].set_xscale("symlog", linthresh=1e-2)
        axes[1].set_xlim(left=0)
    else:
        axes[1].text(0.5, 0.5, "no PRP regime in this run", ha="center", va="center", transform=axes[1].transAxes)
    axes[0].legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def plot_run(result, out_dir: Path) -> list[Path]:
    if np.isnan(result.metrics["rescue_accuracy"]).all():
        return [plot_learning_curves(result, out_dir / "learning_curves.png")]
    return [
        plot_learning_curves(result, out_dir / "learning_curves.png"),
        plot_stability_support(result, out_dir / "stability_support.png"),
    ]
