"""The kernel model against the demo's observed runs (issue 40's acceptance), beside the tabular model.

    python -m experiments.crosscheck.kernel_demo --fixture tests/fixtures/demo [--seeds 32] [--out FILE.json]

Per seed of the fixture (``python -m mrl_llm.demo.fixture``: ``seed<S>.json.gz`` with the kernel, ``seed<S>/<regime>
.dynamics.json.gz``), ``bandit_sim predict --model kernel`` is fitted on that seed's GRPO run only and predicts every
regime; the observed values are each regime's own run (:meth:`bandit_sim.kernel_fit.Curves.observed`: ``final``
the training pool's sampled accuracy at the last evaluation, ``heldout_change`` the own family's held-out sampled
accuracy's change from step 0, ``rescue_rate`` the share of the rescue set solved, each the mean over policies
or pooled as the module says). The tabular model (``predict`` on the same matrix, its probe the same GRPO run's
matrix) is run beside on ``final`` and ``rescue_rate``. Printed: the acceptance checks of issue 40 with what
was measured, per seed and as means over seeds.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np

from bandit_sim.kernel_fit import curves_from_dynamics
from bandit_sim.predict import PredictOptions, predict
from shared_interfaces.dynamics import read_dynamics
from shared_interfaces.regimes import STANDARD_REGIMES
from shared_interfaces.success_matrix import read_success_matrix

KEYS = ("final", "heldout_change", "rescue_rate")


def seed_result(fixture: Path, seed: int, seeds: int) -> dict:
    m = read_success_matrix(fixture / f"seed{seed}.json.gz")
    dyn = {r: read_dynamics(fixture / f"seed{seed}" / f"{r}.dynamics.json.gz") for r in STANDARD_REGIMES}
    obs = {r: curves_from_dynamics(d, m.prompts, m.policies).observed() for r, d in dyn.items()}
    curves = curves_from_dynamics(dyn["grpo"], m.prompts, m.policies)
    n_train = {r: int(curves_from_dynamics(d, m.prompts, m.policies).samples[:, -1][:, curves.train].sum())
               for r, d in dyn.items()}
    out = {"observed": obs, "train_samples": n_train, "rescue_set": int(curves.rescue_set().sum())}
    for model in ("kernel", "tabular"):
        t0 = time.perf_counter()
        if model == "kernel":  # one fit; the regime to use for every objective from it
            res = predict(m, None, PredictOptions(seeds=seeds, model=model), dyn["grpo"])
            by = {o: res["by_objective"][o] for o in ("final", "rescue")}
        else:
            by = {}
            for objective in ("final", "rescue"):
                res = predict(m, m, PredictOptions(seeds=seeds, objective=objective, model=model))
                by[objective] = {"use": res["use"], "clear_winner": res["clear_winner"]}
        out[model] = {"regimes": res["regimes"], "free_settings": res["free_settings"],
                      "use": {k: v["use"] for k, v in by.items()}, "clear": {k: v["clear_winner"] for k, v in by.items()},
                      "seconds": time.perf_counter() - t0}
    return out


def binomial_se(p: float, n: int) -> float:
    return math.sqrt(max(p * (1 - p), 1e-12) / max(n, 1))


def hit(res: dict, objective: str, regime: str) -> bool:
    """``regime`` is within two binomial standard errors of the seed's observed best on ``objective``."""
    key = "final" if objective == "final" else "rescue_rate"
    obs = {r: o[key] for r, o in res["observed"].items()}
    best = max(obs, key=obs.get)
    n = res["train_samples"][best] if key == "final" else res["rescue_set"] * 1
    return obs[regime] >= obs[best] - 2 * binomial_se(obs[best], n)


def _mean(values: list) -> float:
    v = [x for x in values if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return float(np.mean(v)) if v else math.nan


def _pred(res: dict, model: str, regime: str, key: str) -> float | None:
    return (res[model]["regimes"][regime].get(key) or {}).get("mean")


def report(per: dict[int, dict]) -> list[str]:
    seeds = sorted(per)
    runs = [per[s] for s in seeds]
    lines = ["| regime | model | final pred | final obs | Δheld-out pred | Δheld-out obs | rescue pred | rescue obs | "
             "rescue pred/obs |", "|---|---|---|---|---|---|---|---|---|"]
    for r in STANDARD_REGIMES:
        for model in ("kernel", "tabular"):
            fp, hp, rp = (_mean([_pred(x, model, r, k) for x in runs]) for k in ("final", "heldout_change", "rescue_rate"))
            fo, ho, ro = (_mean([x["observed"][r][k] for x in runs]) for k in ("final", "heldout_change", "rescue_rate"))
            lines.append(f"| {r} | {model} | {fp:.3f} | {fo:.3f} | {hp:.3f} | {ho:.3f} | {rp:.3f} | {ro:.3f} | "
                         f"{rp / ro if ro else math.nan:.2f} |")
    lines.append("")
    for model in ("kernel", "tabular"):
        for a, key in (("sgt", "final"), ("prp_snapshot", "final"), ("sgt", "heldout_change")):
            pd = [(_pred(x, model, a, key) or math.nan) - (_pred(x, model, "grpo", key) or math.nan) for x in runs]
            od = [x["observed"][a][key] - x["observed"]["grpo"][key] for x in runs]
            half = 2.776 * np.std(od, ddof=1) / math.sqrt(len(od)) if len(od) > 1 else math.nan
            lines.append(f"{model}: {a} − grpo {key}: predicted {_mean(pd):+.3f}, observed {np.mean(od):+.3f} "
                         f"± {half:.3f} (paired over {len(od)} seeds)")
        for objective in ("final", "rescue"):
            uses = [x[model]["use"][objective] for x in runs]
            hits = sum(hit(x, objective, u) and x[model]["clear"][objective] for x, u in zip(runs, uses, strict=True))
            grpo = sum(hit(x, objective, "grpo") for x in runs)
            clear = [x[model]["clear"][objective] for x in runs]
            lines.append(f"{model}: use for --objective {objective}: {uses} (clear winner {clear}); within 2 binomial SE "
                         f"of the observed best and a clear winner on {hits} of {len(runs)} seeds (always GRPO: "
                         f"{grpo} of {len(runs)})")
        for key in ("rescue_rate", "final"):
            cov = sum(abs(x[model]["regimes"]["sgt"][key]["mean"] - x["observed"]["sgt"][key])
                      <= (x[model]["regimes"]["sgt"][key]["ci95"] or 0.0) for x in runs)
            lines.append(f"{model}: sgt {key} ci95 covers the observed on {cov} of {len(runs)} seeds")
        secs = [x[model]["seconds"] for x in runs]
        lines.append(f"{model}: seconds per seed (fit + predict, both objectives) {min(secs):.0f}–{max(secs):.0f}")
        lines.append("")
    return lines


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fixture", default="tests/fixtures/demo")
    ap.add_argument("--seeds", type=int, default=32, help="bandit seeds per prediction")
    ap.add_argument("--only", type=int, nargs="*", help="fixture seeds (default: all in observed.json)")
    ap.add_argument("--out", help="also write the per-seed numbers as JSON")
    args = ap.parse_args(argv)
    fx = Path(args.fixture)
    seeds = args.only or json.loads((fx / "observed.json").read_text())["seeds"]
    per = {}
    for s in seeds:
        per[s] = seed_result(fx, s, args.seeds)
        k = per[s]["kernel"]
        print(f"seed {s}: kernel {k['free_settings']['lr']:g}/{k['free_settings']['temperature_lr']:g}/"
              f"{k['free_settings']['drift']:g}/{k['free_settings']['floor']:g}, use {k['use']} "
              f"(clear {k['clear']}), {k['seconds']:.0f} s", flush=True)
    print("\n".join(report(per)))
    if args.out:
        Path(args.out).write_text(json.dumps(per, indent=1, default=lambda o: o.tolist() if hasattr(o, "tolist")
                                             else str(o)))


if __name__ == "__main__":
    main()
