"""Metric rows are valid JSON (non-finite -> null) and mirrored to TensorBoard when it is installed."""

from __future__ import annotations

import json
import sys
import types

from mrl_llm.metrics import MetricsLog, read_metrics


def test_rows_are_json_and_go_to_tensorboard(tmp_path, monkeypatch):
    calls = []

    class FakeWriter:  # stands in for torch.utils.tensorboard.SummaryWriter
        def __init__(self, log_dir):
            calls.append(("init", log_dir))

        def add_scalar(self, tag, value, step):
            calls.append((tag, value, step))

        def close(self):
            calls.append(("close",))

    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", types.SimpleNamespace(SummaryWriter=FakeWriter))
    log = MetricsLog(tmp_path, tensorboard=True)
    log.metrics([{"kind": "train", "step": 0, "policy": "a", "loss": 0.5, "kl_to_ref": float("nan"), "ok": True},
                 {"kind": "eval", "step": 1, "policy": "a", "eval_accuracy": 0.25, "peer_exclusive_accuracy": None}])
    log.close()
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert rows[0]["kl_to_ref"] is None and rows[0]["loss"] == 0.5
    json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    assert ("a/train/loss", 0.5, 1) in calls and ("a/eval/eval_accuracy", 0.25, 1) in calls
    assert not any(c[0] == "a/train/kl_to_ref" for c in calls) and calls[-1] == ("close",)
    assert calls[0] == ("init", str(tmp_path / "tensorboard"))


def test_the_llm_extra_installs_tensorboard(tmp_path):
    """`scripts/setup.sh` installs the `llm` extra, which brings TensorBoard: the real writer writes event files."""
    log = MetricsLog(tmp_path, tensorboard=True)
    assert log.tb is not None, "tensorboard is not installed: it is part of the llm extra (pyproject.toml)"
    log.metrics([{"kind": "train", "step": 0, "policy": "a", "loss": 0.5}])
    log.close()
    assert any(p.name.startswith("events.out.tfevents") for p in (tmp_path / "tensorboard").iterdir())
