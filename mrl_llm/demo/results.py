"""The demo's result: per (regime, policy) means over seeds with 95 % t-intervals, a table and a plot.

Everything here is read back from the run directories (``summary.json``, ``eval.jsonl``), so the table is
what the runs wrote. Each evaluation scores the RL pool and the held-out prompts (greedy + ``k`` samples);
:func:`run_result` splits them: the pool columns (eval accuracy, peer-exclusive set and accuracy) read the
pool's rows only, the held-out columns the held-out rows. *Greedy* accuracy = mean ``greedy_correct``;
*sampled* accuracy = successes / samples (the policy's expected reward at temperature 1, what GRPO raises).

Interval: the Student-t interval ``mean ± t_{0.975, n-1} · s / sqrt(n)`` over the ``n`` seeds (``s``
the sample standard deviation); none for ``n = 1``. :func:`t_quantile` computes ``t_{q, df}`` by
bisection on the t CDF (Simpson integration of the density), no scipy needed.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from mrl_llm.evaluate import read_eval_rows
from mrl_llm.report import render_table

#: The table's columns: key in a run's per-policy result, header.
COLUMNS = (
    ("peer_exclusive_accuracy", "peer-excl. acc (final)"),
    ("peer_exclusive_n", "peer-excl. n"),
    ("eval_accuracy_start", "eval acc (SFT start)"),
    ("eval_accuracy", "eval acc (final)"),
    ("pool_sampled_start", "pool sampled (SFT start)"),
    ("pool_sampled", "pool sampled (final)"),
    ("heldout_own_start", "held-out own family (SFT start)"),
    ("heldout_own", "held-out own family (final)"),
    ("heldout_own_sampled_start", "held-out own sampled (SFT start)"),
    ("heldout_own_sampled", "held-out own sampled (final)"),
    ("heldout_other", "held-out other family (final)"),
    ("kl_to_ref", "KL to start"),
    ("sgt_activations", "SGT activations"),
)


def _t_cdf(x: float, df: int) -> float:
    """P(T <= x) for x >= 0 (Simpson's rule on the density over [0, x], 2000 intervals)."""
    c = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)
    n = 2000
    h = x / n
    s = 0.0
    for i in range(n + 1):
        w = 1 if i in (0, n) else (4 if i % 2 else 2)
        s += w * (1 + (i * h) ** 2 / df) ** (-(df + 1) / 2)
    return 0.5 + c * s * h / 3


def t_quantile(q: float, df: int) -> float:
    """The ``q`` quantile (``q > 0.5``) of Student's t with ``df`` degrees of freedom."""
    if not 0.5 < q < 1 or df < 1:
        raise ValueError(f"t_quantile needs 0.5 < q < 1 and df >= 1, got q={q}, df={df}")
    lo, hi = 0.0, 1.0
    while _t_cdf(hi, df) < q:
        hi *= 2
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _t_cdf(mid, df) < q else (lo, mid)
    return (lo + hi) / 2


def mean_ci(values: Sequence[float], level: float = 0.95) -> tuple[float, float | None, int]:
    """``(mean, half-width of the t-interval or None, n)`` of the finite ``values``."""
    v = np.array([x for x in values if x is not None and math.isfinite(x)], dtype=float)
    if v.size == 0:
        return float("nan"), None, 0
    if v.size == 1:
        return float(v[0]), None, 1
    half = t_quantile(0.5 + level / 2, v.size - 1) * float(v.std(ddof=1)) / math.sqrt(v.size)
    return float(v.mean()), half, int(v.size)


def _greedy(rows: Sequence[dict[str, Any]]) -> float | None:
    return float(np.mean([r["greedy_correct"] for r in rows])) if rows else None


def _sampled(rows: Sequence[dict[str, Any]]) -> float | None:
    n = sum(r["samples"] for r in rows)
    return sum(r["successes"] for r in rows) / n if n else None


def run_result(run_dir: Path, families: dict[str, str], heldout_ids: set[str]) -> dict[str, Any]:
    """One run's per-policy numbers (``families``: policy -> its own SFT family; ``heldout_ids``: the prompt ids
    of the held-out split, every other evaluated prompt is the pool's). Start = step 0, final = the last
    evaluation. Peer-exclusive prompts: the pool prompts the policy did not solve at step 0 while its peer
    did (:func:`mrl_llm.evaluate.peer_exclusive_sets` on the pool's rows); their greedy accuracy per step is
    ``curve``."""
    from mrl_llm.evaluate import peer_exclusive_sets

    s = json.loads((run_dir / "summary.json").read_text())
    rows = [r for r in read_eval_rows(run_dir / "eval.jsonl") if not r["skipped"]]
    pool = [r for r in rows if str(r["prompt_id"]) not in heldout_ids]
    held = [r for r in rows if str(r["prompt_id"]) in heldout_ids]
    steps = sorted({int(r["step"]) for r in rows})
    first, last = (steps[0], steps[-1]) if steps else (0, 0)
    excl = peer_exclusive_sets([r for r in pool if r["step"] == first])
    pols = {}
    for p in s["policies"]:
        name, own = p["name"], families.get(p["name"])

        def at(rs, step, name=name):
            return [r for r in rs if r["policy"] == name and r["step"] == step]

        ex = excl.get(name, set())
        curve: dict[int, list[int]] = defaultdict(list)
        for r in pool:
            if r["policy"] == name and r["prompt_id"] in ex:
                curve[int(r["step"])].append(int(r["greedy_correct"]))
        own_start = [r for r in at(held, first) if r["family"] == own]
        own_final = [r for r in at(held, last) if r["family"] == own]
        other = sorted({r["family"] for r in held if r["family"] != own})
        other_acc = [_greedy([r for r in at(held, last) if r["family"] == f]) for f in other]
        pols[name] = {
            **{k: p.get(k) for k in ("kl_to_ref", "entropy", "sgt_activations")},
            "peer_exclusive_n": len(ex),
            "peer_exclusive_accuracy": _greedy([r for r in at(pool, last) if r["prompt_id"] in ex]),
            "eval_accuracy_start": _greedy(at(pool, first)),
            "eval_accuracy": _greedy(at(pool, last)),
            "pool_sampled_start": _sampled(at(pool, first)),
            "pool_sampled": _sampled(at(pool, last)),
            "heldout_own_start": _greedy(own_start),
            "heldout_own": _greedy(own_final),
            "heldout_own_sampled_start": _sampled(own_start),
            "heldout_own_sampled": _sampled(own_final),
            "heldout_other": (float(np.mean(other_acc)) if other_acc and None not in other_acc else None),
            "curve": {st: float(np.mean(v)) for st, v in sorted(curve.items())},
        }
    return {"regime": s["regime"], "seed": s["seed"], "steps": s["steps"], "policies": pols,
            "wall_s": s.get("wall_s_this_session")}


def aggregate(results: Sequence[dict[str, Any]]) -> dict[tuple[str, str], dict[str, tuple[float, float | None, int]]]:
    """``{(regime, policy): {column: (mean, half-width, n)}}`` over the seeds."""
    acc: dict[tuple[str, str], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in results:
        for pol, d in r["policies"].items():
            for key, _ in COLUMNS:
                if d.get(key) is not None:
                    acc[(r["regime"], pol)][key].append(float(d[key]))
    return {k: {c: mean_ci(v) for c, v in d.items()} for k, d in acc.items()}


PAIRED = (("peer_exclusive_accuracy", "Δ peer-excl. acc"), ("eval_accuracy", "Δ eval acc"),
          ("pool_sampled", "Δ pool sampled"), ("heldout_own", "Δ held-out own family"),
          ("heldout_own_sampled", "Δ held-out own sampled"), ("heldout_other", "Δ held-out other family"))

#: the change from the SFT start: (final key, start key, header)
CHANGE = (("eval_accuracy", "eval_accuracy_start", "eval acc"),
          ("pool_sampled", "pool_sampled_start", "pool sampled"),
          ("heldout_own", "heldout_own_start", "held-out own family"),
          ("heldout_own_sampled", "heldout_own_sampled_start", "held-out own sampled"))


def paired_vs(results: Sequence[dict[str, Any]], baseline: str = "grpo") -> dict[str, dict[str, tuple]]:
    """``{regime: {column: (mean, half-width, n)}}`` of the per-seed difference ``regime - baseline``
    of the policies' mean (same seed, same SFT start: a paired comparison)."""
    by: dict[tuple[str, int], dict[str, Any]] = {(r["regime"], r["seed"]): r["policies"] for r in results}
    out: dict[str, dict[str, tuple]] = {}
    for reg in dict.fromkeys(r["regime"] for r in results):
        cols = {}
        for key, _ in PAIRED:
            diffs = []
            for (rg, seed), pols in by.items():
                base = by.get((baseline, seed))
                if rg != reg or base is None:
                    continue
                a = [d.get(key) for d in pols.values()]
                b = [base[n].get(key) for n in pols if n in base]
                if None not in a + b and len(a) == len(b):
                    diffs.append(float(np.mean(a)) - float(np.mean(b)))
            cols[key] = mean_ci(diffs)
        out[reg] = cols
    return out


def change_from_start(results: Sequence[dict[str, Any]]) -> dict[str, dict[str, tuple]]:
    """``{regime: {final key: (mean, half-width, n)}}`` of the per-seed change from the SFT start, final minus
    start, of the policies' mean (:data:`CHANGE`); a seed where a policy lacks either value is left out."""
    out: dict[str, dict[str, tuple]] = {}
    for reg in dict.fromkeys(r["regime"] for r in results):
        cols = {}
        for key, start, _ in CHANGE:
            diffs = []
            for r in results:
                if r["regime"] != reg:
                    continue
                pairs = [(d.get(key), d.get(start)) for d in r["policies"].values()]
                if pairs and all(a is not None and b is not None for a, b in pairs):
                    diffs.append(float(np.mean([a - b for a, b in pairs])))
            cols[key] = mean_ci(diffs)
        out[reg] = cols
    return out


def change_markdown(change: dict[str, dict[str, tuple]], regimes: Sequence[str]) -> str:
    head = ["regime", *(f"Δ {h} from start" for _, _, h in CHANGE)]
    body = [[reg, *(fmt(change[reg][k]) for k, _, _ in CHANGE)] for reg in regimes if reg in change]
    return ("Change from the SFT start (per seed: final minus start, averaged over the two policies; mean ± 95 % "
            "t-interval over seeds):\n\n" + render_table(head, body))


def paired_markdown(paired: dict[str, dict[str, tuple]], regimes: Sequence[str], baseline: str = "grpo") -> str:
    head = ["regime", *(h for _, h in PAIRED)]
    body = [[reg, *(fmt(paired[reg][k]) for k, _ in PAIRED)] for reg in regimes if reg != baseline and reg in paired]
    return (f"Paired differences vs {baseline} (per seed: the regime's value minus {baseline}'s, both averaged "
            "over the two policies; mean ± 95 % t-interval over seeds):\n\n" + render_table(head, body))


def fmt(m: tuple[float, float | None, int], digits: int = 3) -> str:
    mean, half, n = m
    if n == 0:
        return "-"
    return f"{mean:.{digits}f}" + (f" ± {half:.{digits}f}" if half is not None else "")


def table_markdown(agg: dict, regimes: Sequence[str], policies: Sequence[str], n_seeds: int) -> str:
    """The markdown table (rows in regime order, then policy order)."""
    head = ["regime", "policy", *(h for _, h in COLUMNS)]
    body = []
    for reg in regimes:
        for pol in policies:
            d = agg.get((reg, pol))
            if d is None:
                continue
            cells = [fmt(d[c], 1 if c in ("peer_exclusive_n", "sgt_activations") else 3) if c in d else "-"
                     for c, _ in COLUMNS]
            body.append([reg, pol, *cells])
    note = (f"Means over {n_seeds} seed(s)" + (" ± the half-width of the 95 % Student-t interval." if n_seeds > 1
                                               else " (one seed: no interval)."))
    return render_table(head, body) + "\n\n" + note


def _bars(ax, agg: dict, regimes: Sequence[str], policies: Sequence[str], key: str, start_key: str | None,
          title: str, colors: list[str]) -> None:
    x = np.arange(len(regimes))
    w = 0.8 / max(1, len(policies))
    for j, pol in enumerate(policies):
        xs = x + (j - (len(policies) - 1) / 2) * w
        ms = [agg.get((r, pol), {}).get(key, (np.nan, None, 0)) for r in regimes]
        ax.bar(xs, [m[0] for m in ms], w, yerr=[m[1] if m[1] is not None else 0.0 for m in ms], capsize=3,
               label=pol, color=colors[j % len(colors)])
        if start_key:
            starts = [agg.get((r, pol), {}).get(start_key, (np.nan, None, 0))[0] for r in regimes]
            ax.scatter(xs, starts, marker="_", s=200, color="black", zorder=3, label="SFT start" if j == 0 else None)
    ax.set_xticks(x, regimes, rotation=15)
    ax.set_ylim(0, 1)
    ax.set_title(title, fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)


def plot(results: Sequence[dict[str, Any]], agg: dict, regimes: Sequence[str], policies: Sequence[str],
         path: Path) -> None:
    """Four panels: final accuracy on the own peer-exclusive prompts per regime and policy (bars, 95 %
    t-interval over seeds), the same during training (mean over policies and seeds), final eval
    accuracy on the pool and final held-out accuracy on the own family (bars; the SFT start as a tick)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    _bars(axes[0][0], agg, regimes, policies, "peer_exclusive_accuracy", None,
          "accuracy on own peer-exclusive prompts (final)", colors)
    _bars(axes[1][0], agg, regimes, policies, "eval_accuracy", "eval_accuracy_start",
          "eval accuracy on the RL pool, both families (final)", colors)
    _bars(axes[1][1], agg, regimes, policies, "heldout_own", "heldout_own_start",
          "held-out accuracy on the own family (final)", colors)
    ax = axes[0][1]
    for i, reg in enumerate(regimes):
        curves = [r["policies"][p]["curve"] for r in results if r["regime"] == reg for p in policies
                  if p in r["policies"]]
        steps = sorted(set().union(*curves)) if curves else []
        if steps:
            mean = [np.nanmean([c.get(s, np.nan) for c in curves]) for s in steps]
            ax.plot(steps, mean, marker="o", ms=3, label=reg, color=colors[i % len(colors)])
    ax.set_title("peer-exclusive accuracy during training (mean over policies, seeds)", fontsize=10)
    ax.set_xlabel("training step")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    n = len({r["seed"] for r in results})
    fig.suptitle(f"mutual-RL CPU demo, {n} seed(s); error bars: 95 % t-interval over seeds", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=72)
    plt.close(fig)
