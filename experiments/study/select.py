"""Compare study settings on selection seeds: the acceptance checks' numbers of several study directories, and
how likely each check is to pass with the acceptance's 3 seeds.

For each ``DIR`` (a finished ``python -m mrl_llm study --out DIR`` run; its ``study.json``), one line per
policy: GRPO's start -> final paired difference (own held-out sampled, own-family pool reward, own held-out
greedy) as mean ± 95 % t-half-width over the directory's seeds, the ratio mean / seed sd, and P3, the
probability that a 3-seed 95 % t-interval excludes 0 for a difference with that mean and sd (normal, simulated);
then SGT − GRPO at the final step (peer-exclusive and own held-out sampled, mean over policies) where SGT ran.
``--grpo-from DIR2`` pairs the SGT runs of DIR with the GRPO runs of DIR2 (GRPO does not depend on the SGT
weight, so a λ variant need not rerun GRPO). The numbers come from :mod:`mrl_llm.demo.study_report`
(``paired``), the functions the study's own report uses.

    python -m experiments.study.select runs/sw/v1 runs/sw/v8 [--grpo-from runs/sw/v8] [--markdown]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from experiments.study.noise_check import t_pass_probability
from mrl_llm.demo.study_report import ACCEPT, paired


def load(d: str | Path) -> tuple[dict, list[int], list[str], list[int]]:
    """``(res, seeds, policies, steps)`` of a study directory's ``study.json`` (``res`` keyed ``(regime, seed)``,
    curves keyed by int step, as :func:`mrl_llm.demo.study_report.collect` gives them)."""
    path = Path(d) / "study.json"
    if not path.is_file():
        raise SystemExit(f"{path}: no study.json; run `python -m mrl_llm study --out {d}` to the end first")
    try:
        doc = json.loads(path.read_text())
        runs, steps = doc["runs"], doc["steps"]
    except (ValueError, KeyError, TypeError) as e:
        raise SystemExit(f"{path}: not a study report ({type(e).__name__}: {e}); rerun `python -m mrl_llm study "
                         f"--out {d}` to rewrite it") from None
    res = {}
    for key, curves in runs.items():
        reg, seed = key.split("/seed")
        res[(reg, int(seed))] = {p: {m: {int(s): v for s, v in by.items()} for m, by in c.items()}
                                 for p, c in curves.items()}
    seeds = sorted({s for _, s in res})
    policies = list(next(iter(res.values()))) if res else []
    return res, seeds, policies, [int(s) for s in steps]


def p3(diffs: list[float]) -> float | None:
    """P(a 3-seed 95 % t-interval of N(mean(diffs), sd(diffs)) draws excludes 0 on the positive side)
    (:func:`experiments.study.noise_check.t_pass_probability` at mean / sd)."""
    if len(diffs) < 2:
        return None
    m, sd = float(np.mean(diffs)), float(np.std(diffs, ddof=1))
    if sd == 0:
        return float(m > 0)
    return t_pass_probability(m / sd, 3)


def _diffs(res: dict, a: str, b: str | None, metric: str, step_a: int, step_b: int, seeds: list[int],
           policies: list[str]) -> list[float]:
    out = []
    for s in seeds:
        one = paired(res, a, b, metric, step_a, step_b, [s], policies)
        if one[2] == 1:
            out.append(one[0])
    return out


def _cell(res, a, b, metric, sa, sb, seeds, pols, with_p3: bool) -> str:
    mean, half, n = paired(res, a, b, metric, sa, sb, seeds, pols)
    if n == 0:
        return "-"
    ds = _diffs(res, a, b, metric, sa, sb, seeds, pols)
    sd = float(np.std(ds, ddof=1)) if len(ds) > 1 else float("nan")
    star = "*" if half is not None and mean - half > 0 else ""
    txt = f"{mean:+.3f} ± {half:.3f}{star}" if half is not None else f"{mean:+.3f}"
    if with_p3:
        p = p3(ds)
        txt += f" ({mean / sd:.1f} sd, P3 {p:.2f})" if p is not None and sd > 0 else ""
    return txt


def report(d: str, grpo_from: str | None = None) -> list[str]:
    res, seeds, pols, steps = load(d)
    if grpo_from:
        other = load(grpo_from)[0]
        res = {**{k: v for k, v in other.items() if k[0] == "grpo"}, **{k: v for k, v in res.items() if k[0] != "grpo"}}
    last = steps[-1]
    lines = [f"### {d} (seeds {seeds}, step 0 -> {last})", "",
             "| policy | GRPO own held-out sampled | GRPO own pool reward | GRPO own held-out greedy (not checked) |",
             "|---|---|---|---|"]
    for p in pols:
        lines.append(f"| {p} | " + " | ".join(_cell(res, "grpo", None, m, last, 0, seeds, [p], m != "own")
                                            for m in (ACCEPT["own"], "reward", "own")) + " |")
    if any(k[0] == "sgt" for k in res):
        ex = _cell(res, "sgt", "grpo", ACCEPT["excl"], last, last, seeds, pols, True)
        own = _cell(res, "sgt", "grpo", ACCEPT["own"], last, last, seeds, pols, False)
        lines += ["", f"SGT − GRPO (final, mean over policies): peer-exclusive sampled {ex}; own held-out sampled {own} "
                  "(the check needs a mean >= -0.05)" + (f"; GRPO runs from {grpo_from}" if grpo_from else "")]
    return lines + [""]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dirs", nargs="+", help="study directories (each with a study.json)")
    ap.add_argument("--grpo-from", help="take the GRPO runs from this study directory (for every DIR)")
    args = ap.parse_args(argv)
    for d in args.dirs:
        print("\n".join(report(d, args.grpo_from)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
