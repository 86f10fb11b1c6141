"""The committed demo fixture: success matrices and observed outcomes of the demo's 5-seed runs, rebuilt from
the cross-check's committed outputs (the run directories themselves are not in the repository).

``python -m experiments.crosscheck.fixture --crosscheck experiments/crosscheck/demo --out tests/fixtures/demo``
writes ``seed<S>.json`` (a success matrix per LLM seed) and ``observed.json`` (the outcomes pooled over seeds).

What each part comes from, and what it can and cannot hold:

* **Step-0 counts**: the calibrated scenario ``scenario_seed<S>.npz`` holds each (policy, prompt)'s success
  probability ``p`` (:mod:`bandit_sim.calibrate`: ``softmax`` of the correct arm) and ``crosscheck.json``
  the samples per prompt ``n`` (4) and the floor ``p_never``. The calibration's four cases invert exactly:
  ``p = p_never`` -> 0 successes, greedy wrong; ``p = 1/(2n)`` -> 0 successes, greedy right; ``p = 1 -
  p_never`` -> ``n`` successes; otherwise ``round(p n)`` successes. The greedy answer where a sample
  succeeded is not recoverable (the calibration never uses it): ``null``. Prompt ids are the sorted
  order's positions (``prompt000`` ...; the real ids are not in the outputs) and families are unknown
  (``null``). Calibrating the fixture gives the committed scenarios back (``tests/bandit/test_predict.py``).
* **Run settings**: the demo's trainer settings (:func:`mrl_llm.demo.setup.run_config` at its defaults, the
  setting of ``experiments/demo/README.md``), regime ``grpo``.
* **Curve**: the seed's GRPO sample-accuracy curve (``llm_curve_per_seed``), so a seed's matrix is also its
  own GRPO probe.
* **Outcomes per seed**: per regime the final sample accuracy per policy and the mean over the evaluations
  after step 0 (from ``llm_curve_per_seed``); the rescue rate is only in pooled form, so it is ``null``
  per seed and given in ``observed.json`` (pooled over the five seeds, as ``crosscheck.json`` has it).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

from bandit_sim.calibrate import CORRECT_ARM
from bandit_sim.scenario import load_scenario
from shared_interfaces.success_matrix import SuccessMatrix, validate_outcomes, write_success_matrix

DEMO_RUN = {  # mrl_llm.demo.setup.run_config at DemoConfig's defaults (the measured demo)
    "steps": 100, "prompts_per_step": 16, "group_size": 8, "eval_k": 4,
    "regime": {"name": "grpo", "sgt": {"weight": 0.2, "successes_per_prompt": 1, "selection": "shortest"},
               "prp": {"peer_weight": 1.0, "ratio_cap": 2.0}},
    "loss": {"clip_low": 0.2, "clip_high": 0.28, "agg": "token-mean", "kl_coef": 0.0},
}


def counts_from_probabilities(p: np.ndarray, n: int, p_never: float) -> tuple[np.ndarray, np.ndarray]:
    """Invert the calibration (module docstring): ``(successes [P, C], greedy [P, C] with NaN = unknown)``."""
    close = lambda a, b: np.isclose(a, b, rtol=1e-9, atol=1e-15)  # noqa: E731
    s = np.rint(p * n).astype(np.int64)
    g = np.full(p.shape, np.nan)
    never, greedy_only, always = close(p, p_never), close(p, 0.5 / n), close(p, 1.0 - p_never)
    s[never | greedy_only] = 0
    g[never] = 0.0
    g[greedy_only] = 1.0
    s[always] = n
    middle = ~(never | greedy_only | always)
    if not np.allclose(s[middle] / n, p[middle], atol=1e-9):
        raise ValueError("the scenario's probabilities are not s / n for the stated n; cannot invert the calibration")
    return s, g


def build(crosscheck_dir: Path) -> tuple[list[SuccessMatrix], dict]:
    cc = json.loads((crosscheck_dir / "crosscheck.json").read_text())
    meta, regs = cc["llm_runs"], cc["regimes"]
    pols = meta["policies"]
    fractions = np.array(regs["grpo"]["fractions"])
    steps = np.rint(fractions * meta["steps"]).astype(np.int64)
    matrices = []
    for k, seed in enumerate(meta["seeds"]):
        cal = cc["calibration"][str(seed)]
        sc = load_scenario(crosscheck_dir / f"scenario_seed{seed}.npz")
        n = int(round(cal["policies"][pols[0]]["samples_per_prompt"]))
        p = sc.init_probs()[..., CORRECT_ARM]
        s, g = counts_from_probabilities(p, n, cal["p_never"])
        for i, pol in enumerate(pols):
            if not math.isclose(s[i].sum() / (n * s.shape[1]), cal["policies"][pol]["llm_step0_sample_accuracy"]):
                raise ValueError(f"seed {seed}: rebuilt step-0 accuracy of {pol} differs from crosscheck.json")
        outcomes = {}
        for reg, v in regs.items():
            curves = np.array([v["llm_curve_per_seed"][pol][k] for pol in pols])  # [P, T]
            outcomes[reg] = {"final_accuracy": curves[:, -1].tolist(), "mean_accuracy": float(curves[:, 1:].mean()),
                             "rescue_rate": None, "rescue_set": None, "seeds": 1}
        grpo = np.array([regs["grpo"]["llm_curve_per_seed"][pol][k] for pol in pols])
        matrices.append(SuccessMatrix(
            policies=tuple(pols), prompts=tuple(f"prompt{c:03d}" for c in range(s.shape[1])),
            samples=np.full(s.shape, n), successes=s, greedy_correct=g, families=None,
            run={**DEMO_RUN, "seed": int(seed)}, curve_steps=steps, curve_accuracy=grpo, outcomes=outcomes))
    observed = {reg: {"final_accuracy": [v["final_per_policy"][pol]["llm"] for pol in pols],
                      "mean_accuracy": v["llm"]["mean"], "rescue_rate": v["llm"]["rescue_rate"],
                      "rescue_set": v["rescue"]["set_size"], "seeds": len(meta["seeds"])} for reg, v in regs.items()}
    validate_outcomes(observed, len(pols), where="observed outcomes")
    return matrices, {"source": "experiments/crosscheck/demo/crosscheck.json", "policies": pols,
                      "seeds": meta["seeds"], "outcomes": observed}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.crosscheck.fixture", description=__doc__.split("\n")[0])
    ap.add_argument("--crosscheck", default="experiments/crosscheck/demo", help="a cross-check output directory")
    ap.add_argument("--out", default="tests/fixtures/demo", help="fixture directory")
    args = ap.parse_args(argv)
    out = Path(args.out)
    matrices, observed = build(Path(args.crosscheck))
    for m in matrices:
        write_success_matrix(out / f"seed{m.run['seed']}.json", m)
    (out / "observed.json").write_text(json.dumps(observed, indent=1) + "\n")
    print(f"{len(matrices)} success matrices and observed.json -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
