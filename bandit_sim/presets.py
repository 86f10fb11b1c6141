"""Named run presets (``bandit_sim run --preset NAME``) and sweep grids (``bandit_sim sweep --grid NAME``).

``paper`` is the benchmark workload of the issue: 256 contexts x 32 arms, 2 policies, the five standard
regimes, 64 seeds, 1000 steps, 64 prompts per step, G = 8, one epoch, metrics every 10 steps; its
scenario has half the contexts shared, a tenth unsolved, and half of each policy's peer-only contexts
with hard support (the rescue set). ``smoke`` is the same shape of problem, small enough for seconds.

A sweep grid is a base run config plus axes (``overlap`` = scenario overlap, ``group_size``,
``thl_sigma``, ``sgt_weight`` = SGT's lambda, ``lr``); the sweep runs the full product.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from bandit_sim.config import RunConfig
from bandit_sim.scenario import ScenarioSpec
from shared_interfaces.config_io import ConfigError
from shared_interfaces.regimes import STANDARD_REGIMES, SGTConfig

PAPER_SCENARIO = ScenarioSpec(
    n_contexts=256, n_arms=32, n_policies=2, overlap=0.5, unsolved=0.1, hard_fraction=0.5,
    competent_mass=(0.2, 0.6), soft_mass=(0.01, 0.05), hard_log_mass=-40.0, logit_scale=1.0, seed=0,
)

RUN_PRESETS: dict[str, RunConfig] = {
    "paper": RunConfig(
        generator=PAPER_SCENARIO, regimes=STANDARD_REGIMES, steps=1000, seeds=64, seed=0, batch_prompts=64,
        group_size=8, epochs=1, lr=5.0, thl_sigma=0.5, record_every=10, sgt=SGTConfig(weight=1.0),
    ),
    "smoke": RunConfig(
        generator=replace(PAPER_SCENARIO, n_contexts=32, n_arms=8), regimes=STANDARD_REGIMES, steps=40,
        seeds=4, seed=0, batch_prompts=8, group_size=4, epochs=2, lr=20.0, thl_sigma=0.5, record_every=5,
    ),
}

#: axes a sweep may vary, and what each changes in the run config
SWEEP_AXES = ("overlap", "group_size", "thl_sigma", "sgt_weight", "lr")


@dataclass(frozen=True)
class SweepGrid:
    base: RunConfig
    axes: dict[str, tuple[float, ...]]

    def __post_init__(self) -> None:
        unknown = sorted(set(self.axes) - set(SWEEP_AXES))
        if unknown:
            raise ConfigError(f"sweep grid: unknown axes {unknown}; known: {list(SWEEP_AXES)}")

    def points(self) -> list[dict[str, float]]:
        pts: list[dict[str, float]] = [{}]
        for name, values in self.axes.items():
            pts = [{**p, name: v} for p in pts for v in values]
        return pts


def apply_point(base: RunConfig, point: dict[str, float]) -> RunConfig:
    """The run config of one grid point."""
    cfg = base
    for name, v in point.items():
        if name == "overlap":
            gen = cfg.generator
            cfg = replace(cfg, generator=replace(gen, overlap=float(v), unsolved=min(gen.unsolved, 1.0 - float(v))))
        elif name == "group_size":
            cfg = replace(cfg, group_size=int(v))
        elif name == "sgt_weight":
            cfg = replace(cfg, sgt=replace(cfg.sgt, weight=float(v)))
        else:
            cfg = replace(cfg, **{name: float(v)})
    return cfg


SWEEP_GRIDS: dict[str, SweepGrid] = {
    "paper": SweepGrid(
        base=replace(
            RUN_PRESETS["paper"], generator=replace(PAPER_SCENARIO, n_contexts=128, n_arms=16), seeds=16,
            steps=400, batch_prompts=32, record_every=20,
        ),
        axes={
            "overlap": (0.2, 0.5, 0.8),
            "group_size": (4, 8, 16),
            "thl_sigma": (0.0, 0.5, 1.0),
            "sgt_weight": (0.1, 1.0),
            "lr": (5.0, 20.0),
        },
    ),
    "smoke": SweepGrid(
        base=replace(RUN_PRESETS["smoke"], steps=20, seeds=2, record_every=10),
        axes={"overlap": (0.2, 0.8), "thl_sigma": (0.0, 1.0)},
    ),
}


def get_preset(name: str) -> RunConfig:
    if name not in RUN_PRESETS:
        raise ConfigError(f"unknown preset {name!r}; known presets: {sorted(RUN_PRESETS)}")
    return RUN_PRESETS[name]


def get_grid(name: str) -> SweepGrid:
    if name not in SWEEP_GRIDS:
        raise ConfigError(f"unknown sweep grid {name!r}; known grids: {sorted(SWEEP_GRIDS)}")
    return SWEEP_GRIDS[name]
