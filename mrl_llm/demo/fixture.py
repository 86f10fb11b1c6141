"""The demo fixture: per seed a success matrix, and the observed per-regime outcomes, from a demo's own runs.

    python -m mrl_llm.demo.fixture --demo runs/demo --out tests/fixtures/demo

``--demo DIR`` is what ``python -m mrl_llm demo --out DIR --seeds N`` writes: one trainer run directory per
seed and regime, ``DIR/seed<S>/<regime>/`` (found by their ``config.json``; the seed and the regime are the
config's ``seed`` and ``regime.name``; ``DIR/seed<S>/sft/`` and other directories without one are not
runs). Every run must be finished (its ``summary.json`` written). Each run's success matrix is extracted
from its directory as the run's end writes it (:func:`mrl_llm.success_matrix.matrix_from_run`).

Written to ``--out``:

* ``seed<S>.json.gz`` — the seed's success matrix (gzip-compressed) (:mod:`shared_interfaces.success_matrix`): the step-0
  ``samples`` / ``successes`` / ``greedy_correct`` pooled over the *distinct* step-0 evaluations of the
  seed's runs (every regime starts from the same weights; identical copies are counted once, as
  ``experiments/crosscheck`` pools them; greedy correct if correct in any copy), ``run`` and ``curve``
  of the seed's ``--probe-regime`` run (default ``grpo``: the matrix is then its own GRPO probe for
  ``bandit_sim predict --probe-run``), and ``outcomes``: every regime's own outcome in that seed.
* ``seed<S>/<regime>.dynamics.json.gz`` — each run's per-prompt dynamics (:mod:`shared_interfaces.dynamics`),
  gzip-compressed, the kernel model's fit input (GRPO's) and its observed outcomes (every regime's).
* with ``--kernel`` (the default), ``seed<S>.json.gz`` also carries the policies' transfer kernels at the seed's
  start (:func:`mrl_llm.kernel.run_kernel` on the probe run: every regime starts from the same weights).
* ``observed.json`` — ``{"source", "policies", "seeds", "outcomes"}``, per regime pooled over the seeds:
  ``final_accuracy`` per policy and ``mean_accuracy`` are means over the seeds, ``rescue_set`` the sum of
  the seeds' rescue sets and ``rescue_rate`` the share of that pooled set solved at the last evaluation
  (each seed's rate weighted by its set size), ``seeds`` the number of seeds.

Every seed must have run the same regimes with the same policies and prompts; anything else is a
:class:`~shared_interfaces.success_matrix.SuccessMatrixError` naming the run directory and what to do.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from mrl_llm.success_matrix import matrix_from_run
from shared_interfaces.success_matrix import (
    SuccessMatrix,
    SuccessMatrixError,
    validate_outcomes,
    write_success_matrix,
)

OBSERVED = "observed.json"


def find_runs(demo_dir: str | Path) -> dict[int, dict[str, Path]]:
    """``{seed: {regime: run_dir}}`` of the finished runs under ``demo_dir`` (module docstring)."""
    root = Path(demo_dir)
    if not root.is_dir():
        raise SuccessMatrixError(f"--demo {root} is not a directory; give the --out of `python -m mrl_llm demo`")
    runs: dict[int, dict[str, Path]] = {}
    for cfg_path in sorted(root.glob("seed*/*/config.json")):
        d = cfg_path.parent
        try:
            cfg = json.loads(cfg_path.read_text())
            seed, regime = int(cfg["seed"]), str(cfg["regime"]["name"])
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
            raise SuccessMatrixError(f"{cfg_path} is not a trainer config with 'seed' and 'regime.name' ({err!r}); "
                                     "remove that directory or rerun the demo into a new --out") from err
        if not (d / "summary.json").is_file():
            raise SuccessMatrixError(f"run {d} has not finished (no summary.json); let `python -m mrl_llm demo` "
                                     "finish (it reuses finished runs when restarted with the same --out)")
        if regime in runs.setdefault(seed, {}):
            raise SuccessMatrixError(f"runs {runs[seed][regime]} and {d} are both seed {seed}, regime {regime}; "
                                     "keep one")
        runs[seed][regime] = d
    if not runs:
        raise SuccessMatrixError(f"no run directories under {root} (expected {root}/seed<S>/<regime>/config.json, "
                                 "as `python -m mrl_llm demo --out DIR` writes them)")
    return runs


def pooled_start(matrices: Sequence[SuccessMatrix], names: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(samples, successes, greedy_correct)`` pooled over the distinct step-0 evaluations (module docstring)."""
    ref = matrices[0]
    for m, name in zip(matrices, names, strict=True):
        if m.policies != ref.policies or m.prompts != ref.prompts:
            raise SuccessMatrixError(f"run {name} evaluated other policies or prompts at step 0 than run {names[0]}; a "
                                     "seed's runs must start from the same policies on the same prompt pool")
    seen: list[tuple[bytes, bytes, bytes]] = []
    n = np.zeros(ref.samples.shape, dtype=np.int64)
    s = np.zeros_like(n)
    g = np.full(n.shape, np.nan)
    for m in matrices:
        key = (m.samples.tobytes(), m.successes.tobytes(), np.nan_to_num(m.greedy_correct, nan=-1).tobytes())
        if key in seen:
            continue
        seen.append(key)
        n += m.samples
        s += m.successes
        g = np.where(np.isnan(g), m.greedy_correct, np.fmax(g, m.greedy_correct))
    return n, s, g


def seed_matrix(runs: dict[str, Path], *, probe_regime: str = "grpo") -> SuccessMatrix:
    """One seed's fixture matrix from its runs ``{regime: run_dir}`` (module docstring)."""
    if probe_regime not in runs:
        some = next(iter(runs.values()))
        raise SuccessMatrixError(f"{some.parent} has no {probe_regime} run (regimes there: {sorted(runs)}); the "
                                 "seed's matrix takes its curve from it: run it, or pass --probe-regime")
    regimes = sorted(runs)
    matrices = [matrix_from_run(runs[r]) for r in regimes]
    n, s, g = pooled_start(matrices, [str(runs[r]) for r in regimes])
    probe = matrices[regimes.index(probe_regime)]
    outcomes = {r: m.outcomes[r] for r, m in zip(regimes, matrices, strict=True)}
    return replace(probe, samples=n, successes=s, greedy_correct=g, outcomes=outcomes)


def observed_outcomes(per_seed: dict[int, SuccessMatrix]) -> dict[str, dict[str, Any]]:
    """The regimes' outcomes pooled over the seeds (module docstring)."""
    seeds = sorted(per_seed)
    first = per_seed[seeds[0]]
    for seed in seeds[1:]:
        if sorted(per_seed[seed].outcomes) != sorted(first.outcomes):
            raise SuccessMatrixError(f"seed {seed} ran regimes {sorted(per_seed[seed].outcomes)}, seed {seeds[0]} ran "
                                     f"{sorted(first.outcomes)}; every seed needs the same regimes to pool them")
        if per_seed[seed].policies != first.policies:
            raise SuccessMatrixError(f"seed {seed} trained policies {list(per_seed[seed].policies)}, seed {seeds[0]} "
                                     f"{list(first.policies)}; the seeds must train the same policies")
    out = {}
    for reg in first.outcomes:
        os_ = [per_seed[s].outcomes[reg] for s in seeds]
        means = [o["mean_accuracy"] for o in os_ if o["mean_accuracy"] is not None]
        with_rescue = [o for o in os_ if o["rescue_rate"] is not None and o["rescue_set"]]
        pooled_set = sum(int(o["rescue_set"]) for o in with_rescue)
        out[reg] = {
            "final_accuracy": np.mean([o["final_accuracy"] for o in os_], axis=0).tolist(),
            "mean_accuracy": float(np.mean(means)) if means else None,
            "rescue_rate": sum(o["rescue_rate"] * o["rescue_set"] for o in with_rescue) / pooled_set
            if pooled_set else None,
            "rescue_set": sum(int(o["rescue_set"]) for o in os_ if o["rescue_set"] is not None),
            "seeds": len(seeds)}
    validate_outcomes(out, len(first.policies), where="observed outcomes")
    return out


def with_kernel(m: SuccessMatrix, run_dir: Path, tmp: Path) -> SuccessMatrix:
    """``m`` with the kernel :func:`mrl_llm.kernel.run_kernel` measures at ``run_dir``'s start (over the same
    prompts, in the same order)."""
    from mrl_llm.kernel import run_kernel

    _, k = run_kernel(run_dir, tmp)
    if k.prompts != m.prompts or k.policies != m.policies:
        raise SuccessMatrixError(f"the kernel of {run_dir} is over other prompts or policies than its seed's matrix; "
                                 "rerun the demo into a new --out")
    return replace(m, kernel=k.kernel, kernel_meta=k.kernel_meta)


def build_fixture(demo_dir: str | Path, out_dir: str | Path, *, probe_regime: str = "grpo",
                  kernel: bool = True) -> list[Path]:
    """Write ``seed<S>.json.gz`` per seed (with its kernel when ``kernel``), every run's ``seed<S>/<regime>.dynamics
    .json.gz`` and ``observed.json`` to ``out_dir``; returns the files written."""
    import tempfile

    from mrl_llm.dynamics import dynamics_from_run
    from shared_interfaces.dynamics import write_dynamics

    runs = find_runs(demo_dir)
    per_seed = {seed: seed_matrix(regs, probe_regime=probe_regime) for seed, regs in sorted(runs.items())}
    observed = observed_outcomes(per_seed)
    out = Path(out_dir)
    files = []
    for seed, regs in sorted(runs.items()):
        files += [write_dynamics(out / f"seed{seed}" / f"{reg}.dynamics.json.gz", dynamics_from_run(d))
                  for reg, d in sorted(regs.items())]
        if kernel:
            with tempfile.TemporaryDirectory() as tmp:
                per_seed[seed] = with_kernel(per_seed[seed], regs[probe_regime], Path(tmp) / "k.json")
    files += [write_success_matrix(out / f"seed{seed}.json.gz", m) for seed, m in per_seed.items()]
    doc = {"source": f"python -m mrl_llm.demo.fixture over the demo's runs ({len(per_seed)} seeds)",
           "policies": list(next(iter(per_seed.values())).policies), "seeds": sorted(per_seed), "outcomes": observed}
    (out / OBSERVED).write_text(json.dumps(doc, indent=1) + "\n")
    return [*files, out / OBSERVED]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mrl_llm.demo.fixture", description=__doc__.split("\n")[0])
    ap.add_argument("--demo", required=True, help="a demo directory (python -m mrl_llm demo --out DIR)")
    ap.add_argument("--out", default="tests/fixtures/demo", help="fixture directory (default tests/fixtures/demo)")
    ap.add_argument("--probe-regime", default="grpo", help="the regime whose run gives each seed's run and curve")
    ap.add_argument("--kernel", action=argparse.BooleanOptionalAction, default=True,
                    help="measure the policies' transfer kernels at each seed's start into its matrix (default on)")
    args = ap.parse_args(argv)
    from mrl_llm.cli import USER_ERRORS, one_line

    try:
        files = build_fixture(args.demo, args.out, probe_regime=args.probe_regime, kernel=args.kernel)
    except USER_ERRORS as err:
        print(f"mrl_llm.demo.fixture: {one_line(err)}", file=sys.stderr)
        return 2
    print(f"{len(files) - 1} success matrices and dynamics files, and {OBSERVED} -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
