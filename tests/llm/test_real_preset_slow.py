"""Every regime runs ``experiments/configs/real_cpu.yaml`` on the real models: one step each (2 prompts x 4 samples, no
evaluation, to keep five runs within minutes), with the preset's templates, few-shot examples and newline stop.

Needs the prepared models under ``$MRL_MODELS_DIR`` or the checkout's ``models/`` (``python -m mrl_llm models
prepare``); without them the tests skip, and fail under ``CI=true``. Each run loads both models (~12 GB of RAM):
on a shared machine run this file under the models' lock, e.g. ``flock /work/realmodels.lock pytest ...``.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import replace
from pathlib import Path

import pytest

from mrl_llm.config import EvalConfig, load_config
from mrl_llm.trainer import train
from shared_interfaces.exchange import DiskLogExchange
from shared_interfaces.regimes.config import STANDARD_REGIMES

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]

REPO = Path(__file__).resolve().parents[2]
MODELS = ("smollm2-135m-instruct", "gemma-3-270m")


@pytest.fixture(scope="module")
def preset():
    root = Path(os.environ.get("MRL_MODELS_DIR") or REPO / "models")
    missing = [m for m in MODELS if not (root / m / "config.json").is_file()]
    if missing:
        msg = f"the real models {missing} are not prepared under {root}; run python -m mrl_llm models prepare"
        if os.environ.get("CI") == "true":
            pytest.fail(msg + " (required in CI)")
        pytest.skip(msg)
    os.environ["MRL_MODELS_DIR"] = str(root)  # the preset names its model directories through it
    cfg = load_config(REPO / "experiments" / "configs" / "real_cpu.yaml")
    pols = tuple(replace(p, group_size=4) for p in cfg.policies)
    return replace(cfg, steps=1, prompts_per_step=2, policies=pols, eval=EvalConfig(enabled=False),
                   checkpoint_every=0, tensorboard=False, progress=False)


@pytest.mark.parametrize("regime", STANDARD_REGIMES)
def test_every_regime_runs_a_step_of_the_preset(preset, tmp_path, regime):
    from transformers import AutoTokenizer

    from mrl_llm.rollout.base import newline_token_ids

    out = tmp_path / regime
    summary = train(preset.with_regime(regime), out)
    assert summary["regime"] == regime and summary["steps"] == 1
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    train_rows = {r["policy"]: r for r in rows if r["kind"] == "train"}
    assert set(train_rows) == {"smollm2", "gemma3"}
    for r in train_rows.values():
        assert r["nan_skipped"] == 0 and math.isfinite(r["loss"]) and r["own_rows"] == 8
        assert (r["peer_rows"] > 0) == regime.startswith("prp")  # PRP: every peer sample joins
    ex = DiskLogExchange(out / "exchange.jsonl")
    recs = list(ex.records())
    ex.close()
    assert len(recs) == 2 * 2 * 4
    newlines = {p.name: set(newline_token_ids(AutoTokenizer.from_pretrained(p.model_dir))) for p in preset.policies}
    for r in recs:
        assert not newlines[r.policy_id] & set(r.token_ids[:-1])  # a response ends at its first newline
        if r.policy_id == "smollm2":  # the chat template, 3 examples as earlier turns
            assert r.prompt_text.count("<|im_start|>assistant\n\\boxed{") == 3
        else:  # plain few-shot text
            assert r.prompt_text.startswith("Q: What is ") and r.prompt_text.count("}\n\nQ: What is ") == 3
