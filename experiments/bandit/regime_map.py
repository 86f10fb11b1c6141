"""The regime map of a bandit sweep: which regime wins where, by how much, and where the paper's claims hold.

    python -m experiments.bandit.regime_map --sweep DIR --out experiments/bandit/sweep_paper

Reads the sweep's point files (``DIR/points/*.json``, so a sweep still running can be mapped; without them
``DIR/sweep.json``) and writes
``regime_map.md`` (the tables), ``regime_map.json`` (the same numbers) and ``regime_map.png``.

**Cells.** For a pair of axes and a value of each, a regime's value of a metric (final ``accuracy``,
``rescue_accuracy``) is its mean over the grid points of that cell (every value of the other axes) and the
policies; its 95 % half width is ``sqrt(sum ci_i^2) / n`` over those ``n`` point-policy means, whose own
half widths ``ci_i`` are over the sweep's seeds (points and policies treated as independent). The
**winner** has the highest mean, the **margin** is its lead over the runner-up, with half width
``sqrt(ci_w^2 + ci_r^2)`` (treating the two regimes as independent: conservative, since they share the
scenario).

**Claims, point by point** (a point's value is the mean over policies, half width as above): a difference
``d`` with half width ``h`` is a *win* when ``d > max(h, min_diff)``, a *loss* when ``d < -max(h, min_diff)``,
otherwise a *tie*; ``min_diff`` (default 0.005) keeps differences of no practical size (two regimes both at
a rescue accuracy of 1e-18, whose seed interval is 0) from counting.
The claims: PRP (`prp_snapshot`, `prp_thl`) against GRPO; SGT's lead over the best other regime; XGRPO
against GRPO; each on final accuracy and on rescue-set accuracy. Each is summarised by the share of
points where it holds, overall and per value of every axis (the region).

**Stability beside support**: per regime the mean over the grid of the support side (rescue accuracy) and
the stability side (KL to the initial policy, entropy, Var[pi/mu] — the latter heavy-tailed, so its median
over points too), overall and per learning rate.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

METRICS = ("accuracy", "rescue_accuracy")
STABILITY = ("rescue_accuracy", "accuracy", "kl_to_init", "entropy", "ratio_variance")


def load_points(sweep_dir: Path) -> tuple[dict[str, list], list[dict]]:
    """``(axes, rows)`` from ``grid.json`` and the point files."""
    if not (sweep_dir / "points").is_dir() and (sweep_dir / "sweep.json").is_file():  # a committed result
        data = json.loads((sweep_dir / "sweep.json").read_text())
        return data["axes"], data["rows"]
    grid = json.loads((sweep_dir / "grid.json").read_text())
    rows = [r for f in sorted((sweep_dir / "points").glob("*.json")) for r in json.loads(f.read_text())["rows"]]
    if not rows:
        raise SystemExit(f"regime_map: no finished points under {sweep_dir / 'points'}")
    return grid["axes"], rows


def combine(rows: list[dict], key: str) -> tuple[float, float]:
    """Mean of ``key`` over ``rows`` and the half width ``sqrt(sum ci^2) / n`` (module docstring)."""
    vals = [(r[key], r.get(key + "_ci95") or 0.0) for r in rows if r.get(key) is not None]
    if not vals:
        return math.nan, math.nan
    n = len(vals)
    return float(np.mean([v for v, _ in vals])), math.sqrt(sum(c * c for _, c in vals)) / n


def regimes_of(rows: list[dict]) -> list[str]:
    return list(dict.fromkeys(r["regime"] for r in rows))


def cell_winner(rows: list[dict], key: str, regimes: list[str]) -> dict[str, Any]:
    vals = {reg: combine([r for r in rows if r["regime"] == reg], key) for reg in regimes}
    ranked = sorted((reg for reg in regimes if not math.isnan(vals[reg][0])), key=lambda g: -vals[g][0])
    if len(ranked) < 2:
        return {"winner": ranked[0] if ranked else None, "margin": math.nan, "margin_ci95": math.nan, "values": vals}
    w, r = ranked[0], ranked[1]
    return {"winner": w, "runner_up": r, "margin": vals[w][0] - vals[r][0],
            "margin_ci95": math.hypot(vals[w][1], vals[r][1]), "values": {g: list(v) for g, v in vals.items()}}


def pair_maps(axes: dict[str, list], rows: list[dict], regimes: list[str]) -> list[dict[str, Any]]:
    out = []
    for a, b in itertools.combinations(axes, 2):
        for key in METRICS:
            cells = [{"a": va, "b": vb, **cell_winner([r for r in rows if r[a] == va and r[b] == vb], key, regimes)}
                     for va in axes[a] for vb in axes[b]]
            out.append({"axes": [a, b], "metric": key, "cells": cells})
    return out


def point_values(rows: list[dict], axes: dict[str, list]) -> dict[tuple, dict[str, dict[str, tuple[float, float]]]]:
    """``{point: {regime: {metric: (mean over policies, half width)}}}``."""
    pts: dict[tuple, dict[str, list[dict]]] = {}
    for r in rows:
        pts.setdefault(tuple(r[a] for a in axes), {}).setdefault(r["regime"], []).append(r)
    return {p: {reg: {k: combine(rs, k) for k in METRICS} for reg, rs in by.items()} for p, by in pts.items()}


MIN_DIFF = 0.005


def _verdict(d: float, h: float, min_diff: float = MIN_DIFF) -> str | None:
    if math.isnan(d):
        return None
    t = max(h, min_diff)
    return "win" if d > t else "loss" if d < -t else "tie"


def claims(axes: dict[str, list], rows: list[dict]) -> list[dict[str, Any]]:
    pv = point_values(rows, axes)
    names = list(axes)
    out = []

    def add(label: str, metric: str, verdict_of) -> None:
        verdicts = {p: verdict_of(v) for p, v in pv.items()}
        verdicts = {p: x for p, x in verdicts.items() if x is not None}
        for what in ("win", "tie", "loss"):
            held = [p for p, x in verdicts.items() if x == what]
            region = {a: {str(v): f"{sum(1 for p in held if p[i] == v)}/{sum(1 for p in verdicts if p[i] == v)}"
                          for v in axes[a]} for i, a in enumerate(names)}
            out.append({"claim": label, "metric": metric, "verdict": what, "points": len(held), "of": len(verdicts),
                        "region": region})

    def diff(x: str, y: str, metric: str):
        def f(v):
            if x not in v or y not in v:
                return None
            (mx, hx), (my, hy) = v[x][metric], v[y][metric]
            return _verdict(mx - my, math.hypot(hx, hy))
        return f

    def sgt_lead(metric: str):
        def f(v):
            if "sgt" not in v:
                return None
            others = [(g, v[g][metric]) for g in v if g != "sgt" and not math.isnan(v[g][metric][0])]
            if not others:
                return None
            g, (mo, ho) = max(others, key=lambda t: t[1][0])
            ms, hs = v["sgt"][metric]
            return _verdict(ms - mo, math.hypot(hs, ho))
        return f

    for metric in METRICS:
        add("prp_snapshot vs grpo", metric, diff("prp_snapshot", "grpo", metric))
        add("prp_thl vs grpo", metric, diff("prp_thl", "grpo", metric))
        add("sgt vs the best other regime", metric, sgt_lead(metric))
        add("xgrpo vs grpo", metric, diff("xgrpo", "grpo", metric))
    return out


def stability_table(rows: list[dict], regimes: list[str], axes: dict[str, list]) -> list[dict[str, Any]]:
    out = []
    groups = [("all", None)] + ([("lr", v) for v in axes["lr"]] if "lr" in axes else [])
    for label, v in groups:
        sel = rows if v is None else [r for r in rows if r["lr"] == v]
        for reg in regimes:
            rs = [r for r in sel if r["regime"] == reg]
            entry = {"group": label if v is None else f"lr={v:g}", "regime": reg}
            for k in STABILITY:
                vals = [r[k] for r in rs if r.get(k) is not None]
                entry[k] = float(np.mean(vals)) if vals else None
            rv = [r["ratio_variance"] for r in rs if r.get("ratio_variance") is not None]
            entry["ratio_variance_median_over_points"] = float(np.median(rv)) if rv else None
            out.append(entry)
    return out


def _fmt(x: float | None, digits: int = 3) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def markdown(res: dict[str, Any]) -> str:
    axes = res["axes"]
    lines = [f"# Regime map of `{res['sweep']}` ({res['points']} points of {res['grid_points']})", "",
             "Generated by `python -m experiments.bandit.regime_map` (method in its docstring). Cell: winner, margin "
             "over the runner-up ± 95 % half width; `*` marks a margin within its interval or below 0.005 (no clear "
             "winner); — a cell with no finished point.", ""]
    for m in res["maps"]:
        a, b = m["axes"]
        lines += [f"### {m['metric']}: {a} × {b}", "", f"| {a} \\ {b} | " + " | ".join(str(v) for v in axes[b]) + " |",
                  "|---|" + "---|" * len(axes[b])]
        for va in axes[a]:
            cells = []
            for vb in axes[b]:
                c = next(c for c in m["cells"] if c["a"] == va and c["b"] == vb)
                if c["winner"] is None:
                    cells.append("—")
                    continue
                star = "*" if not c["margin"] > max(c["margin_ci95"], MIN_DIFF) else ""
                cells.append(f"{c['winner']} +{_fmt(c['margin'])} ± {_fmt(c['margin_ci95'])}{star}")
            lines.append(f"| {va} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += ["## Claims point by point", "",
              "Points where the claim's verdict holds / points; the region columns give the same count per axis value.",
              ""]
    head = [f"{a}={v}" for a in axes for v in axes[a]]
    lines += ["| claim | metric | verdict | points | " + " | ".join(head) + " |", "|---" * (4 + len(head)) + "|"]
    for c in res["claims"]:
        if c["points"] == 0:
            continue
        reg = [c["region"][a][str(v)] for a in axes for v in axes[a]]
        lines.append(f"| {c['claim']} | {c['metric']} | {c['verdict']} | {c['points']}/{c['of']} | " + " | ".join(reg) + " |")
    lines += ["", "## Stability beside support (means over the grid points and policies)", "",
              "| group | regime | rescue acc. | accuracy | KL(π‖π₀) | entropy | Var[π/μ] mean | Var[π/μ] median |",
              "|---|---|---|---|---|---|---|---|"]
    for s in res["stability"]:
        lines.append(f"| {s['group']} | {s['regime']} | {_fmt(s['rescue_accuracy'])} | {_fmt(s['accuracy'])} | "
                     f"{_fmt(s['kl_to_init'], 2)} | {_fmt(s['entropy'])} | {_fmt(s['ratio_variance'], 1)} | "
                     f"{_fmt(s['ratio_variance_median_over_points'], 2)} |")
    return "\n".join(lines) + "\n"


def plot(res: dict[str, Any], path: Path) -> None:
    regimes = res["regimes"]
    cmap = plt.get_cmap("tab10")
    maps = res["maps"]
    ncol = 4
    nrow = math.ceil(len(maps) / ncol)
    fig, axs = plt.subplots(nrow, ncol, figsize=(3.6 * ncol, 3.0 * nrow), squeeze=False)
    for k, m in enumerate(maps):
        ax = axs[k // ncol, k % ncol]
        a, b = m["axes"]
        va, vb = res["axes"][a], res["axes"][b]
        img = np.ones((len(va), len(vb), 3))
        for c in m["cells"]:
            i, j = va.index(c["a"]), vb.index(c["b"])
            if c["winner"] is not None:
                img[i, j] = cmap(regimes.index(c["winner"]))[:3]
            if c["winner"] is not None and not math.isnan(c["margin"]):
                ax.text(j, i, f"{c['margin']:+.2f}", ha="center", va="center", fontsize=7)
        ax.imshow(img, aspect="auto")
        ax.set_xticks(range(len(vb)), [str(v) for v in vb], fontsize=7)
        ax.set_yticks(range(len(va)), [str(v) for v in va], fontsize=7)
        ax.set_xlabel(b, fontsize=8)
        ax.set_ylabel(a, fontsize=8)
        ax.set_title(m["metric"].replace("_", " "), fontsize=8)
    for k in range(len(maps), nrow * ncol):
        axs[k // ncol, k % ncol].axis("off")
    handles = [plt.Rectangle((0, 0), 1, 1, color=cmap(i)) for i in range(len(regimes))]
    fig.legend(handles, regimes, loc="upper center", ncol=len(regimes), fontsize=8)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.savefig(path, dpi=70)
    plt.close(fig)


def regime_map(sweep_dir: str | Path) -> dict[str, Any]:
    d = Path(sweep_dir)
    axes, rows = load_points(d)
    regimes = regimes_of(rows)
    n_grid = math.prod(len(v) for v in axes.values())
    n_points = len({tuple(r[a] for a in axes) for r in rows})
    return {"sweep": str(d), "axes": axes, "regimes": regimes, "points": n_points, "grid_points": n_grid,
            "maps": pair_maps(axes, rows, regimes), "claims": claims(axes, rows),
            "stability": stability_table(rows, regimes, axes)}


def _clean(x):
    if isinstance(x, float) and math.isnan(x):
        return None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_clean(v) for v in x]
    return x


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.bandit.regime_map", description=__doc__.split("\n")[0])
    ap.add_argument("--sweep", required=True, help="a bandit_sim sweep directory")
    ap.add_argument("--out", required=True, help="where regime_map.{md,json,png} go")
    args = ap.parse_args(argv)
    res = regime_map(args.sweep)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "regime_map.json").write_text(json.dumps(_clean(res), indent=1, allow_nan=False) + "\n")
    (out / "regime_map.md").write_text(markdown(res))
    plot(res, out / "regime_map.png")
    print(f"regime map of {res['points']}/{res['grid_points']} points -> {out / 'regime_map.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
