"""Writing the cross-check: ``crosscheck.json`` (every number), ``report.md`` and four PNGs.

``curves.png`` — per policy (rows) and regime (columns), the LLM's sample accuracy (solid, mean over
LLM seeds; faint lines: each seed) and the bandit's prediction (dashed, ±1 sd over bandit seeds shaded)
on the step-budget axis; ``fit.png`` — the GRPO grid's RMSE against the flat baseline;
``ordering.png`` — bandit vs LLM per regime for each ordering outcome; ``rescue.png`` — observed,
predicted and correctly predicted rescues per regime.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

DPI = 80
OUTCOME_LABELS = {"final": "final accuracy", "mean": "mean accuracy after step 0",
                  "rescue_rate": "rescue-set share solved at the end"}


def _clean(x: Any) -> Any:
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if hasattr(x, "item"):
        return _clean(x.item())
    return x


def _f(x: float | None, nd: int = 3) -> str:
    return "—" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:.{nd}f}"


def plot_curves(res: dict, path: Path) -> None:
    regs, pols = res["llm_runs"]["regimes"], res["llm_runs"]["policies"]
    fig, axes = plt.subplots(len(pols), len(regs), figsize=(2.3 * len(regs), 2.1 * len(pols) + 0.4), sharex=True,
                             sharey=True, squeeze=False)
    for c, reg in enumerate(regs):
        v = res["regimes"][reg]
        u = v["fractions"]
        for r, pol in enumerate(pols):
            ax = axes[r][c]
            for seed_curve in v["llm_curve_per_seed"][pol] if len(v["llm_curve_per_seed"][pol]) > 1 else []:
                ax.plot(u, seed_curve, color="C0", alpha=0.25, lw=0.8)
            ax.plot(u, v["llm_curve"][pol], "o-", color="C0", ms=3, label="LLM")
            b, sd = v["bandit_curve"][pol], v["bandit_curve_sd"][pol]
            ax.plot(u, b, "--", color="C3", label="bandit")
            ax.fill_between(u, [x - s for x, s in zip(b, sd, strict=True)], [x + s for x, s in zip(b, sd, strict=True)],
                            color="C3", alpha=0.15, lw=0)
            if r == 0:
                ax.set_title(reg + (" (fit)" if reg == "grpo" else ""), fontsize=9)
            if c == 0:
                ax.set_ylabel(f"{pol}\nsample accuracy", fontsize=8)
            if r == len(pols) - 1:
                ax.set_xlabel("fraction of step budget", fontsize=8)
            ax.tick_params(labelsize=7)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def plot_fit(res: dict, path: Path) -> None:
    fit = res["fit"]
    opts = [o for o in ("sgd", "adam") if any(g["optimizer"] == o for g in fit["grid"])]
    fig, axes = plt.subplots(1, len(opts), figsize=(3.6 * len(opts), 2.8), squeeze=False, sharey=True)
    for ax, opt in zip(axes[0], opts, strict=True):
        for ep in sorted({g["epochs"] for g in fit["grid"]}):
            pts = sorted((g["lr"], g["rmse"]) for g in fit["grid"] if g["epochs"] == ep and g["optimizer"] == opt)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", ms=3, label=f"epochs {ep}")
        ax.axhline(fit["flat_baseline_rmse"], color="k", ls=":", label="flat baseline")
        ax.set_xscale("log", base=2)
        ax.set_xlabel(f"bandit lr ({opt})", fontsize=8)
        ax.tick_params(labelsize=7)
    axes[0][0].set_ylabel("RMSE vs LLM GRPO curve", fontsize=8)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def plot_ordering(res: dict, path: Path) -> None:
    regs = res["llm_runs"]["regimes"]
    fig, axes = plt.subplots(1, len(OUTCOME_LABELS), figsize=(3.2 * len(OUTCOME_LABELS), 2.9))
    for ax, (key, label) in zip(axes, OUTCOME_LABELS.items(), strict=True):
        xs = [res["regimes"][r]["bandit"][key] for r in regs]
        ys = [res["regimes"][r]["llm"][key] for r in regs]
        ax.scatter(xs, ys, s=14)
        for r, x, y in zip(regs, xs, ys, strict=True):
            if x is not None and y is not None:
                ax.annotate(r, (x, y), fontsize=7, xytext=(2, 2), textcoords="offset points")
        rho = res["ordering"][key]["spearman"]
        ax.set_title(f"{label}\nSpearman {_f(rho['statistic'], 2)} (p = {_f(rho['p_greater'], 3)})", fontsize=8)
        ax.set_xlabel("bandit", fontsize=8)
        ax.set_ylabel("LLM", fontsize=8)
        ax.xaxis.set_major_locator(MaxNLocator(4))
        ax.ticklabel_format(axis="x", style="sci", scilimits=(-2, 3))
        ax.tick_params(labelsize=7)
        ax.xaxis.get_offset_text().set_fontsize(7)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def plot_rescue(res: dict, path: Path) -> None:
    regs = res["llm_runs"]["regimes"]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(1.1 * len(regs) + 5.0, 2.9))
    w = 0.27
    for k, (key, label) in enumerate((("observed", "observed (LLM)"), ("predicted", "predicted (bandit)"),
                                      ("tp", "both"))):
        ax.bar([i + (k - 1) * w for i in range(len(regs))], [res["regimes"][r]["rescue"][key] for r in regs], w,
               label=label)
    ax.set_xticks(range(len(regs)))
    ax.set_xticklabels(regs, fontsize=7)
    ax.set_ylabel("rescued prompts (end)", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.legend(fontsize=7)
    for i, r in enumerate(regs):
        v = res["regimes"][r]
        ax2.plot(v["fractions"], v["rescue_curve"]["llm"], "o-", color=f"C{i}", ms=3, label=r)
        ax2.plot(v["fractions"], v["rescue_curve"]["bandit"], "--", color=f"C{i}")
    ax2.set_xlabel("fraction of step budget", fontsize=8)
    ax2.set_ylabel("rescue-set share solved\n(solid LLM, dashed bandit)", fontsize=8)
    ax2.tick_params(labelsize=7)
    ax2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def _order(res: dict, side: str, key: str) -> str:
    vals = {r: res["regimes"][r][side][key] for r in res["llm_runs"]["regimes"]}
    ok = {r: v for r, v in vals.items() if v is not None and math.isfinite(v)}
    return " > ".join(f"{r} ({v:.3g})" for r, v in sorted(ok.items(), key=lambda kv: -kv[1]))


def markdown(res: dict) -> str:
    lr, opt, fit = res["llm_runs"], res["options"], res["fit"]
    best = fit["best"]
    out = ["# Cross-check: the bandit calibrated on the LLM runs, against the LLM", ""]
    out.append(f"LLM runs `{lr['root']}`: {len(lr['seeds'])} seed(s) {lr['seeds']}, regimes {', '.join(lr['regimes'])}; "
               f"policies {', '.join(lr['policies'])}; {lr['prompts']} evaluation prompts (the bandit's contexts; "
               f"{'the training prompts' if lr['eval_on_training_prompts'] else 'NOT the training prompts: a proxy'}); "
               f"{lr['steps']} steps × {lr['prompts_per_step']} prompts × G = {lr['group_size']}; "
               f"{lr['eval_k']} samples per prompt per evaluation.")
    if lr["dropped_regimes"]:
        out.append(f"Regimes missing in some seed, left out: {', '.join(lr['dropped_regimes'])}.")
    if lr["unfinished_runs"]:
        out.append(f"Unfinished runs (no summary.json), left out: {', '.join(lr['unfinished_runs'])}.")
    out += ["", f"Bandit: {opt['arms']} arms (one correct), {opt['bandit_seeds']} seeds per LLM seed, tabular softmax, "
            f"{best['optimizer']} on the logits (fitted below), THL residual σ = {opt['thl_sigma']}; the LLM's regime "
            "settings, clip range and KL coefficient.", ""]
    out += ["## Calibration (step 0)", "", "| seed | policy | LLM sample acc. | scenario acc. | never solved | rescue set |",
            "|---|---|---|---|---|---|"]
    for seed, c in res["calibration"].items():
        for pol, v in c["policies"].items():
            out.append(f"| {seed} | {pol} | {_f(v['llm_step0_sample_accuracy'])} | {_f(v['bandit_step0_accuracy'])} | "
                       f"{v['never_solved']} | {v['rescue_set']} |")
    floors = ", ".join(f"{c['p_never']:.2g}" for c in res["calibration"].values())
    out += ["", f"Never-solved floor p_never = {floors} (α = {opt['alpha']})."]
    out += ["", "## Fit on GRPO", "",
            f"Best: **{best['optimizer']}, lr {best['lr']}, epochs {best['epochs']}**, RMSE {_f(best['rmse'], 4)} against "
            f"the LLM's GRPO curves (flat baseline {_f(fit['flat_baseline_rmse'], 4)}; grid: SGD lr {opt['sgd_lrs']}, "
            f"Adam lr {opt['adam_lrs']}, × epochs {opt['epochs']}).", "", "![fit](fit.png)", ""]
    lrs = opt[f"{best['optimizer']}_lrs"]
    if best["lr"] in (min(lrs), max(lrs)):
        out += ["The best lr sits on the edge of its grid.", ""]
    out += ["## Curves on the step-budget axis", "", "![curves](curves.png)", "",
            "| regime | RMSE bandit | RMSE flat | LLM final (± eval. s.e.) | bandit final | LLM mean | bandit mean | "
            "LLM rescue share | bandit rescue share |", "|---|---|---|---|---|---|---|---|---|"]
    for reg in lr["regimes"]:
        v = res["regimes"][reg]
        out.append(f"| {reg} | {_f(v['rmse'])} | {_f(v['flat_baseline_rmse'])} | {_f(v['llm']['final'])} ± "
                   f"{_f(v['llm']['final_se'])} | {_f(v['bandit']['final'])} | {_f(v['llm']['mean'])} | "
                   f"{_f(v['bandit']['mean'])} | {_f(v['llm']['rescue_rate'])} | {_f(v['bandit']['rescue_rate'])} |")
    out += ["", "## Ordering of the regimes", "",
            "| outcome | LLM order | bandit order | Spearman ρ | p (one-sided, two-sided) | Kendall τ_b | p (one-sided, "
            "two-sided) |", "|---|---|---|---|---|---|---|"]
    for key, label in OUTCOME_LABELS.items():
        s, k = res["ordering"][key]["spearman"], res["ordering"][key]["kendall_tau_b"]
        out.append(f"| {label} | {_order(res, 'llm', key)} | {_order(res, 'bandit', key)} | {_f(s['statistic'], 2)} | "
                   f"{_f(s['p_greater'])}, {_f(s['p_two_sided'])} | {_f(k['statistic'], 2)} | {_f(k['p_greater'])}, "
                   f"{_f(k['p_two_sided'])} |")
    sp = res["ordering"]["final"]["spearman"]
    over = (f"exact, over all {sp['permutations']}" if sp["exact"] else f"Monte Carlo, over {sp['permutations']} sampled")
    out += ["", f"p-values: {over} orderings of {sp['n']} regimes; "
            "one-sided = P(ρ or τ ≥ observed) under a random order.", "", "![ordering](ordering.png)", ""]
    out += ["## Rescues", "", "| regime | rescue set | observed | predicted | expected | both | precision | recall | AUC | "
            "per policy (precision / recall) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for reg in lr["regimes"]:
        r = res["regimes"][reg]["rescue"]
        per = "; ".join(f"{p}: {_f(v['precision'], 2)} / {_f(v['recall'], 2)}" for p, v in r["per_policy"].items())
        out.append(f"| {reg} | {r['set_size']} | {r['observed']} | {r['predicted']} | {_f(r['expected'], 1)} | {r['tp']} | "
                   f"{_f(r['precision'], 2)} | {_f(r['recall'], 2)} | {_f(r['auc'], 2)} | {per} |")
    out += ["", f"Observed: solved (greedy or any sample) at the LLM's last evaluation. Predicted: the bandit's "
            f"P(solved) under the same protocol, mean over bandit seeds, ≥ {opt['threshold']}; expected = the sum of "
            "those probabilities. Precision is undefined (—) without a predicted rescue, recall without an observed one. "
            "AUC: how well the bandit's P(solved) ranks the observed rescues above the rest of the rescue set "
            "(0.5 = chance; — when nothing or everything was rescued).",
            "", "![rescue](rescue.png)", ""]
    if res["sgt_weight_scan"]:
        out += ["## SGT weight diagnostic (not a prediction)", "",
                "The SGT regimes rerun at the fitted settings with λ multiplied by each factor (mean over LLM seeds); "
                "the LLM's own values are in the tables above.", "",
                "| factor | λ | regime | bandit final | bandit rescue share |", "|---|---|---|---|---|"]
        for row in res["sgt_weight_scan"]:
            out.append(f"| {row['factor']:g} | {row['sgt_weight']:.3g} | {row['regime']} | {_f(row['final'])} | "
                       f"{_f(row['rescue_rate'])} |")
        out.append("")
    out += ["## How the numbers are made", "",
            "* Calibration, fit and outcomes: `bandit_sim/calibrate.py`, `bandit_sim/fit.py`, `pipeline.py` "
            "(module docstrings give the construction, the objective and the definitions).",
            "* Sample accuracy = successes / samples over the evaluation prompts (the bandit's `accuracy` is its "
            "expectation); the evaluation s.e. is the binomial one of the final point, mean over policies and seeds.",
            "* Every number here is in `crosscheck.json`; the calibrated scenarios are `scenario_seed<S>.npz` "
            "(`python -m bandit_sim run --scenario FILE.npz` runs one).", ""]
    return "\n".join(out)


def write_report(res: dict, out_dir: str | Path) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    clean = _clean(res)
    (out / "crosscheck.json").write_text(json.dumps(clean, indent=1, allow_nan=False) + "\n")
    plot_curves(clean, out / "curves.png")
    plot_fit(clean, out / "fit.png")
    plot_ordering(clean, out / "ordering.png")
    plot_rescue(clean, out / "rescue.png")
    path = out / "report.md"
    path.write_text(markdown(clean))
    return path
