"""The kernel model fitted on one GRPO run, and its prediction of every regime (``predict --model kernel``).

**Observed** (:class:`Curves`, from a run's per-prompt dynamics, :mod:`shared_interfaces.dynamics`): per policy,
evaluation step and prompt, successes / samples; which prompts were trained on (``train``) and which only
evaluated (held-out); the per-step sampling entropy.

**Scenario** (:func:`kernel_scenario`): the success matrix's step-0 counts calibrated as :mod:`bandit_sim.calibrate`
does, with the never-solved floor ``floor`` (a free setting here), the matrix's measured kernel and its split.

**Free settings** (:class:`KernelSettings`): the learning rate in function space ``lr``, the inverse temperature's
rate ``temperature_lr``, the ``drift`` and the ``floor``. λ, the peer weight, the ratio cap, the clip range, steps,
prompts per step and G are the LLM run's (:func:`bandit_sim.fit.bandit_config`).

**Fit** (:func:`fit_kernel`), on the GRPO run only: maximise the binomial log-likelihood of every evaluated
(policy, step > 0, prompt) count under the bandit's mean correct-answer probability over its seeds, plus
:data:`ENTROPY_WEIGHT` x a Gaussian log-likelihood of the entropy's change (the LLM's per-token sampling entropy
relative to its first steps, against the bandit's mean arm entropy over the training contexts relative to step
0; s.d. the LLM entropy's own step-to-step noise over a window; weight 0 by default, see there). A coarse joint
grid, then coordinate steps over log-spaced grids, twice round.

**Prediction** (:func:`predict_kernel`): every regime with the fitted settings over ``seeds`` bandit seeds, and per
regime ``final`` (sampled accuracy on the training prompts at the end, mean over policies), ``heldout`` (sampled
accuracy on the held-out prompts of each policy's own family — the family of its highest step-0 accuracy —
at the end, mean over policies; the change from the start beside it) and ``rescue_rate`` (P(solved) under the
LLM's protocol over the rescue set: training prompts a policy never solved at step 0 while a peer did, pooled).
Each with a 95 % interval for **one LLM run**: ``1.96 * sqrt(var_seeds + var_eval + var_prompts)`` — the bandit
seeds' spread (the RL run's own noise), the evaluation's binomial noise with ``k`` samples, and a bootstrap
over prompts (another pool of the same size: the LLM seeds draw their pools). Which regime is best
(:func:`paired_ties`) is decided on the expected difference, paired over the bandit seeds (common random numbers)
with a bootstrap over prompts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from bandit_sim.calibrate import (
    CORRECT_ARM,
    Counts,
    rescue_set,
    scenario_from_probabilities,
    success_probabilities,
)
from bandit_sim.config import SimConfig
from bandit_sim.engine import Engine
from bandit_sim.fit import FreeSettings, SimOptions, bandit_config
from bandit_sim.scenario import Scenario
from shared_interfaces.config_io import ConfigError
from shared_interfaces.dynamics import Dynamics

Z95 = 1.959964


@dataclass(frozen=True)
class Curves:
    """One run's observed per-prompt dynamics: ``successes``, ``samples`` ``[P, T, C]`` at ``steps [T]`` (0 first;
    samples 0 where not evaluated), ``greedy`` ``[P, T, C]`` float (1 / 0, NaN unknown), ``train [C]`` bool,
    ``families`` ``[C]`` or None, ``entropy [P, U]`` at train steps ``entropy_steps [U]`` (NaN where missing),
    the run's ``run_steps``."""

    steps: np.ndarray
    successes: np.ndarray
    samples: np.ndarray
    greedy: np.ndarray
    train: np.ndarray
    families: tuple[str, ...] | None
    entropy_steps: np.ndarray
    entropy: np.ndarray
    run_steps: int

    def __post_init__(self) -> None:
        P, T, C = np.shape(self.samples)
        if np.shape(self.successes) != (P, T, C) or np.shape(self.train) != (C,) or len(self.steps) != T:
            raise ConfigError(f"dynamics: successes / samples [P, T, C], steps [T] and train [C] disagree: "
                              f"{np.shape(self.successes)}, {np.shape(self.samples)}, {len(self.steps)}, "
                              f"{np.shape(self.train)}")
        if T < 2 or self.steps[0] != 0:
            raise ConfigError("dynamics: the fit needs the step-0 evaluation and at least one after it; write the "
                              "dynamics of a run with eval.every > 0")

    def rate(self, t: int) -> np.ndarray:
        """``[P, C]`` successes / samples at evaluation ``t`` (NaN where not evaluated)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.samples[:, t] > 0, self.successes[:, t] / np.maximum(self.samples[:, t], 1), np.nan)

    def solved(self, t: int) -> np.ndarray:
        """``[P, C]``: a success among the samples or a correct greedy answer at evaluation ``t``."""
        return (self.successes[:, t] > 0) | (np.nan_to_num(self.greedy[:, t]) > 0)

    def own_family(self) -> np.ndarray:
        """``[P, C]`` bool: the held-out prompts of each policy's own family (its highest step-0 sampled accuracy
        over the training prompts); every held-out prompt when the prompts have no families."""
        held = ~self.train
        if self.families is None:
            return np.broadcast_to(held, self.samples[:, 0].shape).copy()
        fam = np.array(self.families)
        names = sorted(set(self.families))
        out = np.zeros(self.samples[:, 0].shape, dtype=bool)
        r0 = self.rate(0)
        for p in range(out.shape[0]):
            accs = [np.nanmean(np.where(self.train & (fam == f), r0[p], np.nan)) if (self.train & (fam == f)).any()
                    else -1.0 for f in names]
            out[p] = held & (fam == names[int(np.nanargmax(accs))])
        return out

    def observed(self, t: int = -1) -> dict[str, float]:
        """The run's ``final``, ``heldout`` (and its ``heldout_change`` from step 0) and ``rescue_rate`` at
        evaluation ``t`` (the prediction's definitions, module docstring)."""
        own = self.own_family()
        ok = self.samples[:, t] > 0
        tr = self.train & ok
        final = float(np.mean([self.successes[p, t, tr[p]].sum() / self.samples[p, t, tr[p]].sum()
                               for p in range(len(tr))]))
        held = [self.successes[p, t, own[p] & ok[p]].sum() / max(self.samples[p, t, own[p] & ok[p]].sum(), 1)
                for p in range(len(tr))]
        held0 = [self.successes[p, 0, own[p]].sum() / max(self.samples[p, 0, own[p]].sum(), 1)
                 for p in range(len(tr))]
        rescue = self.rescue_set()
        res = float(self.solved(t)[rescue].mean()) if rescue.any() else math.nan
        return {"final": final, "heldout": float(np.mean(held)), "heldout_change": float(np.mean(held) - np.mean(held0)),
                "rescue_rate": res}

    def rescue_set(self) -> np.ndarray:
        """``[P, C]``: training prompts the policy never solved at step 0 while a peer did."""
        g0 = np.nan_to_num(self.greedy[:, 0]) > 0
        return rescue_set(Counts(np.maximum(self.samples[:, 0], 1), self.successes[:, 0], g0)) & self.train

    def entropy_ratio(self) -> tuple[np.ndarray, np.ndarray]:
        """Per evaluation step after 0: the mean over policies of ``log(H_t / H_0)`` and its standard error, where
        ``H_t`` is the mean sampling entropy over the train steps in the half interval before evaluation ``t`` and
        ``H_0`` over as many steps from step 0. NaN where the run recorded no entropy there."""
        out, se = np.full(len(self.steps) - 1, np.nan), np.full(len(self.steps) - 1, np.nan)
        if self.entropy.size == 0:
            return out, se
        logh = np.log(np.clip(self.entropy, 1e-12, None))  # [P, U]
        half = max(2, int(self.steps[1] - self.steps[0]) // 2)
        first = self.entropy_steps < half
        if first.sum() < 2:
            return out, se
        base = np.nanmean(logh[:, first], axis=1)  # [P]
        for i in range(1, len(self.steps)):
            w = (self.entropy_steps >= self.steps[i] - max(2, int(self.steps[i] - self.steps[i - 1]) // 2)) & (
                self.entropy_steps < self.steps[i])
            if w.sum() < 2:
                continue
            d = logh[:, w] - base[:, None]
            out[i - 1] = float(np.nanmean(d))
            se[i - 1] = float(np.nanstd(d) / math.sqrt(d.size)) + 1e-3
        return out, se


@dataclass(frozen=True)
class KernelSettings:
    """The kernel model's free settings (module docstring)."""

    lr: float
    temperature_lr: float
    drift: float
    floor: float
    optimizer: str = "adam"


def kernel_scenario(counts: Counts, kernel: np.ndarray, train: np.ndarray, names: tuple[str, ...], arms: int,
                    floor: float, start_logprob: np.ndarray | None = None) -> Scenario:
    """The calibrated scenario (:func:`bandit_sim.calibrate.success_probabilities` with ``p_never = floor``), with
    the measured kernel and the training split. ``start_logprob [P, C]`` (the kernel's log pi(y*|x) at the start,
    NaN where unknown): a never-solved prompt starts at ``min(exp(logprob), floor)`` instead of the floor — the
    measured probability of its correct answer, which a floor set for the whole pool overstates by orders of
    magnitude on the prompts a policy is furthest from."""
    if not 0 < floor < 0.5:
        raise ConfigError(f"the never-solved floor must be in (0, 0.5), got {floor}")
    p = success_probabilities(counts, floor)
    if start_logprob is not None:
        never = (counts.s == 0) & ~counts.g
        measured = np.exp(np.clip(np.nan_to_num(np.asarray(start_logprob, dtype=float), nan=0.0), -60.0, 0.0))
        p = np.where(never, np.clip(np.minimum(measured, floor), 1e-20, None), p)
    sc = scenario_from_probabilities(p, arms, names)
    return replace(sc, kernel=kernel, train=np.asarray(train, dtype=bool))


@dataclass(frozen=True)
class Trajectory:
    """The bandit's per-context correct-answer probability ``q [R, T, S, P, C]``, P(solved) ``solve [R, T, S, P, C]``
    and mean arm entropy over the training contexts ``entropy [R, T, S, P]`` at ``steps [T]``."""

    regimes: tuple[str, ...]
    steps: np.ndarray
    q: np.ndarray
    solve: np.ndarray
    entropy: np.ndarray


def kernel_config(run: dict[str, Any], regimes: tuple[str, ...], scenario: Scenario, ks: KernelSettings,
                  seeds: int, thl_sigma: float = 0.0) -> SimConfig:
    """The LLM run mirrored as :func:`bandit_sim.fit.bandit_config` does, on the kernel model with ``ks``."""
    n_train = int(scenario.train_index.size)
    cfg = bandit_config(run, regimes, n_train, FreeSettings(ks.optimizer, ks.lr, 1), SimOptions(seeds=seeds, thl_sigma=thl_sigma),
                        int(run["group_size"]))
    return replace(cfg, model="kernel", temperature_lr=ks.temperature_lr, drift=ks.drift)


def simulate_kernel(scenario: Scenario, cfg: SimConfig, eval_steps: np.ndarray, eval_k: int) -> Trajectory:
    """Run ``cfg`` and read every regime's per-context probabilities at ``eval_steps`` (step 0 included)."""
    eng = Engine(scenario, cfg)
    want = sorted({int(t) for t in eval_steps if 0 <= t <= cfg.steps})
    train = torch.from_numpy(scenario.train_index)
    qs, solves, ents = [], [], []

    def grab() -> None:
        with torch.no_grad():
            z = eng.model.all_logits()  # [R, S, P, C, K]
            logp = torch.log_softmax(z, dim=-1)
            p = logp.exp()
            q = p[..., CORRECT_ARM]
            greedy = z.argmax(dim=-1) == CORRECT_ARM
            qs.append(q.numpy().copy())
            solves.append(torch.where(greedy, 1.0, 1.0 - (1.0 - q) ** eval_k).numpy().copy())
            ents.append((-(p * logp).sum(-1))[..., train].mean(-1).numpy().copy())

    if 0 in want:
        grab()
    for t in range(1, cfg.steps + 1):
        eng.step(diagnose=False)
        if t in want:
            grab()
    tr = lambda xs: np.stack(xs, axis=1)  # noqa: E731  [R, T, ...]
    return Trajectory(tuple(s.name for s in eng.specs), np.array(want), tr(qs), tr(solves), tr(ents))


#: the entropy term's weight in the fit's log-likelihood. 0 by default: the LLM's per-token sampling entropy is not
#: the bandit's entropy over arms (on the demo GRPO's token entropy falls by half, mostly on tokens no answer depends
#: on, while its accuracy rises by a third), and at weight 1 the fit bought the entropy's fall with a learning rate
#: that moved SGT's rescue set 1.7x too fast (``experiments/crosscheck/README.md``)
ENTROPY_WEIGHT = 0.0


def log_likelihood(traj: Trajectory, curves: Curves, entropy_weight: float | None = None) -> float:
    """Binomial log-likelihood of the observed counts after step 0 under the bandit's seed-mean probabilities,
    plus the entropy change's Gaussian log-likelihood (module docstring). Regime 0 of ``traj`` is the GRPO run."""
    entropy_weight = ENTROPY_WEIGHT if entropy_weight is None else entropy_weight
    q = np.clip(traj.q[0].mean(axis=1), 1e-6, 1 - 1e-6)  # [T, P, C]
    idx = [int(np.searchsorted(traj.steps, s)) for s in curves.steps]
    ll = 0.0
    for i in range(1, len(curves.steps)):
        s, n = curves.successes[:, i], curves.samples[:, i]
        qi = q[idx[i]]
        ll += float((s * np.log(qi) + (n - s) * np.log1p(-qi)).sum())
    obs, se = curves.entropy_ratio()
    if entropy_weight and np.isfinite(obs).any():
        h = traj.entropy[0].mean(axis=1).mean(axis=-1)  # [T]
        pred = np.log(np.clip(h[idx[1:]], 1e-12, None) / max(h[0], 1e-12))
        ok = np.isfinite(obs)
        ll -= entropy_weight * float((((pred[ok] - obs[ok]) / se[ok]) ** 2).sum() / 2)
    return ll


#: the coordinate search's grids (log-spaced; 0 is "off" for the temperature and the drift)
LR_GRID = (0.003, 0.01, 0.03, 0.06, 0.1, 0.2, 0.4, 0.8)
TEMPERATURE_GRID = (0.0, 0.001, 0.003, 0.01, 0.03)
DRIFT_GRID = (0.0, 0.02, 0.05, 0.1, 0.2, 0.4)
FLOOR_GRID = (1e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1)


def fit_kernel(counts: Counts, kernel: np.ndarray, curves: Curves, names: tuple[str, ...], run: dict[str, Any], *,
               arms: int = 16, seeds: int = 8, rounds: int = 2, start_logprob: np.ndarray | None = None,
               log=None) -> dict[str, Any]:
    """The profile likelihood over :data:`LR_GRID` on the GRPO run ``run`` / ``curves`` (module docstring): at each
    learning rate the other settings maximising :func:`log_likelihood` — the best of a joint start grid and the
    previous learning rate's best, then ``rounds`` coordinate steps over each setting's grid. The fit is the
    profile's best point. Returns ``{"settings", "log_likelihood", "evaluations", "profile", "dispersion"}``:
    ``profile`` the ``(settings, log-likelihood)`` of every learning rate, ``dispersion`` :func:`dispersion` at the
    best point."""
    if parse_name(run) != "grpo":
        raise ConfigError(f"the kernel model is fitted on a GRPO run; this run is {parse_name(run)}")
    cache: dict[KernelSettings, tuple[float, float]] = {}

    def score(ks: KernelSettings) -> float:
        if ks not in cache:
            sc = kernel_scenario(counts, kernel, curves.train, names, arms, ks.floor, start_logprob)
            cfg = kernel_config(run, ("grpo",), sc, ks, seeds)
            try:
                traj = simulate_kernel(sc, cfg, curves.steps, int(run["eval_k"]))
                cache[ks] = (log_likelihood(traj, curves), dispersion(traj, curves))
            except ValueError:  # diverged (non-finite logits): the worst score
                cache[ks] = (-math.inf, math.nan)
            if log is not None:
                log(f"  {ks}: {cache[ks][0]:.1f}")
        return cache[ks][0]

    # the settings trade off (a large lr with no temperature fits GRPO's pool nearly as well as a small one with
    # some), so each learning rate gets its own joint start and coordinate refinement: a search over all four from
    # one start stopped on a ridge (demo seed 0: lr 0.2 at -3836.1 where lr 0.06 reaches -3832.4)
    grids = {"temperature_lr": TEMPERATURE_GRID, "drift": DRIFT_GRID, "floor": FLOOR_GRID}
    profile: list[tuple[KernelSettings, float]] = []
    previous: KernelSettings | None = None
    for lr in LR_GRID:
        start = [KernelSettings(lr, tl, dr, FLOOR_GRID[-1]) for tl in TEMPERATURE_GRID[:3] for dr in DRIFT_GRID[1::2]]
        if previous is not None:
            start.append(replace(previous, lr=lr))
        best = max(start, key=score)
        for _ in range(rounds):
            for name, grid in grids.items():
                best = max((replace(best, **{name: v}) for v in grid), key=score)
        profile.append((best, cache[best][0]))
        previous = best
    best, ll = max(profile, key=lambda p: p[1])
    return {"settings": best, "log_likelihood": ll, "evaluations": len(cache), "profile": profile,
            "dispersion": cache[best][1]}


def dispersion(traj: Trajectory, curves: Curves) -> float:
    """The binomial deviance per degree of freedom of the counts :func:`log_likelihood` scores (``[4]`` free
    settings), at least 1: how much more the per-prompt counts scatter around the model than binomial sampling
    explains (quasi-likelihood's dispersion; 1.5-2.2 on the demo's GRPO runs)."""
    q = np.clip(traj.q[0].mean(axis=1), 1e-6, 1 - 1e-6)
    idx = [int(np.searchsorted(traj.steps, s)) for s in curves.steps]
    dev, n_obs = 0.0, 0
    for i in range(1, len(curves.steps)):
        s, n = curves.successes[:, i], curves.samples[:, i]
        ok = n > 0
        s, n, qi = s[ok], n[ok], q[idx[i]][ok]
        with np.errstate(divide="ignore", invalid="ignore"):
            dev += 2 * float(np.where(s > 0, s * np.log(s / (n * qi)), 0.0).sum()
                             + np.where(n > s, (n - s) * np.log((n - s) / (n * (1 - qi))), 0.0).sum())
        n_obs += int(ok.sum())
    return max(1.0, dev / max(n_obs - 4, 1))


#: profile points with less weight than this are not simulated (their weights go to the others)
MIN_WEIGHT = 0.01


def profile_weights(profile: list[tuple[KernelSettings, float]], phi: float) -> list[tuple[KernelSettings, float]]:
    """The learning rates' weights ``w_i = exp((ll_i - ll_max) / phi)`` (the quasi-likelihood with dispersion ``phi``,
    a flat prior over :data:`LR_GRID`), those under :data:`MIN_WEIGHT` dropped, normalised to sum to 1. Empty
    profile: empty list."""
    finite = [(ks, ll) for ks, ll in profile if math.isfinite(ll)]
    if not finite:
        return []
    top = max(ll for _, ll in finite)
    phi = phi if math.isfinite(phi) and phi >= 1 else 1.0
    w = [(ks, math.exp((ll - top) / phi)) for ks, ll in finite]
    w = [(ks, x) for ks, x in w if x >= MIN_WEIGHT]
    total = sum(x for _, x in w)
    return [(ks, x / total) for ks, x in w]


def parse_name(run: dict[str, Any]) -> str:
    from shared_interfaces.regimes import parse_regime

    return parse_regime((run.get("regime") or {}).get("name", "grpo")).name


def _var_eval(q: np.ndarray, mask: np.ndarray, k: int) -> np.ndarray:
    """Binomial variance of a ``k``-sample evaluation's mean over ``mask [P, C]`` of ``q [S, P, C]``, averaged over
    policies: ``[S]``."""
    n = mask.sum(axis=1)  # [P]
    v = (q * (1 - q) / k * mask).sum(axis=2) / np.maximum(n, 1) ** 2  # [S, P]
    return v.sum(axis=1) / q.shape[1] ** 2


def _var_prompts(q: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Bootstrap variance over prompts of the mean over ``mask``, averaged over policies: ``[S]``."""
    n = mask.sum(axis=1)
    mean = (q * mask).sum(axis=2) / np.maximum(n, 1)
    var = (((q - mean[..., None]) ** 2) * mask).sum(axis=2) / np.maximum(n - 1, 1) / np.maximum(n, 1)
    return var.sum(axis=1) / q.shape[1] ** 2


def summarise(traj: Trajectory, curves: Curves, eval_k: int) -> dict[str, dict[str, Any]]:
    """Per regime ``final``, ``heldout``, ``heldout_change`` and ``rescue_rate`` as ``{mean, ci95, per_seed,
    per_prompt}`` (module docstring; ``per_prompt``: the (policy, prompt) entries' values, averaged over the seeds,
    for a bootstrap over prompts)."""
    train = np.broadcast_to(curves.train, curves.samples[:, 0].shape)
    own = curves.own_family()
    rescue = curves.rescue_set()
    out: dict[str, dict[str, Any]] = {}
    for r, name in enumerate(traj.regimes):
        q, q0 = traj.q[r, -1], traj.q[r, 0]  # [S, P, C]
        per: dict[str, Any] = {}
        for key, mask, vals in (("final", train, q), ("heldout", own, q)):
            if not mask.any():
                per[key] = {"mean": None, "ci95": None, "per_seed": None, "per_prompt": None}
                continue
            m = ((vals * mask).sum(axis=2) / np.maximum(mask.sum(axis=1), 1)).mean(axis=1)  # [S]
            var = m.var(ddof=1) + _var_eval(vals, mask, eval_k).mean() + _var_prompts(vals, mask).mean()
            per[key] = {"mean": float(m.mean()), "ci95": float(Z95 * math.sqrt(var)), "per_seed": m,
                        "per_prompt": vals.mean(axis=0)[mask]}
        if own.any():
            m0 = ((q0 * own).sum(axis=2) / np.maximum(own.sum(axis=1), 1)).mean(axis=1)
            ch = per["heldout"]["per_seed"] - m0
            per["heldout_change"] = {"mean": float(ch.mean()), "ci95": per["heldout"]["ci95"], "per_seed": ch,
                                     "per_prompt": per["heldout"]["per_prompt"]}
        if rescue.any():
            sv = traj.solve[r, -1][:, rescue]  # [S, N]
            m = sv.mean(axis=1)
            var = m.var(ddof=1) + float((sv * (1 - sv)).mean(axis=0).sum()) / rescue.sum() ** 2
            per["rescue_rate"] = {"mean": float(m.mean()), "ci95": float(Z95 * math.sqrt(var)), "per_seed": m,
                                  "per_prompt": sv.mean(axis=0)}
        else:
            per["rescue_rate"] = {"mean": None, "ci95": None, "per_seed": None, "per_prompt": None}
        out[name] = per
    return out


def mix(parts: list[tuple[float, dict[str, dict[str, Any]]]]) -> dict[str, dict[str, Any]]:
    """The summaries (:func:`summarise`) of the profile's points, weighted (:func:`profile_weights`) into one: per
    regime and key the weighted ``mean``; a ``ci95`` of the mixture, ``1.96 * sqrt(sum_i w_i (var_i + (mean_i -
    mean)^2))`` — each point's one-run variance plus the spread between the learning rates the GRPO run cannot tell
    apart; and the points' ``components`` ``(w, per_seed, per_prompt)`` for :func:`paired_ties`. One point with
    weight 1: its own mean and ci95. No parts: an empty dict."""
    if not parts:
        return {}
    first = parts[0][1]
    out: dict[str, dict[str, Any]] = {}
    for name in first:
        out[name] = {}
        for key in first[name]:
            vals = [(w, s[name][key]) for w, s in parts]
            if any(v["mean"] is None for _, v in vals):
                out[name][key] = {"mean": None, "ci95": None, "components": None}
                continue
            mean = sum(w * v["mean"] for w, v in vals)
            var = sum(w * ((v["ci95"] / Z95) ** 2 + (v["mean"] - mean) ** 2) for w, v in vals)
            out[name][key] = {"mean": float(mean), "ci95": float(Z95 * math.sqrt(var)),
                              "components": [(w, v["per_seed"], v["per_prompt"]) for w, v in vals]}
    return out


def _components(v: dict[str, Any]) -> list[tuple[float, np.ndarray, np.ndarray]]:
    return v["components"] if v.get("components") is not None else [(1.0, v["per_seed"], v["per_prompt"])]


def paired_ties(summary: dict[str, dict[str, Any]], key: str, best: str) -> list[str]:
    """Regimes whose expected ``key`` is not clearly below ``best``'s: the 95 % interval of the expected difference
    includes 0. At each of the profile's points (:func:`mix`'s ``components``; a :func:`summarise` entry is one) the
    difference is paired over the bandit seeds (common random numbers: the standard error of their mean difference)
    plus a bootstrap over prompts of the per-prompt difference (another pool of the same size); the points are then
    mixed by their weights, their spread included. The evaluation's binomial noise is left out: it blurs one run's
    outcome, not which regime is better on average."""
    ties = []
    b = summary[best][key]
    for name, per in summary.items():
        v = per.get(key) or {}
        if name == best or v.get("mean") is None or b.get("mean") is None:
            continue
        parts = []
        for (w, bs, bp), (_, vs, vp) in zip(_components(b), _components(v), strict=True):
            d = bs - vs
            parts.append((w, float(d.mean()), float(np.var(d, ddof=1)) / len(d) + float(np.var(bp - vp, ddof=1)) / len(bp)))
        mean = sum(w * m for w, m, _ in parts)
        var = sum(w * (x + (m - mean) ** 2) for w, m, x in parts)
        if mean - Z95 * math.sqrt(var) <= 0:
            ties.append(name)
    return ties


#: ``--objective`` -> the summary's key
OBJECTIVES = {"final": "final", "heldout": "heldout", "rescue": "rescue_rate"}


def choose(summary: dict[str, dict[str, Any]], key: str) -> tuple[str, list[str]] | None:
    """The regime with the best predicted mean ``key`` and those :func:`paired_ties` cannot separate from it; None
    when no regime has one."""
    ranked = sorted((n for n in summary if summary[n][key]["mean"] is not None), key=lambda n: -summary[n][key]["mean"])
    if not ranked:
        return None
    return ranked[0], paired_ties(summary, key, ranked[0])


def predict_kernel(counts: Counts, kernel: np.ndarray, curves: Curves, names: tuple[str, ...], run: dict[str, Any],
                   regimes: tuple[str, ...], *, objective: str = "final", seeds: int = 32, arms: int = 16,
                   fit_seeds: int = 8, thl_sigma: float = 0.0, start_logprob: np.ndarray | None = None,
                   log=None) -> dict[str, Any]:
    """Fit on the GRPO run (:func:`fit_kernel`), simulate ``regimes`` at every learning rate of the profile with
    weight (:func:`profile_weights`; ``points``), summarise each (:func:`summarise`), mix them (:func:`mix`) and choose:
    ``use`` the best mean on ``objective`` (``final``, ``heldout`` or ``rescue``), ``ties_with_use`` the regimes
    :func:`paired_ties` cannot separate from it, ``clear_winner`` False when there are any."""
    import time

    t0 = time.perf_counter()
    fit = fit_kernel(counts, kernel, curves, names, run, arms=arms, seeds=fit_seeds, start_logprob=start_logprob,
                     log=log)
    t_fit = time.perf_counter() - t0
    ks = fit["settings"]
    points = profile_weights(fit["profile"], fit["dispersion"])
    if not points:
        raise ConfigError("the kernel model diverged at every learning rate of the fit's grid (non-finite logits); "
                          "check the success matrix's kernel (`python -m mrl_llm kernel --run DIR` again)")
    parts = []
    for point, w in points:
        sc = kernel_scenario(counts, kernel, curves.train, names, arms, point.floor, start_logprob)
        cfg = kernel_config(run, regimes, sc, point, seeds, thl_sigma)
        parts.append((w, summarise(simulate_kernel(sc, cfg, curves.steps, int(run["eval_k"])), curves,
                                   int(run["eval_k"]))))
    summary = mix(parts)
    choice = {obj: choose(summary, key) for obj, key in OBJECTIVES.items()}
    if choice[objective] is None:
        raise ConfigError(f"no regime has a predicted {OBJECTIVES[objective]} (e.g. no rescue set or no held-out "
                          "prompts); choose another --objective")
    best, ties = choice[objective]
    return {"settings": ks, "fit": fit, "points": points, "summary": summary, "use": best, "ties_with_use": ties,
            "clear_winner": not ties, "objective": objective,
            "by_objective": {o: None if c is None else {"use": c[0], "ties_with_use": c[1], "clear_winner": not c[1]}
                             for o, c in choice.items()},
            "seconds": {"fit": t_fit, "predict": time.perf_counter() - t0 - t_fit}}


def curves_from_dynamics(dyn: Dynamics, prompts: tuple[str, ...] | None = None,
                         policies: tuple[str, ...] | None = None) -> Curves:
    """A run's :class:`~shared_interfaces.dynamics.Dynamics` as :class:`Curves`, its prompts in the order of
    ``prompts`` and its policies in that of ``policies`` (a success matrix's); a :class:`ConfigError` when they are
    not the same sets (the dynamics of another run)."""
    prompts = tuple(dyn.prompts) if prompts is None else tuple(prompts)
    policies = tuple(dyn.policies) if policies is None else tuple(policies)
    if set(prompts) != set(dyn.prompts) or len(prompts) != len(dyn.prompts):
        only_m, only_d = sorted(set(prompts) - set(dyn.prompts)), sorted(set(dyn.prompts) - set(prompts))
        raise ConfigError(f"the dynamics file's prompts are not the success matrix's ({len(only_m)} only in the matrix, "
                          f"e.g. {only_m[:2]}; {len(only_d)} only in the dynamics, e.g. {only_d[:2]}); give the "
                          "dynamics of the run the matrix was written from")
    if set(policies) != set(dyn.policies) or len(policies) != len(dyn.policies):
        raise ConfigError(f"the dynamics file trains policies {list(dyn.policies)}, the success matrix "
                          f"{list(policies)}; give the dynamics of the run the matrix was written from")
    ci = [dyn.prompts.index(p) for p in prompts]
    pi = [dyn.policies.index(p) for p in policies]
    take = lambda a: a[pi][:, :, ci]  # noqa: E731
    fams = None if dyn.families is None else tuple(dyn.families[c] for c in ci)
    return Curves(dyn.steps, take(dyn.successes), take(dyn.samples), take(dyn.greedy_correct),
                  np.array([dyn.split[c] == "train" for c in ci]), fams, dyn.entropy_steps, dyn.entropy[pi],
                  int(dyn.run["steps"]))
