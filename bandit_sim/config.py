"""The run configuration of the simulator: one frozen dataclass, every number a user can change.

A run is a scenario (a ``.npz`` file, or a :class:`ScenarioSpec` to generate one), a list of regimes
(names of :mod:`shared_interfaces.regimes.config`, e.g. ``grpo,xgrpo,sgt+xgrpo``) and the settings below.
It maps onto a YAML file one to one (unknown keys are errors) and onto the command-line flags.

Choices not given by the paper (documented here, swept by ``bandit_sim sweep``): plain SGD on the logits
(``optimizer: adam`` is available); the loss is the core's token-mean clipped surrogate (``loss``), so a
step's update is divided by the learner's number of policy-gradient rows, and ``L_SGT`` by its number of
SGT targets in the batch; the THL residual on PRP's aligned peer denominator is log-normal,
``log mu = log pi_peer(a) + thl_bias + thl_sigma * xi`` with ``xi ~ N(0, 1)`` per (learner, peer sample).
``threads`` is torch's intra-op thread count (at most this machine's cores are used); on a shared 2-core machine one thread per process and
``--workers 2`` (two processes) is faster than two threads, which stall whenever the other core is busy.
``plan_table`` looks the core's per-prompt plan up in a table of every 0/1 outcome (built once by the
core, :mod:`bandit_sim.plan_table`; the same numbers) instead of calling it on every step.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np

from bandit_sim.scenario import ScenarioSpec
from shared_interfaces.config_io import ConfigError, from_mapping, to_mapping
from shared_interfaces.regimes import (
    STANDARD_REGIMES,
    AdvantageConfig,
    LossConfig,
    PRPConfig,
    RegimeSpec,
    SGTConfig,
    parse_regime,
)


@dataclass(frozen=True)
class SimConfig:
    """Every setting of a run (see the module docstring)."""

    scenario: str | None = None
    generator: ScenarioSpec = field(default_factory=ScenarioSpec)
    regimes: tuple[str, ...] = STANDARD_REGIMES
    steps: int = 200
    seeds: int = 8
    seed: int = 0
    batch_prompts: int = 32
    group_size: int = 8
    epochs: int = 1
    lr: float = 5.0
    optimizer: Literal["sgd", "adam"] = "sgd"
    model: Literal["tabular", "loglinear", "kernel"] = "tabular"
    feature_dim: int = 16
    #: the kernel model's inverse-temperature learning rate (Adam; 0: the temperature stays 1)
    temperature_lr: float = 0.0
    #: the kernel model's drift: the s.d. of the N(0, drift^2) step each context's correct-answer logit takes per
    #: optimizer step (the optimizer's noise; 0: none)
    drift: float = 0.0
    thl_sigma: float = 0.0
    thl_bias: float = 0.0
    record_every: int = 10
    dtype: Literal["float32", "float64"] = "float32"
    support_eps: float = 1e-3
    rescue_eps: float = 1e-6
    rescue_peer_min: float = 0.05
    threads: int = 1
    plan_table: bool = True
    advantage: AdvantageConfig = field(default_factory=AdvantageConfig)
    prp: PRPConfig = field(default_factory=PRPConfig)
    sgt: SGTConfig = field(default_factory=SGTConfig)
    loss: LossConfig = field(default_factory=LossConfig)

    def __post_init__(self) -> None:
        ints = ("steps", "seeds", "batch_prompts", "group_size", "epochs", "record_every", "feature_dim", "threads")
        for name in ints:
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.scenario is not None and not str(self.scenario).strip():
            raise ConfigError("scenario is empty; give a scenario .npz file, or null to use the generator")
        # a config file's floats are checked finite on load; these checks also hold for configs built in code
        # (predict's --thl-sigma, a sweep point), where inf / nan would run and give nonsense silently
        lr_max = float(np.finfo(np.float32 if self.dtype == "float32" else np.float64).max)
        if not 0 < self.lr <= lr_max:
            raise ConfigError(f"lr must be > 0 and finite (at most {lr_max:.3g} in {self.dtype}), got {self.lr}")
        for name in ("temperature_lr", "drift"):
            if not 0 <= getattr(self, name) < math.inf:
                raise ConfigError(f"{name} must be >= 0 and finite, got {getattr(self, name)}")
        if not 0 <= self.thl_sigma < math.inf:
            raise ConfigError(f"thl_sigma must be >= 0 and finite, got {self.thl_sigma}")
        if not math.isfinite(self.thl_bias):
            raise ConfigError(f"thl_bias must be a finite number, got {self.thl_bias}")
        if self.seed < 0:
            raise ConfigError(f"seed must be >= 0, got {self.seed}")
        if self.scenario is None and self.batch_prompts > self.generator.n_contexts:
            raise ConfigError(f"batch_prompts {self.batch_prompts} exceeds the generated scenario's "
                              f"{self.generator.n_contexts} contexts (generator.n_contexts); lower batch_prompts or "
                              "raise n_contexts")
        for name in ("support_eps", "rescue_eps"):
            if not 0 <= getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 0 and < 1 (a probability threshold), got {getattr(self, name)}")
        if not 0 <= self.rescue_peer_min <= 1:
            raise ConfigError(f"rescue_peer_min must be in [0, 1] (a peer's success probability), got "
                              f"{self.rescue_peer_min}")
        if not self.regimes:
            raise ConfigError("regimes: give at least one regime, e.g. grpo,xgrpo,sgt")
        self.regime_specs()  # unknown or invalid regime names fail here, naming the regime

    def regime_specs(self) -> list[RegimeSpec]:
        """The parsed regimes, each with this run's advantage / PRP / SGT settings."""
        settings = {"advantage": to_mapping(self.advantage), "prp": to_mapping(self.prp), "sgt": to_mapping(self.sgt)}
        specs = [parse_regime(name, settings) for name in self.regimes]
        names = [s.name for s in specs]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ConfigError(f"regimes: {dup} listed twice (names are compared in canonical form)")
        return specs

    def to_dict(self) -> dict[str, Any]:
        return to_mapping(self)


def config_from_mapping(data: Mapping[str, Any], base: SimConfig | None = None, *, where: str = "config") -> SimConfig:
    """``base`` (defaults when None) updated by ``data``; nested sections (``generator``, ``sgt``, ...) are
    merged key by key. Unknown keys raise :class:`ConfigError` naming them."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: the top level must be a mapping of SimConfig keys, got {type(data).__name__}")
    merged = to_mapping(base or SimConfig())
    for key, value in dict(data).items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key] = {**merged[key], **value}
        else:
            merged[key] = value
    if isinstance(merged.get("regimes"), str):
        merged["regimes"] = [r for r in merged["regimes"].split(",") if r.strip()]
    return from_mapping(SimConfig, merged, where=where)


def with_overrides(cfg: SimConfig, *, where: str = "the command line", **changes: Any) -> SimConfig:
    """``cfg`` with top-level keys replaced (errors name ``where`` they came from); ``sgt_weight=`` sets
    ``sgt.weight``."""
    changes = {k: v for k, v in changes.items() if v is not None}
    if "sgt_weight" in changes:
        changes["sgt"] = replace(cfg.sgt, weight=float(changes.pop("sgt_weight")))
    return config_from_mapping(to_mapping(changes), cfg, where=where)
