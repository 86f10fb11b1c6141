"""Regime configs (:mod:`.config`), the regime math on arrays (:mod:`.math`) and its record-level
face (:mod:`.plan`)."""

from shared_interfaces.regimes.config import (
    ADDONS,
    BASES,
    STANDARD_REGIMES,
    AdvantageConfig,
    LossConfig,
    PRPConfig,
    RegimeSpec,
    SGTConfig,
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
from shared_interfaces.regimes.plan import (
    GroupArrays,
    LearnerPromptPlan,
    PGItem,
    group_arrays,
    plan_prompt_group,
    plan_prompt_groups,
)
from shared_interfaces.regimes.rows import TrainRow, learner_rows

__all__ = [
    "ADDONS",
    "BASES",
    "STANDARD_REGIMES",
    "AdvantageConfig",
    "GroupArrays",
    "LearnerPromptPlan",
    "LossConfig",
    "PGItem",
    "PRPConfig",
    "RegimePlan",
    "RegimeSpec",
    "SGTConfig",
    "TrainRow",
    "behaviour_correction",
    "group_advantages",
    "group_arrays",
    "learner_rows",
    "parse_regime",
    "parse_regime_config",
    "plan_prompt_group",
    "plan_prompt_groups",
    "pooled_advantages",
    "ratio_variance",
    "regime_plan",
    "sgt_gate",
    "sgt_select",
]
