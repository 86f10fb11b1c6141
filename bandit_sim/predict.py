"""``python -m bandit_sim predict --success-matrix FILE [--probe-run FILE]``: which regime to use for a pair
(or more) of LLM policies, predicted by the simulator from their measured start.

1. **Calibrate** (:mod:`bandit_sim.calibrate`): the matrix's step-0 counts -> a scenario (one context per
   prompt, ``arms`` arms, policy ``i``'s success probability on ``x`` its measured rate, never-solved
   prompts at the floor ``alpha / D``) and the rescue sets (prompts a policy never solved while a peer did).
2. **Free settings** (:mod:`bandit_sim.fit`): with ``--probe-run`` — the success matrix of a short GRPO run
   of the same policies, with its learning curve — the optimizer, learning rate and epochs are fitted on
   that curve as the cross-check does; without it the run preset's (``--preset``, default ``paper``), and
   the output says so.
3. **Simulate** every regime (``--regimes``, default the five standard ones) over ``--seeds`` bandit seeds
   with the matrix's run settings (steps, prompts per step, G, the regime and loss sections; flags override).
   Its size is estimated first (:func:`work_estimate`, with the probe's fit) and refused past ``--max-work``.
4. **Report**: per regime the final accuracy (sample accuracy at the end, mean over policies) and the
   rescue rate (mean P(solved) over the rescue-set entries, the LLM's evaluation protocol with ``eval_k``
   samples), each as a mean over bandit seeds with a 95 % t-interval; the two orderings; the rescue-set
   sizes; and the regime to use: the best on ``--objective`` (``final`` or ``rescue``), with the regimes
   whose interval overlaps the best's named as ties. When the matrix holds observed ``outcomes``, their
   ordering is printed beside, with the Spearman correlation.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from bandit_sim.calibrate import CalibrationConfig, Counts, calibrate
from bandit_sim.fit import FitCase, FreeSettings, SimOptions, bandit_config, eval_gcd, fit_grid, simulate
from bandit_sim.metrics import seed_summary
from bandit_sim.presets import get_preset
from bandit_sim.stats import spearman
from shared_interfaces.config_io import INT_MAX, ConfigError
from shared_interfaces.dynamics import Dynamics
from shared_interfaces.regimes import STANDARD_REGIMES, parse_regime
from shared_interfaces.success_matrix import SuccessMatrix, SuccessMatrixError

#: the most simulated draws (:func:`work_estimate`) a prediction may take unless raised (``--max-work``); the demo's
#: matrix with the defaults takes about 1.2e7
DEFAULT_MAX_WORK = 10**9


@dataclass(frozen=True)
class PredictOptions:
    regimes: tuple[str, ...] = STANDARD_REGIMES
    seeds: int = 32
    preset: str = "paper"
    objective: str = "final"
    #: ``tabular`` (calibrated per-prompt logits, fitted on a probe's curve) or ``kernel`` (the measured transfer
    #: kernel, fitted on a GRPO run's per-prompt dynamics: :mod:`bandit_sim.kernel_fit`)
    model: str = "tabular"
    arms: int = 16
    alpha: float = 0.01
    thl_sigma: float = 0.0
    steps: int | None = None
    prompts_per_step: int | None = None
    group_size: int | None = None
    eval_k: int | None = None
    max_work: int = DEFAULT_MAX_WORK

    def __post_init__(self) -> None:
        if self.objective not in ("final", "heldout", "rescue"):
            raise ConfigError(f"--objective must be final, heldout or rescue, got {self.objective!r}")
        if self.model not in ("tabular", "kernel"):
            raise ConfigError(f"--model must be tabular or kernel, got {self.model!r}")
        if self.seeds < 2:
            raise ConfigError(f"--seeds must be >= 2 (the interval needs two), got {self.seeds}")
        if not self.regimes:
            raise ConfigError("--regimes: give at least one regime")
        for r in self.regimes:
            parse_regime(r)
        for key in ("steps", "prompts_per_step", "group_size", "eval_k", "seeds", "max_work"):
            v = getattr(self, key)
            if v is not None and v < 1:
                raise ConfigError(f"--{key.replace('_', '-')} must be >= 1, got {v}")
            if v is not None and v > INT_MAX:
                raise ConfigError(f"--{key.replace('_', '-')} {v} does not fit a signed 64-bit integer (< 2**63)")


def run_settings(m: SuccessMatrix, opts: PredictOptions, *, where: str) -> dict[str, Any]:
    """The matrix's ``run`` section with the flags over it; a missing setting is an error naming its flag."""
    run = dict(m.run or {"regime": {"name": "grpo"}, "loss": {}})
    for key in ("steps", "prompts_per_step", "group_size", "eval_k"):
        if getattr(opts, key) is not None:
            run[key] = getattr(opts, key)
    missing = [k for k in ("steps", "prompts_per_step", "group_size") if not run.get(k)]
    if missing:
        flags = ", ".join("--" + k.replace("_", "-") for k in missing)
        raise SuccessMatrixError(f"{where} has no run settings {missing}; give {flags}")
    if not run.get("eval_k"):
        run["eval_k"] = int(np.median(m.samples))
    return run


def work_estimate(policies: int, prompts: int, run: dict[str, Any], regimes: int, seeds: int, arms: int,
                  free: FreeSettings) -> int:
    """How many arm probabilities a simulation touches, ``R S P (steps epochs B (K + G) + [adam] steps epochs C K
    + C K)``: each step and epoch draws ``G`` of ``K`` arms for ``B = min(prompts_per_step, C)`` prompts per
    (regime, seed, policy); Adam steps the whole ``[C, K]`` table (SGD only the batch's rows); the end's
    evaluation reads the table once. Python integers: exact however large the settings."""
    steps, g = int(run["steps"]), int(run["group_size"])
    b = min(int(run["prompts_per_step"]), prompts)
    table = prompts * arms
    per_step = b * (arms + g) + (table if free.optimizer == "adam" else 0)
    return regimes * seeds * policies * (steps * free.epochs * per_step + table)


#: about how many GRPO-only simulations (at 8 seeds) the kernel model's fit runs (:func:`bandit_sim.kernel_fit.fit_kernel`)
KERNEL_FIT_RUNS = 70


def check_work(m: SuccessMatrix, run: dict[str, Any], n_regimes: int, free: FreeSettings, opts: PredictOptions,
               probe_run: dict[str, Any] | None = None, fit_runs: int = 0) -> int:
    """The prediction's :func:`work_estimate` (plus the probe fit's over its grid of settings); past
    ``opts.max_work`` a :class:`ConfigError` giving the number, the settings behind it and the flag to raise it."""
    P, C = len(m.policies), len(m.prompts)
    work = work_estimate(P, C, run, n_regimes, opts.seeds, opts.arms, free)
    if probe_run is not None:
        work += sum(work_estimate(P, C, probe_run, 1, opts.seeds, opts.arms, f) for f in SimOptions().grid())
    work += fit_runs * work_estimate(P, C, run, 1, 8, opts.arms, free)
    if work > opts.max_work:
        raise ConfigError(
            f"predict would simulate about {work} arm draws ({n_regimes} regimes x {opts.seeds} seeds x {P} policies x "
            f"{run['steps']} steps x {min(int(run['prompts_per_step']), C)} prompts per step x G {run['group_size']}, "
            f"on a table of {C} prompts x {opts.arms} arms{', plus the probe fit' if probe_run is not None else ''}), "
            f"more than --max-work {opts.max_work}; lower --steps, --seeds or --regimes, or pass --max-work {work} to "
            "run it")
    return work


def _counts(m: SuccessMatrix) -> Counts:
    return Counts(m.samples, m.successes, m.greedy_known)


def free_settings(m: SuccessMatrix, run: dict[str, Any], scenario, probe: SuccessMatrix | None,
                  opts: PredictOptions) -> tuple[FreeSettings, dict[str, Any]]:
    """The probe's fitted settings, or the preset's (module docstring); with how they were chosen."""
    if probe is None:
        cfg = get_preset(opts.preset)
        free = FreeSettings(cfg.optimizer, cfg.lr, cfg.epochs)
        return free, {"source": f"preset {opts.preset} (no --probe-run: not fitted)"}
    if probe.policies != m.policies:
        raise SuccessMatrixError(f"--probe-run is a run of policies {list(probe.policies)}, the success matrix of "
                                 f"{list(m.policies)}; the probe must train the same policies")
    if probe.curve_steps is None or len(probe.curve_steps) < 2:
        raise SuccessMatrixError("--probe-run has no learning curve (curve with evaluations after step 0); write it "
                                 "from a GRPO run with eval.every > 0")
    prun = probe_settings(probe)
    if parse_regime(prun["regime"]["name"]).name != "grpo":
        raise SuccessMatrixError(f"--probe-run is a {prun['regime']['name']} run; the fit needs a GRPO probe")
    if probe.curve_steps[-1] > prun["steps"]:
        raise SuccessMatrixError(f"--probe-run's curve reaches step {int(probe.curve_steps[-1])}, past its run's "
                                 f"{prun['steps']} steps; the file is inconsistent: write it again from the run")
    if not np.isfinite(probe.curve_accuracy[:, 1:]).any():
        raise SuccessMatrixError("--probe-run's curve has no accuracy after step 0 (all null); write it from a GRPO "
                                 "run whose evaluations ran (eval.every > 0)")
    fractions = probe.curve_steps / prun["steps"]
    case = FitCase(scenario, prun, int(prun["group_size"]), int(prun["eval_k"]), fractions, probe.curve_accuracy)
    fit = fit_grid([case], SimOptions(seeds=opts.seeds, thl_sigma=opts.thl_sigma))
    b = fit["best"]
    return FreeSettings(b["optimizer"], b["lr"], b["epochs"]), {
        "source": "fitted on the probe's GRPO curve", "rmse": b["rmse"], "flat_baseline_rmse": fit["flat_baseline_rmse"]}


def probe_settings(probe: SuccessMatrix) -> dict[str, Any]:
    return run_settings(probe, PredictOptions(), where="--probe-run")


def _interval(x: np.ndarray) -> dict[str, float | None]:
    s = seed_summary(x, axis=0)
    mean, ci = float(s["mean"]), float(s["ci95"])
    return {"mean": None if math.isnan(mean) else mean, "ci95": None if math.isnan(ci) else ci}


def predict(m: SuccessMatrix, probe: SuccessMatrix | None = None, opts: PredictOptions | None = None,
            dynamics: Dynamics | None = None) -> dict[str, Any]:
    """The prediction (module docstring) as a JSON-able dict; ``--model kernel``: :func:`predict_with_kernel` on the
    GRPO run's ``dynamics``."""
    opts = opts or PredictOptions()
    if opts.model == "kernel":
        check_work(m, run_settings(m, opts, where="the success matrix"), len(opts.regimes),
                   FreeSettings("adam", 1.0, 1), opts, None, fit_runs=KERNEL_FIT_RUNS)
        return predict_with_kernel(m, dynamics, opts)
    if dynamics is not None:
        raise ConfigError("--dynamics is the kernel model's fit input; pass --model kernel, or leave --dynamics out")
    run = run_settings(m, opts, where="the success matrix")
    regimes = tuple(parse_regime(r).name for r in opts.regimes)
    cal_cfg = CalibrationConfig(arms=opts.arms, alpha=opts.alpha)  # (its checks first: the arms bound the work)
    preset = get_preset(opts.preset)
    if probe is None:
        check_work(m, run, len(regimes), FreeSettings(preset.optimizer, preset.lr, preset.epochs), opts)
    else:  # the fitted settings are not known yet: the largest the grid holds
        widest = max(SimOptions().grid(), key=lambda f: (f.optimizer == "adam", f.epochs))
        check_work(m, run, len(regimes), widest, opts, probe_settings(probe))
    cal = calibrate(_counts(m), m.prompts, m.policies, cal_cfg,
                    steps=int(run["steps"]), batch_prompts=int(run["prompts_per_step"]),
                    group_size=int(run["group_size"]))
    scenario, rescue_set = cal.scenario, cal.rescue
    train = None if m.split is None else np.array([x == "train" for x in m.split])
    if train is not None:  # held-out prompts are evaluated, never drawn (the tabular model never moves them)
        scenario, rescue_set = replace(scenario, train=train), cal.rescue & train
    free, how = free_settings(m, run, scenario, probe, opts)
    sim = SimOptions(seeds=opts.seeds, thl_sigma=opts.thl_sigma)
    cfg = bandit_config(run, regimes, int(scenario.train_index.size), free, sim, int(run["group_size"]),
                        eval_gcd(np.array([1.0]), int(run["steps"])))
    pred = simulate(scenario, cfg, int(run["eval_k"]))
    own = _own_family_heldout(m, train)
    per = {}
    for r, name in enumerate(pred.regimes):
        qc = pred.correct_prob[r, -1]  # [S, P, C]
        final = pred.accuracy[r, -1].mean(axis=-1) if train is None else qc[:, :, train].mean(axis=(1, 2))  # [S]
        q = pred.final_solve_prob[r]  # [S, P, C]
        rescue = q[:, rescue_set].mean(axis=-1) if rescue_set.any() else np.full(q.shape[0], np.nan)
        held = ((qc * own).sum(-1) / np.maximum(own.sum(-1), 1)).mean(-1) if own.any() else np.full(q.shape[0], np.nan)
        per[name] = {"final": _interval(final), "heldout": _interval(held), "rescue_rate": _interval(rescue)}
    key = {"final": "final", "heldout": "heldout", "rescue": "rescue_rate"}[opts.objective]
    ordering = {k: sorted(per, key=lambda n, k=k: -(per[n][k]["mean"] if per[n][k]["mean"] is not None else -1))
                for k in ("final", "heldout", "rescue_rate")}
    best = ordering[key][0]
    lo = per[best][key]["mean"] - (per[best][key]["ci95"] or 0.0) if per[best][key]["mean"] is not None else None
    ties = [n for n in ordering[key][1:] if lo is not None and per[n][key]["mean"] is not None
            and per[n][key]["mean"] + (per[n][key]["ci95"] or 0.0) >= lo]
    out = {
        "policies": list(m.policies), "prompts": len(m.prompts),
        "rescue_set_sizes": {p: int(rescue_set[i].sum()) for i, p in enumerate(m.policies)},
        "run": _run_used(run, cfg),
        "free_settings": {"optimizer": free.optimizer, "lr": free.lr, "epochs": free.epochs, **how},
        "seeds": opts.seeds, "regimes": per, "ordering": ordering, "objective": opts.objective,
        "use": best, "ties_with_use": ties, "clear_winner": not ties, "model": "tabular",
        "ci95": "over the bandit seeds of one calibrated scenario (the simulator's own noise)",
    }
    if m.outcomes:
        out["observed"] = observed_agreement(per, m.outcomes)
    return out


def _own_family_heldout(m: SuccessMatrix, train: np.ndarray | None) -> np.ndarray:
    """``[P, C]``: the held-out prompts of each policy's own family (the family of its highest step-0 sampled
    accuracy over the training prompts; every held-out prompt without families); empty without a split."""
    P, C = m.samples.shape
    if train is None:
        return np.zeros((P, C), dtype=bool)
    held = ~train
    if m.families is None:
        return np.broadcast_to(held, (P, C)).copy()
    fam = np.array(m.families)
    rate = m.successes / np.maximum(m.samples, 1)
    out = np.zeros((P, C), dtype=bool)
    names = sorted(set(m.families))
    for i in range(P):
        acc = [rate[i, train & (fam == f)].mean() if (train & (fam == f)).any() else -1.0 for f in names]
        out[i] = held & (fam == names[int(np.argmax(acc))])
    return out


def predict_with_kernel(m: SuccessMatrix, dyn: Dynamics | None, opts: PredictOptions) -> dict[str, Any]:
    """``--model kernel`` (:mod:`bandit_sim.kernel_fit`): fitted on the pair's GRPO run ``dyn``, every regime
    predicted with a one-run interval; the matrix must carry the policies' kernels."""
    from bandit_sim.kernel_fit import curves_from_dynamics, predict_kernel

    if m.kernel is None:
        raise SuccessMatrixError("--model kernel needs the policies' transfer kernels in the success matrix; measure "
                                 "them with `python -m mrl_llm kernel --run RUN_DIR` on the run the matrix came from")
    missing = [p for i, p in enumerate(m.policies) if np.isnan(m.kernel[i]).any()]
    if missing:
        raise SuccessMatrixError(f"the success matrix has no kernel for policies {missing}; measure them with "
                                 "`python -m mrl_llm kernel --run RUN_DIR`")
    if dyn is None:
        raise SuccessMatrixError("--model kernel is fitted on the pair's GRPO run: pass --dynamics RUN_DIR/dynamics.json "
                                 "of that run (`python -m mrl_llm dynamics --run RUN_DIR` writes it)")
    other = [d for d in dyn.mismatch(m.run) if d.split(":")[0] in ("seed", "prompts_per_step", "group_size", "eval_k")]
    if other:
        raise SuccessMatrixError(f"--dynamics is of another run than the success matrix ({'; '.join(other)}); give the "
                                 "dynamics of the GRPO run of the same seed and settings")
    curves = curves_from_dynamics(dyn, m.prompts, m.policies)
    if m.split is not None and [x == "train" for x in m.split] != curves.train.tolist():
        raise SuccessMatrixError("--dynamics splits the prompts into train / held-out differently from the success "
                                 "matrix; give the dynamics of the run the matrix came from")
    run = {**run_settings(m, opts, where="the success matrix"), **{k: dyn.run[k] for k in ("steps", "eval_k")
                                                                    if opts.__dict__.get(k) is None and k in dyn.run}}
    run["regime"] = {**(m.run or {}).get("regime", {}), "name": dyn.run["regime"]["name"]}
    regimes = tuple(parse_regime(r).name for r in opts.regimes)
    meta = m.kernel_meta or {}
    lp = np.array([(e or {}).get("logprob") or [np.nan] * len(m.prompts) for e in meta.get("policies", [])],
                  dtype=float) if meta.get("policies") else None
    res = predict_kernel(_counts(m), m.kernel, curves, m.policies, run, regimes, objective=opts.objective,
                         seeds=opts.seeds, arms=opts.arms, thl_sigma=opts.thl_sigma, start_logprob=lp)
    ks = res["settings"]
    per = {n: {k: {"mean": v["mean"], "ci95": v["ci95"]} for k, v in d.items()} for n, d in res["summary"].items()}
    ordering = {k: sorted(per, key=lambda n, k=k: -(per[n][k]["mean"] if per[n][k]["mean"] is not None else -1))
                for k in ("final", "heldout", "rescue_rate")}
    out = {
        "policies": list(m.policies), "prompts": len(m.prompts), "model": "kernel",
        "rescue_set_sizes": {p: int(curves.rescue_set()[i].sum()) for i, p in enumerate(m.policies)},
        "run": {k: run[k] for k in ("steps", "prompts_per_step", "group_size", "eval_k")},
        "free_settings": {"optimizer": ks.optimizer, "lr": ks.lr, "temperature_lr": ks.temperature_lr,
                          "drift": ks.drift, "floor": ks.floor, "log_likelihood": res["fit"]["log_likelihood"],
                          "evaluations": res["fit"]["evaluations"], "seconds": res["seconds"],
                          "source": "fitted on the GRPO run's per-prompt dynamics (binomial likelihood)",
                          "dispersion": res["fit"]["dispersion"],
                          "profile": [{"lr": k.lr, "temperature_lr": k.temperature_lr, "drift": k.drift,
                                       "floor": k.floor, "log_likelihood": ll} for k, ll in res["fit"]["profile"]],
                          "weights": [{"lr": k.lr, "weight": w} for k, w in res["points"]]},
        "seeds": opts.seeds, "regimes": per, "ordering": ordering, "objective": opts.objective,
        "use": res["use"], "ties_with_use": res["ties_with_use"], "clear_winner": res["clear_winner"],
        "by_objective": res["by_objective"],
        "ci95": "one LLM run: the bandit seeds' spread + the evaluation's binomial noise + a bootstrap over prompts, "
                "mixed over the learning rates the GRPO run cannot tell apart (free_settings.weights)",
    }
    if m.outcomes:
        out["observed"] = observed_agreement(per, m.outcomes)
    return out


def _run_used(run: dict[str, Any], cfg) -> dict[str, Any]:
    """The run settings the simulation used: a step draws at most every prompt of the matrix (a context each),
    so a larger ``prompts_per_step`` is capped, and the value given is kept beside as ``prompts_per_step_given``."""
    used = {k: run[k] for k in ("steps", "prompts_per_step", "group_size", "eval_k")}
    if cfg.batch_prompts != int(run["prompts_per_step"]):
        used["prompts_per_step"], used["prompts_per_step_given"] = cfg.batch_prompts, int(run["prompts_per_step"])
    return used


def observed_agreement(per: dict[str, dict], outcomes: dict[str, dict]) -> dict[str, Any]:
    """The observed outcomes' orderings over the regimes both sides have, and Spearman against the prediction."""
    obs = {parse_regime(o).name: v for o, v in outcomes.items()}  # one name per regime (validate_outcomes)
    common = [r for r in per if r in obs]
    res: dict[str, Any] = {"regimes": common}
    for key, okey in (("final", "final_accuracy"), ("rescue_rate", "rescue_rate")):
        pairs = [(per[r][key]["mean"], obs[r].get(okey)) for r in common]  # an outcome may leave rescue_rate out
        if okey == "final_accuracy":
            pairs = [(p, float(np.mean(o))) for p, o in pairs]
        ok = [(p, o) for p, o in pairs if p is not None and o is not None]
        rho = spearman([p for p, _ in ok], [o for _, o in ok]) if len(ok) >= 3 else math.nan
        res[key] = {"observed": {r: o for r, (_, o) in zip(common, pairs, strict=True)},
                    "observed_ordering": sorted([r for r, (_, o) in zip(common, pairs, strict=True) if o is not None],
                                                key=lambda r: -dict(zip(common, pairs, strict=True))[r][1]),
                    "spearman": None if math.isnan(rho) else rho}
    return res


def format_prediction(res: dict[str, Any]) -> str:
    f = res["free_settings"]
    if res.get("model") == "kernel":
        how = (f"kernel model: {f['optimizer']} lr {f['lr']:g}, temperature rate {f['temperature_lr']:g}, drift "
               f"{f['drift']:g}, floor {f['floor']:g} — {f['source']} (log-likelihood {f['log_likelihood']:.1f}, "
               f"{f['evaluations']} simulations, {f['seconds']['fit']:.0f} s)")
        if len(f.get("weights", [])) > 1:
            how += ("\nthe GRPO run cannot tell these learning rates apart (dispersion "
                    f"{f['dispersion']:.2f}); predictions mixed with weights "
                    + ", ".join(f"lr {w['lr']:g}: {w['weight']:.2f}" for w in f["weights"]))
    else:
        how = f"learning rate: {f['optimizer']} lr {f['lr']:g}, {f['epochs']} epoch(s) — {f['source']}"
    keys = [k for k in ("final", "heldout", "heldout_change", "rescue_rate")
            if any(k in v and v[k]["mean"] is not None for v in res["regimes"].values())]
    lines = [f"policies {res['policies']}, {res['prompts']} prompts; rescue-set sizes {res['rescue_set_sizes']}",
             f"run: {res['run']}; {res['seeds']} bandit seeds",
             *([f"prompts_per_step {res['run']['prompts_per_step_given']} is capped at the matrix's "
                f"{res['prompts']} prompts (a step draws each prompt at most once)"]
               if "prompts_per_step_given" in res["run"] else []),
             how, f"± : 95 % interval, {res.get('ci95', 'over the bandit seeds')}",
             f"{'regime':>14}  " + "  ".join(f"{k.replace('_', ' '):>18}" for k in keys)]
    for name, v in res["regimes"].items():
        cells = []
        for k in keys:
            m, c = v.get(k, {}).get("mean"), v.get(k, {}).get("ci95")
            cells.append(("n/a (no rescue set)" if k == "rescue_rate" else "n/a") if m is None
                         else f"{m:.4f} ± {c or 0.0:.4f}")
        lines.append(f"{name:>14}  " + "  ".join(f"{c:>18}" for c in cells))
    for k in ("final", "heldout", "rescue_rate"):
        if k in res["ordering"]:
            lines.append(f"predicted ordering by {k.replace('_', ' ')}: {' > '.join(res['ordering'][k])}")
    if "observed" in res:
        for k in ("final", "rescue_rate"):
            o = res["observed"][k]
            if not o["observed_ordering"]:
                lines.append(f"observed {k}: not recorded in the matrix's outcomes")
                continue
            rho = "n/a" if o["spearman"] is None else f"{o['spearman']:.2f}"
            lines.append(f"observed ordering by {k}: {' > '.join(o['observed_ordering'])} (Spearman vs predicted {rho})")
    if res["ties_with_use"]:
        lines.append(f"no clear winner on {res['objective']}: {res['use']} is best predicted, but "
                     f"{', '.join(res['ties_with_use'])} within its interval")
    lines.append(f"use: {res['use']} — best predicted {res['objective']}"
                 + ("" if not res["ties_with_use"] else " (no clear winner)"))
    return "\n".join(lines)


def write_prediction(res: dict[str, Any], path: str | Path) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(res, indent=1, allow_nan=False) + "\n")
    return p
