"""Regime names, combinations and typed settings."""

from __future__ import annotations

import pytest

from shared_interfaces.config_io import ConfigError
from shared_interfaces.regimes import (
    STANDARD_REGIMES,
    idle_signal_warnings,
    parse_regime,
    parse_regime_config,
)


@pytest.mark.parametrize("name", STANDARD_REGIMES)
def test_standard_names_round_trip(name):
    assert parse_regime(name).name == name


@pytest.mark.parametrize(
    "name, canonical, base, sgt",
    [
        ("sgt+xgrpo", "sgt+xgrpo", "xgrpo", True),
        ("xgrpo+sgt", "sgt+xgrpo", "xgrpo", True),
        ("grpo+sgt", "sgt", "grpo", True),
        ("prp_thl+sgt", "prp_thl+sgt", "prp_thl", True),
        (" prp_snapshot ", "prp_snapshot", "prp_snapshot", False),
    ],
)
def test_combinations(name, canonical, base, sgt):
    spec = parse_regime(name)
    assert (spec.name, spec.base, spec.sgt_enabled) == (canonical, base, sgt)


@pytest.mark.parametrize(
    "name, match",
    [
        ("ppo", "unknown regime component"),
        ("prp_thl+xgrpo", "combines bases"),
        ("grpo+xgrpo", "combines bases"),
        ("sgt+sgt", "twice"),
        ("", "non-empty"),
    ],
)
def test_bad_names(name, match):
    with pytest.raises(ConfigError, match=match):
        parse_regime(name)


def test_settings_typed_and_unknown_keys_named():
    spec = parse_regime("prp_thl+sgt", {"prp": {"ratio_cap": 5, "peer_weight": 0.5},
                                         "sgt": {"weight": 0.1, "selection": "random"}})
    assert spec.prp.ratio_cap == 5.0 and spec.sgt.weight == 0.1 and spec.sgt.selection == "random"
    assert spec.denominator == "thl" and spec.uses_peer_samples and spec.pooled_advantages
    with pytest.raises(ConfigError, match=r"regime.sgt: unknown key\(s\) \['lambda'\]"):
        parse_regime("sgt", {"sgt": {"lambda": 1.0}})
    with pytest.raises(ConfigError, match="unknown key"):
        parse_regime("sgt", {"sgtt": {}})
    with pytest.raises(ConfigError, match="not one of"):
        parse_regime("sgt", {"sgt": {"selection": "longest"}})
    with pytest.raises(ConfigError, match="must be >= 1"):
        parse_regime("sgt", {"sgt": {"successes_per_prompt": 0}})
    with pytest.raises(ConfigError, match="expected a number"):
        parse_regime("prp_thl", {"prp": {"ratio_cap": "big"}})


@pytest.mark.parametrize("value", [False, 0, "", []])
def test_a_section_that_is_not_a_mapping_is_refused(value):
    """``sgt: false`` read as "no settings": SGT ran with its defaults (every falsy value did)."""
    with pytest.raises(ConfigError, match=r"regime\.sgt: expected a mapping"):
        parse_regime("sgt", {"sgt": value})
    with pytest.raises(ConfigError, match=r"regime\.prp: expected a mapping"):
        parse_regime_config({"name": "prp_thl", "prp": value})
    assert parse_regime("sgt", {"sgt": None, "advantage": None}) == parse_regime("sgt")  # an empty section: defaults


def test_regime_config_section_with_name():
    spec = parse_regime_config({"name": "sgt+xgrpo", "sgt": {"weight": 0.3}})
    assert spec.name == "sgt+xgrpo" and spec.sgt.weight == 0.3
    assert spec.to_dict()["sgt"]["weight"] == 0.3 and "prp" not in spec.to_dict()
    with pytest.raises(ConfigError, match="missing key 'name'"):
        parse_regime_config({"sgt": {}})
    # a section for a component the regime lacks is validated, then ignored (sweeps share configs)
    assert parse_regime("grpo", {"prp": {"peer_weight": 0.2}}).name == "grpo"


def test_idle_signal_warnings():
    """One policy: every regime but grpo trains as grpo. G = 1 under own-group statistics: zero advantages."""
    two = {"a": 4, "b": 4}
    assert idle_signal_warnings(parse_regime("grpo"), {}) == []
    for name in STANDARD_REGIMES + ("sgt+xgrpo",):
        assert idle_signal_warnings(parse_regime(name), two) == []
    (alone,) = idle_signal_warnings(parse_regime("prp_thl"), {"a": 4})
    assert "one policy and no peers, so it trains as grpo" in alone
    assert idle_signal_warnings(parse_regime("grpo"), {"a": 4}) == []
    (g1,) = idle_signal_warnings(parse_regime("sgt"), {"a": 1, "b": 4})
    assert "group_size 1 for ['a']" in g1 and "or use a pooled regime" in g1
    assert idle_signal_warnings(parse_regime("xgrpo"), {"a": 1, "b": 1}) == []  # pooled over two policies: G = 2
    alone_one = idle_signal_warnings(parse_regime("xgrpo"), {"a": 1})
    assert len(alone_one) == 2 and "pooled regime" not in alone_one[1]
