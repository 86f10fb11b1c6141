"""Calibrate the bandit on LLM runs, fit it on their GRPO run and predict the other regimes.

``python -m experiments.crosscheck --llm-runs DIR --out DIR`` writes ``DIR/report.md``, PNGs,
``crosscheck.json`` and the scenarios.

``--llm-runs`` holds one trainer run directory per regime (``DIR/<regime>/``), or is a demo directory
(``DIR/seed<S>/<regime>/``, every seed used). Bad input exits with status 2 and a one-line message.
"""

from __future__ import annotations

import argparse
import sys
import time

from bandit_sim.calibrate import CalibrationConfig
from bandit_sim.fit import SimOptions
from experiments.crosscheck.llm_runs import RunsError
from experiments.crosscheck.pipeline import CrosscheckOptions, run_crosscheck
from experiments.crosscheck.report import write_report
from shared_interfaces.config_io import ConfigError


def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(x) for x in text.split(",") if x.strip())


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m experiments.crosscheck", description=__doc__.split("\n")[0])
    ap.add_argument("--llm-runs", required=True, help="directory of LLM runs (one per regime) or a demo directory")
    ap.add_argument("--out", required=True, help="report directory")
    d = SimOptions()
    ap.add_argument("--arms", type=int, default=CalibrationConfig().arms, help="bandit arms per prompt (one correct)")
    ap.add_argument("--alpha", type=float, default=CalibrationConfig().alpha,
                    help="never-solved floor: p_never = alpha / (expected draws of the prompt in the run)")
    ap.add_argument("--bandit-seeds", type=int, default=d.seeds, help="bandit seeds per LLM seed")
    ap.add_argument("--thl-sigma", type=float, default=d.thl_sigma, help="THL residual on prp_thl's denominator")
    ap.add_argument("--sgd-lrs", type=_floats, default=d.sgd_lrs,
                    help="comma-separated SGD learning rates to fit over ('' leaves SGD out)")
    ap.add_argument("--adam-lrs", type=_floats, default=d.adam_lrs,
                    help="comma-separated Adam learning rates to fit over ('' leaves Adam out)")
    ap.add_argument("--epochs", type=_ints, default=d.epochs, help="comma-separated epochs per step to fit over")
    ap.add_argument("--threshold", type=float, default=CrosscheckOptions().threshold, help="predicted rescue: mean P(solved) >= this")
    ap.add_argument("--sgt-factors", type=_floats, default=CrosscheckOptions().sgt_factors,
                    help="SGT weight diagnostic: multiples of the LLM's lambda to rerun the SGT regimes with")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    t0 = time.perf_counter()
    try:
        opts = CrosscheckOptions(
            calibration=CalibrationConfig(arms=args.arms, alpha=args.alpha),
            sim=SimOptions(seeds=args.bandit_seeds, thl_sigma=args.thl_sigma, sgd_lrs=args.sgd_lrs,
                           adam_lrs=args.adam_lrs, epochs=args.epochs),
            threshold=args.threshold, sgt_factors=args.sgt_factors,
        )
        res = run_crosscheck(args.llm_runs, args.out, opts)
    except (RunsError, ConfigError, ValueError) as err:
        print(f"crosscheck: error: {err}", file=sys.stderr)
        return 2
    path = write_report(res, args.out)
    s = res["ordering"]["final"]["spearman"]
    print(f"crosscheck: {path} in {time.perf_counter() - t0:.0f} s; final-accuracy ordering Spearman "
          f"{s['statistic']:.2f} (one-sided p {s['p_greater']:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
