"""``mrl_llm report --runs DIR``: learning curves per policy and regime, and a table of final values.

Every run directory under ``DIR`` (any depth; one with a ``metrics.jsonl``) is one curve. Runs are
grouped by regime; several runs of one regime (seeds) are averaged step by step, with their min-max
band. The figure has one column per policy and three rows: greedy eval accuracy, peer-exclusive
accuracy (both from the ``eval`` rows) and the mean training reward (``train`` rows). Written to
``DIR/report.png``; the table (markdown, final values per regime and policy, mean over seeds) to
``DIR/report.md`` and stdout. ``--out`` names the figure file (any format matplotlib writes: ``.png``,
``.pdf``, ``.svg``, ...; the table goes beside it as ``.md``) or a directory to write ``report.png`` and
``report.md`` into.

A damaged or hand-edited run is an error naming the file (and the ``metrics.jsonl`` line) and the fix: a
line that is not a JSON object, a train/eval row without ``step`` or ``policy``, a plotted value that is not
a number, a ``summary.json`` that is not JSON or lacks ``regime`` / ``policies``, two train rows of one step and
policy (two processes wrote the run). A run whose
``metrics.jsonl`` has no rows yet (it has just started) is left out, and named; when no run has any, the
report is an error saying so.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from mrl_llm.metrics import read_metrics
from mrl_llm.runstate import read_json_object

PANELS = (("eval", "eval_accuracy", "greedy eval accuracy"),
          ("eval", "peer_exclusive_accuracy", "peer-exclusive accuracy"),
          ("train", "reward_mean", "training reward"))
TABLE = ("eval_accuracy", "pass_at_k", "peer_exclusive_accuracy", "kl_to_ref", "entropy")


def find_runs(root: str | Path) -> list[Path]:
    r = Path(root)
    if r.is_file():
        raise ValueError(f"--runs {r} is a file; pass the directory that holds the run directories")
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


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def check_row(r: dict[str, Any]) -> None:
    """A ``ValueError`` (the reason) unless metrics row ``r`` is one the report can read: a train or eval row has
    a whole-number ``step``, a ``policy`` name and numbers (or null) for its plotted values; other rows are not
    read."""
    kind = r.get("kind")
    if kind not in ("train", "eval"):
        return
    for key in ("step", "policy"):
        if key not in r:
            raise ValueError(f"the {kind} row has no {key!r} (every train and eval row has step and policy)")
    if not isinstance(r["step"], int) or isinstance(r["step"], bool) or r["step"] < 0:
        raise ValueError(f"step is {r['step']!r}, not a step number")
    if not isinstance(r["policy"], str):
        raise ValueError(f"policy is {r['policy']!r}, not a policy name")
    for k, key, _ in PANELS:
        if k == kind and r.get(key) is not None and not _is_number(r[key]):
            raise ValueError(f"{key} is {r[key]!r}, not a number (null when not measured)")


def run_rows(run: Path) -> list[dict[str, Any]]:
    """``run/metrics.jsonl``'s rows, checked (:func:`check_row`); errors name the file and line. Two train rows of
    one (step, policy) (rolled-back rows aside) are an error: two processes wrote the run, and averaging them
    would count the step twice."""
    path = run / "metrics.jsonl"
    rows = read_metrics(path, check=check_row)
    seen: dict[tuple[int, str], int] = defaultdict(int)
    for r in rows:
        if r.get("kind") == "train":
            seen[(r["step"], r["policy"])] += 1
    dups = sorted(k for k, n in seen.items() if n > 1)
    if dups:
        (step, pol), more = dups[0], f" and {len(dups) - 1} more" if len(dups) > 1 else ""
        raise ValueError(f"{path}: {seen[dups[0]]} train rows of step {step}, policy {pol!r}{more} (two processes "
                         "wrote this run?); it cannot be reported: train it again into a new --out directory, or "
                         "move the run out of --runs")
    return rows


def curves(runs: list[Path], rows_of: dict[Path, list[dict[str, Any]]] | None = None
           ) -> dict[tuple[str, str, str], list[dict[int, float]]]:
    """``{(regime, policy, metric): [ {step: value} per run ]}`` for the panel metrics (rows read with
    :func:`run_rows` unless given in ``rows_of``)."""
    out: dict[tuple[str, str, str], list[dict[int, float]]] = defaultdict(list)
    for run in runs:
        rows = rows_of[run] if rows_of is not None else run_rows(run)
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
        s = read_summary(p)
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


def read_summary(path: Path) -> dict[str, Any]:
    """A run's ``summary.json``, checked for what the table reads; errors name the file and the key."""
    fix = "repair it, or remove it to leave the run out of the table"
    s = read_json_object(path, fix)
    if not isinstance(s.get("regime"), str):
        raise ValueError(f"{path} has no 'regime' name; {fix}")
    if not isinstance(s.get("policies"), list):
        raise ValueError(f"{path} has no 'policies' list; {fix}")
    for i, pol in enumerate(s["policies"]):
        if not isinstance(pol, dict) or not isinstance(pol.get("name"), str):
            raise ValueError(f"{path}: policies[{i}] has no 'name'; {fix}")
        for k in TABLE:
            if pol.get(k) is not None and not _is_number(pol[k]):
                raise ValueError(f"{path}: policies[{i}].{k} is {pol[k]!r}, not a number (null when not measured); "
                                 f"{fix}")
    return s


def output_paths(root: str | Path, out: str | Path | None) -> tuple[Path, Path]:
    """The figure and table files (module docstring): ``DIR/report.png`` and ``DIR/report.md`` by default or
    for a directory ``out``; else ``out`` and ``out`` with the suffix ``.md``. Errors say what to pass."""
    from matplotlib.backend_bases import FigureCanvasBase

    from shared_interfaces.out_paths import check_out_file

    png = Path(out) if out else Path(root)
    if png.is_dir():
        png = png / "report.png"
    elif png.suffix[1:].lower() not in FigureCanvasBase.get_supported_filetypes():
        raise ValueError(f"--out {out}: neither a directory nor a figure file matplotlib writes; pass a directory or a "
                         "file ending .png, .pdf or .svg")
    md = png.with_suffix(".md")
    for f in (png, md):
        if f.is_dir():
            raise ValueError(f"{f} is a directory; remove it or pass --out FILE.png")
    check_out_file(png, "--out", example="report.png")
    return png, md


def render_table(head: list[str], body: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in body]
    return "\n".join(lines)


def make_report(root: str | Path, out: str | Path | None = None) -> dict[str, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = find_runs(root)
    png, md_path = output_paths(root, out)
    rows_of = {run: run_rows(run) for run in runs}
    empty = [run for run in runs if not rows_of[run]]
    if len(empty) == len(runs):
        more = f" (and the {len(runs) - 1} other run(s) under {root})" if len(runs) > 1 else ""
        raise ValueError(f"{runs[0] / 'metrics.jsonl'}{more} has no metrics rows yet; run report again once a run "
                         "has finished a training step")
    cs = curves([run for run in runs if rows_of[run]], rows_of)
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
    labelled = [ax for row in axes for ax in row if ax.get_legend_handles_labels()[0]]
    if labelled:  # the first panel with a curve
        labelled[0].legend(fontsize=8)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=120)
    plt.close(fig)
    head, body = table(runs)
    md = render_table(head, body)
    md_path.write_text(md + "\n")
    return {"png": str(png), "md": str(md_path), "table": md, "runs": [str(r) for r in runs],
            "no_metrics": [str(r) for r in empty]}
