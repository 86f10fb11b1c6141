"""Print a run's ``summary.json`` as the markdown table of ``experiments/bandit/README.md``.

    python experiments/bandit/summary_table.py experiments/bandit/paper/summary.json
"""

from __future__ import annotations

import json
import sys

COLUMNS = (
    ("accuracy", "accuracy", 3),
    ("rescue_accuracy", "rescue acc.", 3),
    ("support", "support", 3),
    ("kl_to_init", "KL(π‖π₀)", 2),
    ("kl_outside_rescue", "KL outside rescue", 2),
    ("entropy", "entropy", 3),
    ("ratio_variance", "Var[π/μ] (PRP)", 2),
    ("ratio_variance_median", "median over seeds", 2),
    ("true_ratio_variance", "Var[π/π_peer]", 2),
    ("sgt_activations", "SGT gates / seed", 0),
)


def fmt(p: dict, key: str, digits: int) -> str:
    v = p.get(key)
    if v is None:
        return "—"
    s = f"{v:.{digits}f}"
    ci = p.get(key + "_ci95")
    return f"{s} ± {ci:.{digits}f}" if ci is not None else s


def table(summary: dict) -> str:
    names = summary["scenario"]["policy_names"]
    lines = ["| regime | policy | " + " | ".join(c[1] for c in COLUMNS) + " |",
             "|---|---|" + "---|" * len(COLUMNS)]
    for regime, reg in summary["regimes"].items():
        for name, p in zip(names, reg["policies"], strict=True):
            lines.append(f"| {regime} | {name} | " + " | ".join(fmt(p, k, d) for k, _, d in COLUMNS) + " |")
    return "\n".join(lines)


def ordering(summary: dict) -> str:
    mean_acc = {r: sum(p["accuracy"] for p in reg["policies"]) / len(reg["policies"])
                for r, reg in summary["regimes"].items()}
    return " > ".join(f"{r} ({a:.3f})" for r, a in sorted(mean_acc.items(), key=lambda kv: -kv[1]))


if __name__ == "__main__":
    s = json.loads(open(sys.argv[1]).read())
    print(table(s))
    print()
    print("accuracy ordering (mean over policies):", ordering(s))
