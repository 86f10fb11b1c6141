"""What happens above the drift threshold is configurable (``drift.on_exceed``): ``stop`` raises, ``warn``
logs and goes on (the report says so); the default is ``warn`` for bf16 policies and ``stop`` for fp32."""

from __future__ import annotations

import copy
import logging

import pytest
import torch

from mrl_llm.config import DriftSection, PolicyConfig, config_from_mapping
from mrl_llm.rollout import DriftConfig, DriftError, HFEngine
from mrl_llm.rollout.drift import check_drift
from shared_interfaces.config_io import ConfigError
from tests.rollout.test_engine_support import _Tok, model  # noqa: F401 - the fixture


def _moved(m):
    out = copy.deepcopy(m)
    with torch.no_grad():
        for p in out.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return out


def test_warn_logs_the_drift_and_goes_on_stop_raises(model, caplog):  # noqa: F811
    engine = HFEngine(copy.deepcopy(model), _Tok())
    torch.manual_seed(0)
    moved = _moved(model)
    prompts = [[1, 5, 6], [1, 9]]
    with caplog.at_level(logging.INFO, logger="mrl_llm.rollout.drift"):
        rep = check_drift(engine, moved, prompts, DriftConfig(threshold=1e-4, max_new_tokens=6, on_exceed="warn"),
                          pad_id=0, version=7)
    assert rep.exceeded and rep.mean_abs > 1e-4
    assert "mean |dlogp|" in caplog.text and "training goes on (drift.on_exceed: warn)" in caplog.text
    with pytest.raises(DriftError, match="drift.on_exceed: warn keeps training"):
        check_drift(engine, moved, prompts, DriftConfig(threshold=1e-4, max_new_tokens=6, on_exceed="stop"), pad_id=0)
    ok = check_drift(engine, model, prompts, DriftConfig(threshold=1e-4, on_exceed="warn"), pad_id=0)
    assert not ok.exceeded
    with pytest.raises(ValueError, match="on_exceed must be 'stop' or 'warn'"):
        DriftConfig(on_exceed="ignore")


def test_on_exceed_defaults_by_dtype_and_an_explicit_choice_wins():
    assert PolicyConfig(name="a", model_dir="m", dtype="bf16").drift.on_exceed == "warn"
    assert PolicyConfig(name="a", model_dir="m", dtype="bfloat16").drift.on_exceed == "warn"
    assert PolicyConfig(name="a", model_dir="m").drift.on_exceed == "stop"
    assert PolicyConfig(name="a", model_dir="m", dtype="bf16",
                        drift=DriftSection(on_exceed="stop")).drift.on_exceed == "stop"
    with pytest.raises(ConfigError, match="on_exceed"):
        config_from_mapping({"policies": [{"name": "a", "model_dir": "m", "drift": {"on_exceed": "never"}}]})
