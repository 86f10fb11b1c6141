"""The cross-check end to end: LLM runs -> calibrated scenarios -> fit on GRPO -> predictions -> numbers.

:func:`run_crosscheck` returns (and :mod:`experiments.crosscheck.report` writes) a JSON-able dict:

* ``calibration`` — per LLM seed: the floor ``p_never``, per policy the scenario's initial accuracy
  (mean ``p``), the LLM's step-0 sample accuracy, the rescue-set size;
* ``fit`` — the GRPO grid (:func:`bandit_sim.fit.fit_grid`) and its best setting;
* ``regimes`` — per regime, on the budget axis: the LLM's per-policy sample-accuracy curve (mean over
  LLM seeds) and the bandit's (mean over LLM seeds of its mean over bandit seeds), the RMSE between them
  and the flat baseline's; three scalar outcomes for the ordering: ``final`` (accuracy at the last
  evaluation) and ``mean`` (mean accuracy over the evaluations after step 0), each mean over policies
  and LLM seeds, and ``rescue_rate`` (share of the rescue-set entries, pooled over policies and seeds,
  solved at the end: observed in the LLM's evaluation, expected ``P(solved)`` in the bandit), with
  ``rescue_curve`` the same share at every evaluation; the LLM's binomial evaluation noise on ``final``;
* ``ordering`` — for each outcome, Spearman and Kendall between the bandit's and the LLM's values
  over the regimes, with exact permutation p-values (:mod:`bandit_sim.stats`);
* ``rescue`` — per regime, the predicted rescues (``mean over bandit seeds of P(solved) >= threshold``,
  default 0.5) against the observed ones (solved at the LLM's last evaluation), over the entries of the
  rescue sets pooled over policies and LLM seeds, and the AUC of the bandit's P(solved) for telling the
  observed rescues from the rest of the rescue set (threshold-free; 0.5 = no better than chance);
* ``sgt_weight_scan`` — the SGT diagnostic of :func:`experiments.crosscheck.simulate.sgt_weight_scan`,
  mean over LLM seeds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bandit_sim.calibrate import Calibration, CalibrationConfig, calibrate
from bandit_sim.fit import (
    FitCase,
    FreeSettings,
    Prediction,
    SimOptions,
    bandit_config,
    curve_sse,
    fit_grid,
    simulate,
)
from bandit_sim.scenario import save_scenario
from bandit_sim.stats import auc, precision_recall, rank_agreement
from experiments.crosscheck.llm_runs import LLMRun, discover, group_size, step0_counts
from experiments.crosscheck.simulate import sgt_weight_scan
from shared_interfaces.regimes.config import STANDARD_REGIMES, parse_regime

OUTCOMES = ("final", "mean", "rescue_rate")


@dataclass(frozen=True)
class CrosscheckOptions:
    calibration: CalibrationConfig = field(default_factory=CalibrationConfig)
    sim: SimOptions = field(default_factory=SimOptions)
    threshold: float = 0.5
    sgt_factors: tuple[float, ...] = (1.0, 3.0, 10.0, 30.0, 100.0)


@dataclass
class SeedData:
    """One LLM seed: its runs, calibration, evaluation axis and (after the fit) the bandit's prediction."""

    seed: int
    runs: dict[str, LLMRun]
    cal: Calibration
    fractions: np.ndarray
    llm_acc: dict[str, np.ndarray]  # regime -> [P, T] sample accuracy on `fractions`
    llm_n: dict[str, np.ndarray]  # regime -> [P] samples in the final evaluation
    pred: Prediction | None = None


def regime_order(names) -> list[str]:
    std = [r for r in STANDARD_REGIMES if r in names]
    return std + sorted(set(names) - set(std))


def _seed_data(seed: int, runs: dict[str, LLMRun], opts: CrosscheckOptions) -> SeedData:
    grpo = runs["grpo"]
    counts, pols, pids = step0_counts(runs)
    cal = calibrate(counts, pids, pols, opts.calibration, steps=grpo.steps,
                    batch_prompts=int(grpo.config["prompts_per_step"]), group_size=group_size(grpo))
    fractions = np.array(sorted({s / max(grpo.steps, 1) for run in runs.values() for s in run.eval_steps}))
    llm_acc, llm_n = {}, {}
    for reg, run in runs.items():
        steps, samp, _ = run.accuracy_curve()
        u = steps / max(run.steps, 1)
        llm_acc[reg] = np.stack([np.interp(fractions, u, samp[p]) for p in range(samp.shape[0])])
        last = [r for r in run.rows if r["step"] == steps[-1] and not r["skipped"]]
        llm_n[reg] = np.array([sum(r["samples"] for r in last if r["policy"] == p) for p in pols])
    return SeedData(seed, runs, cal, fractions, llm_acc, llm_n)


def _mean_after0(x: np.ndarray) -> float:
    return float(np.nanmean(x[:, 1:])) if x.shape[1] > 1 else float(np.nanmean(x))


def _rmse(pairs: list[tuple[np.ndarray, np.ndarray]]) -> float:
    sse, n = 0.0, 0
    for pred, target in pairs:
        s, k = curve_sse(pred, target)
        sse, n = sse + s, n + k
    return math.sqrt(sse / n) if n else math.nan


def _curve_numbers(reg: str, data: list[SeedData]) -> dict[str, Any]:
    """Accuracy curves on the first seed's axis, RMSEs, and the ``final`` / ``mean`` outcomes."""
    axis = data[0].fractions
    pols = data[0].cal.scenario.policy_names
    llm_curves, sim_curves, sim_sd, pairs, flat_pairs = [], [], [], [], []
    final_llm, final_sim, mean_llm, mean_sim, se2 = [], [], [], [], []
    for d in data:
        llm = d.llm_acc[reg]
        sim = d.pred.curve(reg, d.fractions)
        pairs.append((sim, llm))
        flat_pairs.append((np.repeat(llm[:, :1], llm.shape[1], axis=1), llm))
        llm_curves.append(np.stack([np.interp(axis, d.fractions, row) for row in llm]))
        sim_curves.append(d.pred.curve(reg, axis))
        sim_sd.append(d.pred.curve_sd(reg, axis))
        final_llm.append(llm[:, -1])
        final_sim.append(sim[:, -1])
        mean_llm.append(_mean_after0(llm))
        mean_sim.append(_mean_after0(sim))
        acc, n = llm[:, -1], d.llm_n[reg]
        se2.append(np.where(n > 0, acc * (1 - acc) / np.maximum(n, 1), np.nan))
    se2_all = np.concatenate(se2)
    return {
        "fractions": axis.tolist(),
        "llm_curve": {p: np.mean(llm_curves, axis=0)[i].tolist() for i, p in enumerate(pols)},
        "llm_curve_per_seed": {p: [c[i].tolist() for c in llm_curves] for i, p in enumerate(pols)},
        "bandit_curve": {p: np.mean(sim_curves, axis=0)[i].tolist() for i, p in enumerate(pols)},
        "bandit_curve_sd": {p: np.mean(sim_sd, axis=0)[i].tolist() for i, p in enumerate(pols)},
        "rmse": _rmse(pairs), "flat_baseline_rmse": _rmse(flat_pairs),
        "llm": {"final": float(np.mean(final_llm)), "mean": float(np.mean(mean_llm)),
                "final_se": float(np.sqrt(np.nansum(se2_all)) / len(se2_all))},
        "bandit": {"final": float(np.mean(final_sim)), "mean": float(np.mean(mean_sim))},
        "final_per_policy": {p: {"llm": float(np.mean([f[i] for f in final_llm])),
                                 "bandit": float(np.mean([f[i] for f in final_sim]))} for i, p in enumerate(pols)},
    }


def _rescue_numbers(reg: str, data: list[SeedData], threshold: float) -> dict[str, Any]:
    """Rescue-set outcomes pooled over policies and seeds: shares (end and curve), precision / recall, AUC."""
    axis = data[0].fractions
    pols = data[0].cal.scenario.policy_names
    obs_l, exp_l = [], []
    curve_obs, curve_exp, curve_n = np.zeros(len(axis)), np.zeros(len(axis)), 0
    per_policy: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {p: [] for p in pols}
    for d in data:
        run, r, rescue = d.runs[reg], d.pred.regimes.index(reg), d.cal.rescue
        obs = run.solved(run.eval_steps[-1], d.cal.prompt_ids)
        q = d.pred.final_solve_prob[r].mean(axis=0)  # [P, C] mean over bandit seeds
        obs_l.append(obs[rescue])
        exp_l.append(q[rescue])
        got = [run.solved(t, d.cal.prompt_ids)[rescue].sum() for t in run.eval_steps]
        curve_obs += np.interp(axis, np.array(run.eval_steps) / max(run.steps, 1), got)
        exp_t = d.pred.solve_prob[r].mean(axis=1)[:, rescue].sum(axis=-1)  # [U]
        curve_exp += np.interp(axis, d.pred.snap_steps / d.pred.snap_steps[-1], exp_t)
        curve_n += int(rescue.sum())
        for i, p in enumerate(pols):
            per_policy[p].append((q[i][rescue[i]] >= threshold, obs[i][rescue[i]]))
    obs_all, exp_all = np.concatenate(obs_l), np.concatenate(exp_l)
    pred_all = exp_all >= threshold
    n = int(obs_all.size)
    return {
        "llm": {"rescue_rate": float(obs_all.mean()) if n else math.nan},
        "bandit": {"rescue_rate": float(exp_all.mean()) if n else math.nan},
        "rescue_curve": {"llm": (curve_obs / max(curve_n, 1)).tolist(), "bandit": (curve_exp / max(curve_n, 1)).tolist()},
        "rescue": {"set_size": n, "observed": int(obs_all.sum()), "predicted": int(pred_all.sum()),
                   "expected": float(exp_all.sum()), **precision_recall(pred_all, obs_all), "auc": auc(exp_all, obs_all),
                   "per_policy": {p: precision_recall(np.concatenate([a for a, _ in v]), np.concatenate([b for _, b in v]))
                                  for p, v in per_policy.items()}},
    }


def _regime_numbers(reg: str, data: list[SeedData], threshold: float) -> dict[str, Any]:
    out = _curve_numbers(reg, data)
    resc = _rescue_numbers(reg, data, threshold)
    out["llm"].update(resc.pop("llm"))
    out["bandit"].update(resc.pop("bandit"))
    return {**out, **resc}


def run_crosscheck(llm_root: str | Path, out_dir: str | Path, opts: CrosscheckOptions | None = None,
                   progress=print) -> dict[str, Any]:
    """The whole cross-check (module docstring); writes one scenario ``.npz`` per LLM seed under ``out_dir``."""
    opts = opts or CrosscheckOptions()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    found, unfinished = discover(llm_root)
    regimes = regime_order(set.intersection(*(set(r) for r in found.values())))
    dropped = sorted(set.union(*(set(r) for r in found.values())) - set(regimes))
    data = [_seed_data(seed, runs, opts) for seed, runs in found.items()]
    for d in data:
        save_scenario(out / f"scenario_seed{d.seed}.npz", d.cal.scenario)
    progress(f"crosscheck: {len(data)} LLM seed(s) {list(found)}, regimes {regimes}; fitting on grpo "
             f"({len(opts.sim.grid())} settings)")
    cases = [FitCase(d.cal.scenario, d.runs["grpo"].config, group_size(d.runs["grpo"]), d.runs["grpo"].eval_k(),
                     d.fractions, d.llm_acc["grpo"]) for d in data]
    fit = fit_grid(cases, opts.sim)
    best = FreeSettings(fit["best"]["optimizer"], fit["best"]["lr"], fit["best"]["epochs"])
    progress(f"crosscheck: best {best.optimizer} lr {best.lr}, epochs {best.epochs} (rmse {fit['best']['rmse']:.4f}); "
             "predicting every regime")
    for d in data:
        g = d.runs["grpo"]
        cfg = bandit_config(g.config, tuple(regimes), d.cal.scenario.n_contexts, best, opts.sim, group_size(g))
        d.pred = simulate(d.cal.scenario, cfg, g.eval_k(), snap_steps=np.round(d.fractions * g.steps).astype(int))
    sgt_regs = tuple(r for r in regimes if parse_regime(r).sgt_enabled)
    scan = _sgt_scan(cases, data, sgt_regs, best, opts) if sgt_regs and opts.sgt_factors else []
    per_regime = {reg: _regime_numbers(reg, data, opts.threshold) for reg in regimes}
    ordering = {k: rank_agreement([per_regime[r]["bandit"][k] for r in regimes],
                                  [per_regime[r]["llm"][k] for r in regimes]) for k in OUTCOMES}
    first = data[0]
    return {
        "llm_runs": {"root": str(llm_root), "seeds": list(found), "regimes": regimes, "dropped_regimes": dropped,
                     "unfinished_runs": [str(u) for u in unfinished],
                     "policies": list(first.cal.scenario.policy_names), "prompts": len(first.cal.prompt_ids),
                     "steps": first.runs["grpo"].steps, "prompts_per_step": first.runs["grpo"].config["prompts_per_step"],
                     "group_size": group_size(first.runs["grpo"]), "eval_k": first.runs["grpo"].eval_k(),
                     "eval_on_training_prompts": all((d.runs["grpo"].config.get("eval") or {}).get("data") is None
                                                     for d in data)},
        "options": {"arms": opts.calibration.arms, "alpha": opts.calibration.alpha, "bandit_seeds": opts.sim.seeds,
                    "thl_sigma": opts.sim.thl_sigma, "threshold": opts.threshold, "sgd_lrs": list(opts.sim.sgd_lrs),
                    "adam_lrs": list(opts.sim.adam_lrs), "epochs": list(opts.sim.epochs),
                    "sgt_factors": list(opts.sgt_factors)},
        "calibration": {str(d.seed): _calibration_numbers(d) for d in data},
        "fit": fit,
        "regimes": per_regime,
        "ordering": ordering,
        "sgt_weight_scan": scan,
    }


def _sgt_scan(cases: list[FitCase], data: list[SeedData], regs: tuple[str, ...], best: FreeSettings,
              opts: CrosscheckOptions) -> list[dict[str, Any]]:
    """:func:`~experiments.crosscheck.simulate.sgt_weight_scan` per LLM seed, mean over the seeds."""
    rows = [row for case, d in zip(cases, data, strict=True)
            for row in sgt_weight_scan(case, regs, best, opts.sim, opts.sgt_factors, d.cal.rescue)]
    out = []
    for f in opts.sgt_factors:
        for reg in regs:
            sel = [r for r in rows if r["factor"] == f and r["regime"] == reg]
            out.append({"factor": f, "regime": reg, "sgt_weight": float(np.mean([r["sgt_weight"] for r in sel])),
                        "final": float(np.mean([r["final"] for r in sel])),
                        "rescue_rate": float(np.nanmean([r["rescue_rate"] for r in sel]))})
    return out


def _calibration_numbers(d: SeedData) -> dict[str, Any]:
    c = d.cal
    return {"p_never": c.p_never, "arms": c.scenario.n_arms, "prompts": len(c.prompt_ids),
            "policies": {p: {"bandit_step0_accuracy": float(c.p[i].mean()),
                             "llm_step0_sample_accuracy": float(c.counts.s[i].sum() / c.counts.n[i].sum()),
                             "samples_per_prompt": float(c.counts.n[i].mean()),
                             "never_solved": int((~c.counts.solved[i]).sum()), "rescue_set": int(c.rescue[i].sum())}
                         for i, p in enumerate(c.scenario.policy_names)}}
