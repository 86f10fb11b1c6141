"""Named run presets (``bandit_sim run --preset NAME``; a sweep grid's ``base``).

``paper`` is the benchmark workload of the issue: 256 contexts x 32 arms, 2 policies, the five standard
regimes, 64 seeds, 1000 steps, 64 prompts per step, G = 8, one epoch, metrics every 10 steps; its
scenario has half the contexts shared, a tenth unsolved, and half of each policy's peer-only contexts
with hard support (the rescue set). ``smoke`` is the same shape of problem, small enough for seconds.

Sweep grids are YAML files (a preset plus axes): :mod:`bandit_sim.sweep_config`, ``bandit_sim/grids/``.
"""

from __future__ import annotations

from dataclasses import replace

from bandit_sim.config import SimConfig
from bandit_sim.scenario import ScenarioSpec
from shared_interfaces.config_io import ConfigError
from shared_interfaces.regimes import STANDARD_REGIMES, SGTConfig

PAPER_SCENARIO = ScenarioSpec(
    n_contexts=256, n_arms=32, n_policies=2, overlap=0.5, unsolved=0.1, hard_fraction=0.5,
    competent_mass=(0.2, 0.6), soft_mass=(0.01, 0.05), hard_log_mass=-40.0, logit_scale=1.0, seed=0,
)

RUN_PRESETS: dict[str, SimConfig] = {
    "paper": SimConfig(
        generator=PAPER_SCENARIO, regimes=STANDARD_REGIMES, steps=1000, seeds=64, seed=0, batch_prompts=64,
        group_size=8, epochs=1, lr=5.0, thl_sigma=0.5, record_every=10, sgt=SGTConfig(weight=1.0),
    ),
    "smoke": SimConfig(
        generator=replace(PAPER_SCENARIO, n_contexts=32, n_arms=8), regimes=STANDARD_REGIMES, steps=40,
        seeds=4, seed=0, batch_prompts=8, group_size=4, epochs=2, lr=20.0, thl_sigma=0.5, record_every=5,
    ),
}

def get_preset(name: str) -> SimConfig:
    if name not in RUN_PRESETS:
        raise ConfigError(f"unknown preset {name!r}; known presets: {sorted(RUN_PRESETS)}")
    return RUN_PRESETS[name]
