"""Mirroring an LLM run in the bandit: a :class:`bandit_sim.config.SimConfig` from the run's settings,
simulation of every regime on a calibrated scenario (:mod:`bandit_sim.calibrate`), and the fit of the free
settings on a GRPO run's learning curve. Used by ``bandit_sim predict`` and ``experiments.crosscheck``.

**Mirrored from the LLM run** (its ``config.json``): the regime names; ``steps`` (the same step
budget); ``batch_prompts = prompts_per_step`` (at most the number of prompts); ``group_size`` (the
policies' G); the regime settings ``sgt`` (λ, successes per prompt, selection), ``prp`` (peer weight,
ratio cap), ``advantage``; the loss's clip range and KL coefficient. The seed of the bandit draws
is the LLM seed.

**Free** (fitted on GRPO only, :func:`fit_grid`): the optimizer on the logits (plain SGD, or Adam —
the LLM's AdamW normalises each weight's step, which per-logit Adam mimics on a table), its learning
rate and the epochs per step. The LLM's step on a network has no counterpart in a tabular softmax;
these set how far one step moves a context's logits. ``thl_sigma`` (the THL residual on ``prp_thl``'s
denominator) stays a setting (default 0: THL conserves each word's log-prob mass, so a response's total
log-prob, the bandit's ``log mu``, moves only by the residual).

**Objective.** On the common axis ``u = step / steps`` (fraction of the step budget), at the LLM's
evaluation points after step 0: ``SSE = sum over LLM seeds, policies and points of
(bandit accuracy - LLM sample accuracy)^2``, the bandit accuracy being its mean over bandit seeds of
``mean_x pi(correct | x)``. ``rmse = sqrt(SSE / #terms)``. The **flat baseline** predicts the step-0
accuracy at every point (what a simulator that learns nothing would say); a fit that does not beat it
has not learned the LLM's dynamics.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from bandit_sim.calibrate import CORRECT_ARM, solve_probability
from bandit_sim.config import SimConfig
from bandit_sim.engine import Engine
from bandit_sim.scenario import Scenario
from shared_interfaces.config_io import from_mapping
from shared_interfaces.regimes.config import LossConfig, parse_regime_config


@dataclass(frozen=True)
class FreeSettings:
    """The bandit's fitted settings."""

    optimizer: str
    lr: float
    epochs: int


@dataclass(frozen=True)
class SimOptions:
    """How the bandit is run: seeds per LLM seed, the THL residual, the grid of free settings (an lr list
    per optimizer; an empty list leaves that optimizer out)."""

    seeds: int = 32
    thl_sigma: float = 0.0
    sgd_lrs: tuple[float, ...] = (0.0625, 0.125, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0)
    adam_lrs: tuple[float, ...] = (0.003, 0.01, 0.03, 0.1, 0.3)
    epochs: tuple[int, ...] = (1, 2, 4)

    def __post_init__(self) -> None:
        if not (self.sgd_lrs or self.adam_lrs) or not self.epochs:
            raise ValueError("the fit grid is empty: give --sgd-lrs or --adam-lrs, and --epochs")

    def grid(self) -> list[FreeSettings]:
        lrs = {"sgd": self.sgd_lrs, "adam": self.adam_lrs}
        return [FreeSettings(o, lr, e) for o, ls in lrs.items() for lr in ls for e in self.epochs]


def _section(cls, data: dict | None, where: str):
    known = {f for f in cls.__dataclass_fields__}
    return from_mapping(cls, {k: v for k, v in (data or {}).items() if k in known}, where=where)


def bandit_config(llm_config: dict[str, Any], regimes: tuple[str, ...], n_contexts: int, free: FreeSettings,
                  opts: SimOptions, group_size: int, record_every: int = 1) -> SimConfig:
    """The bandit run that mirrors ``llm_config`` (module docstring); metrics every ``record_every`` steps."""
    spec = parse_regime_config(llm_config["regime"])  # the LLM run's regime settings, parsed by the core
    loss = _section(LossConfig, llm_config.get("loss"), "loss")
    return SimConfig(
        regimes=tuple(regimes), steps=int(llm_config["steps"]), seeds=opts.seeds, seed=int(llm_config.get("seed", 0)),
        batch_prompts=min(int(llm_config["prompts_per_step"]), n_contexts), group_size=group_size,
        epochs=free.epochs, lr=free.lr, optimizer=free.optimizer, model="tabular", thl_sigma=opts.thl_sigma,
        record_every=record_every, dtype="float64", threads=1,
        advantage=spec.advantage, prp=spec.prp, sgt=spec.sgt,
        loss=LossConfig(clip_low=loss.clip_low, clip_high=loss.clip_high, agg="token-mean", kl_coef=loss.kl_coef),
    )


@dataclass(frozen=True)
class Prediction:
    """The bandit's outcome per regime: ``accuracy [R, T, S, P]`` at ``steps [T]``; ``solve_prob
    [R, U, S, P, C]`` (P(solved) under the LLM's evaluation protocol) at ``snap_steps [U]`` (the last one
    is the end of the run)."""

    regimes: tuple[str, ...]
    steps: np.ndarray
    accuracy: np.ndarray
    snap_steps: np.ndarray
    solve_prob: np.ndarray
    #: ``[R, U, S, P, C]`` each context's probability of the correct arm at ``snap_steps``
    correct_prob: np.ndarray | None = None

    @property
    def final_solve_prob(self) -> np.ndarray:
        """``[R, S, P, C]`` at the end of the run."""
        return self.solve_prob[:, -1]

    def curve(self, regime: str, at_fraction: np.ndarray) -> np.ndarray:
        """Mean over bandit seeds of the accuracy ``[P, len(at_fraction)]`` on the step-budget axis."""
        r = self.regimes.index(regime)
        u = self.steps / self.steps[-1]
        mean = self.accuracy[r].mean(axis=1)  # [T, P]
        return np.stack([np.interp(at_fraction, u, mean[:, p]) for p in range(mean.shape[1])])

    def curve_sd(self, regime: str, at_fraction: np.ndarray) -> np.ndarray:
        r = self.regimes.index(regime)
        u = self.steps / self.steps[-1]
        sd = self.accuracy[r].std(axis=1)
        return np.stack([np.interp(at_fraction, u, sd[:, p]) for p in range(sd.shape[1])])


def simulate(scenario: Scenario, cfg: SimConfig, eval_k: int, snap_steps=()) -> Prediction:
    """Run ``cfg`` on ``scenario`` in this process; read every regime's per-context P(solved) after the
    steps in ``snap_steps`` (step 0 = the start) and at the end."""
    eng = Engine(scenario, cfg)
    snaps = sorted({int(t) for t in snap_steps if 0 <= t < cfg.steps} | {cfg.steps})
    probs: list[np.ndarray] = []
    correct: list[np.ndarray] = []
    done = [0]

    def grab() -> None:
        with torch.no_grad():
            z = np.stack([eng.model.logits(r).numpy() for r in range(len(eng.specs))])  # [R, S, P, C, K]
        probs.append(solve_probability(z, eval_k))
        e = np.exp(z - z.max(axis=-1, keepdims=True))
        correct.append(e[..., CORRECT_ARM] / e.sum(axis=-1))

    def tick(k: int) -> None:
        done[0] += k
        if done[0] in snaps:
            grab()

    if 0 in snaps:
        grab()
    res = eng.run(tick)
    return Prediction(tuple(res.regimes), res.steps, res.metrics["accuracy"].transpose(1, 0, 2, 3),
                      np.array(snaps), np.stack(probs, axis=1), np.stack(correct, axis=1))


@dataclass(frozen=True)
class FitCase:
    """One LLM seed's GRPO target: the calibrated scenario, the LLM run's config, its curve."""

    scenario: Scenario
    llm_config: dict[str, Any]
    group_size: int
    eval_k: int
    fractions: np.ndarray  # [T] evaluation points on the budget axis (0 first)
    llm_accuracy: np.ndarray  # [P, T] sample accuracy


def curve_sse(pred: np.ndarray, target: np.ndarray) -> tuple[float, int]:
    """SSE over the finite points after the first (step 0), and how many terms."""
    d = (pred - target)[:, 1:]
    ok = np.isfinite(d)
    return float((d[ok] ** 2).sum()), int(ok.sum())


def eval_gcd(fractions: np.ndarray, steps: int) -> int:
    """The largest recording interval that hits every evaluation step."""
    return max(1, math.gcd(*(int(round(f * steps)) for f in fractions)))


def fit_grid(cases: list[FitCase], opts: SimOptions) -> dict[str, Any]:
    """Every ``(lr, epochs)`` of the grid on the GRPO runs: ``{"grid": [...], "best": {...},
    "flat_baseline_rmse"}`` (module docstring). Ties go to SGD, then to the smaller ``lr * epochs``."""
    grid = []
    for free in opts.grid():
        sse, n = 0.0, 0
        for case in cases:
            steps = int(case.llm_config["steps"])
            cfg = bandit_config(case.llm_config, ("grpo",), case.scenario.n_contexts, free, opts, case.group_size,
                                eval_gcd(case.fractions, steps))
            pred = simulate(case.scenario, cfg, case.eval_k).curve("grpo", case.fractions)
            s, k = curve_sse(pred, case.llm_accuracy)
            sse, n = sse + s, n + k
        grid.append({"optimizer": free.optimizer, "lr": free.lr, "epochs": free.epochs, "sse": sse,
                     "rmse": math.sqrt(sse / n) if n else math.nan})
    best = min(grid, key=lambda g: (g["sse"], g["optimizer"] != "sgd", g["lr"] * g["epochs"]))
    sse0, n0 = 0.0, 0
    for case in cases:
        flat = np.repeat(case.llm_accuracy[:, :1], case.llm_accuracy.shape[1], axis=1)
        s, k = curve_sse(flat, case.llm_accuracy)
        sse0, n0 = sse0 + s, n0 + k
    return {"grid": grid, "best": best, "flat_baseline_rmse": math.sqrt(sse0 / n0) if n0 else math.nan}
