"""The kernel model's step against the tabular model's on the same scenario, in the same process.

    python -m experiments.bench.kernel_model_step [--fixture tests/fixtures/demo/seed0.json.gz] [--seeds 32]
        [--steps 100] [--repeats 3]

The scenario is the demo fixture's seed (calibrated counts, the measured kernel, the training split), every
standard regime; the tabular side is the same config with ``model: tabular`` (SGD, no temperature, no drift).
Prints each side's median wall seconds over ``--repeats`` (diagnostics off) and kernel / tabular.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace

import numpy as np

from bandit_sim.calibrate import Counts
from bandit_sim.engine import Engine
from bandit_sim.kernel_fit import KernelSettings, kernel_config, kernel_scenario
from shared_interfaces.regimes import STANDARD_REGIMES
from shared_interfaces.success_matrix import read_success_matrix


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fixture", default="tests/fixtures/demo/seed0.json.gz")
    ap.add_argument("--seeds", type=int, default=32)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    m = read_success_matrix(args.fixture)
    if m.kernel is None or m.split is None:
        raise SystemExit(f"{args.fixture} has no kernel or split; give a fixture written by python -m mrl_llm.demo.fixture")
    counts = Counts(m.samples, m.successes, m.greedy_known)
    lp = np.array([e["logprob"] for e in m.kernel_meta["policies"]])
    sc = kernel_scenario(counts, m.kernel, np.array([x == "train" for x in m.split]), m.policies, 16, 0.03, lp)
    cfg = kernel_config(dict(m.run), STANDARD_REGIMES, sc, KernelSettings(0.1, 0.003, 0.1, 0.03), args.seeds)
    sides = {"tabular": replace(cfg, model="tabular", optimizer="sgd", temperature_lr=0.0, drift=0.0), "kernel": cfg}
    med = {}
    for name, c in sides.items():
        times = []
        for _ in range(args.repeats):
            eng = Engine(sc, c)
            t0 = time.perf_counter()
            for _ in range(args.steps):
                eng.step(diagnose=False)
            times.append(time.perf_counter() - t0)
        med[name] = statistics.median(times)
        print(f"{name}: {args.steps} steps x {len(STANDARD_REGIMES)} regimes x {args.seeds} seeds on "
              f"{sc.n_contexts} contexts: median {med[name]:.2f} s over {args.repeats}")
    print(f"kernel / tabular: {med['kernel'] / med['tabular']:.2f}x")


if __name__ == "__main__":
    main()
