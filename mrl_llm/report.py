"""``mrl_llm report --runs DIR``: learning curves per policy and regime, and a table of final values.

Every run directory under ``DIR`` (any depth; one with a ``metrics.jsonl``) is one curve. Runs are
grouped by regime; several runs of one regime (seeds) are averaged step by step, with their min-max
band. The figure has one column per policy and three rows: greedy eval accuracy, peer-exclusive
accuracy (both from the ``eval`` rows) and the mean training reward (``train`` rows). Written to
``DIR/report.png``; the table (markdown, final values per regime and policy, mean over seeds) to
``DIR/report.md`` and stdout.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from mrl_llm.metrics import read_metrics

PANELS = (("eval", "eval_accuracy", "greedy eval accuracy"),
          ("eval", "peer_exclusive_accuracy", "peer-exclusive accuracy"),
          ("train", "reward_mean", "training reward"))
TABLE = ("eval_accuracy", "pass_at_k", "peer_exclusive_accuracy", "kl_to_ref", "entropy")


def find_runs(root: str | Path) -> list[Path]:
    r = Path(root)
    if not r.is_dir():
        raise FileNotFoundError(f"runs directory {r} not found")
    runs = sorted(p.parent for p in r.rglob("metrics.jsonl"))
    if not runs:
        raise FileNotFoundError(f"no run directories (with metrics.jsonl) under {r}")
    return runs


def _regime(run: Path, rows: list[dict[str, Any]]) -> str:
    for r in rows:
        if r.get("regime"):
            return str(r["regime"])
    return run.name


def curves(runs: list[Path]) -> dict[tuple[str, str, str], list[dict[int, float]]]:
    """``{(regime, policy, metric): [ {step: value} per run ]}`` for the panel metrics."""
    out: dict[tuple[str, str, str], list[dict[int, float]]] = defaultdict(list)
    for run in runs:
        rows = read_metrics(run / "metrics.jsonl")
        reg = _regime(run, rows)
        per: dict[tuple[str, str], dict[int, float]] = defaultdict(dict)
        for r in rows:
            for kind, key, _ in PANELS:
                if r.get("kind") == kind and r.get(key) is not None:
                    per[(r["policy"], key)][int(r["step"]) + (1 if kind == "train" else 0)] = float(r[key])
        for (pol, key), c in per.items():
            out[(reg, pol, key)].append(c)
    return out


def table(runs: list[Path]) -> tuple[list[str], list[list[str]]]:
    """Final values per (regime, policy), averaged over the regime's runs."""
    acc: dict[tuple[str, str], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for run in runs:
        p = run / "summary.json"
        if not p.is_file():
            continue
        s = json.loads(p.read_text())
        for pol in s["policies"]:
            for k in TABLE:
                if pol.get(k) is not None:
                    acc[(s["regime"], pol["name"])][k].append(float(pol[k]))
    head = ["regime", "policy", "runs", *TABLE]
    body = []
    for (reg, pol), d in sorted(acc.items()):
        n = max((len(v) for v in d.values()), default=0)
        body.append([reg, pol, str(n), *(f"{np.mean(d[k]):.3f}" if d.get(k) else "-" for k in TABLE)])
    return head, body


def render_table(head: list[str], body: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in body]
    return "\n".join(lines)


def make_report(root: str | Path, out: str | Path | None = None) -> dict[str, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = find_runs(root)
    cs = curves(runs)
    policies = sorted({p for _, p, _ in cs})
    regimes = sorted({r for r, _, _ in cs})
    fig, axes = plt.subplots(len(PANELS), max(1, len(policies)), figsize=(4.5 * max(1, len(policies)), 9),
                             squeeze=False, sharex="col")
    for col, pol in enumerate(policies):
        for row, (_, key, label) in enumerate(PANELS):
            ax = axes[row][col]
            for reg in regimes:
                runs_c = cs.get((reg, pol, key))
                if not runs_c:
                    continue
                steps = sorted(set().union(*runs_c))
                vals = np.array([[c.get(s, np.nan) for s in steps] for c in runs_c], dtype=float)
                mean = np.nanmean(vals, axis=0)
                line, = ax.plot(steps, mean, marker="o" if key != "reward_mean" else None, ms=3, label=reg)
                if len(runs_c) > 1:
                    ax.fill_between(steps, np.nanmin(vals, axis=0), np.nanmax(vals, axis=0), alpha=0.2,
                                    color=line.get_color())
            ax.set_title(f"{pol}: {label}", fontsize=9)
            ax.grid(alpha=0.3)
            if row == len(PANELS) - 1:
                ax.set_xlabel("training step")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    png = Path(out) if out else Path(root) / "report.png"
    fig.savefig(png, dpi=120)
    plt.close(fig)
    head, body = table(runs)
    md = render_table(head, body)
    (png.with_suffix(".md")).write_text(md + "\n")
    return {"png": str(png), "table": md, "runs": [str(r) for r in runs]}
