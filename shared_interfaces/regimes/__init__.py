"""Regime configs (:mod:`.config`), the regime math on arrays (:mod:`.math`), a learner's rows between the
plan and the loss (:mod:`.rows`, whose docstring follows a record from rollout to the loss) and their
record-level face (:mod:`.plan`)."""

from shared_interfaces.regimes.config import (
    ADDONS,
    BASES,
    STANDARD_REGIMES,
    AdvantageConfig,
    LossConfig,
    PRPConfig,
    RegimeSpec,
    SGTConfig,
    idle_signal_warnings,
    parse_regime,
    parse_regime_config,
)
from shared_interfaces.regimes.math import (
    RegimePlan,
    behaviour_correction,
    group_advantages,
    pooled_advantages,
    ratio_variance,
    regime_plan,
    sgt_gate,
    sgt_select,
)
from shared_interfaces.regimes.plan import GroupArrays, group_arrays, plan_groups
from shared_interfaces.regimes.rows import LearnerRows, learner_rows

__all__ = [
    "ADDONS",
    "BASES",
    "STANDARD_REGIMES",
    "AdvantageConfig",
    "GroupArrays",
    "LearnerRows",
    "LossConfig",
    "PRPConfig",
    "RegimePlan",
    "RegimeSpec",
    "SGTConfig",
    "behaviour_correction",
    "group_advantages",
    "group_arrays",
    "idle_signal_warnings",
    "learner_rows",
    "parse_regime",
    "parse_regime_config",
    "plan_groups",
    "pooled_advantages",
    "ratio_variance",
    "regime_plan",
    "sgt_gate",
    "sgt_select",
]
