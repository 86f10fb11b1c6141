"""The regime core of mutual-rl: records, the exchange, regime configs and math, losses, MWRA.

Everything both backends (``bandit_sim`` and ``mrl_llm``) share lives here and depends on nothing
of theirs. The PRP / XGRPO / SGT logic exists only in :mod:`shared_interfaces.regimes`.
"""

from shared_interfaces.exchange import (
    DiskLogExchange,
    ExchangeConflictError,
    ExperienceExchange,
    InMemoryExchange,
)
from shared_interfaces.records import (
    SCHEMA_VERSION,
    SUCCESS_THRESHOLD,
    ExperienceRecord,
    PromptGroup,
    RecordValidationError,
    RewardStats,
    TraceCache,
    make_record_id,
    verified_successes,
)
from shared_interfaces.regimes import (
    STANDARD_REGIMES,
    LossConfig,
    RegimeSpec,
    parse_regime,
    parse_regime_config,
)

__all__ = [
    "SCHEMA_VERSION",
    "STANDARD_REGIMES",
    "SUCCESS_THRESHOLD",
    "DiskLogExchange",
    "ExchangeConflictError",
    "ExperienceExchange",
    "ExperienceRecord",
    "InMemoryExchange",
    "LossConfig",
    "PromptGroup",
    "RecordValidationError",
    "RegimeSpec",
    "RewardStats",
    "TraceCache",
    "make_record_id",
    "parse_regime",
    "parse_regime_config",
    "verified_successes",
]
