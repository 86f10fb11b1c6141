"""A non-finite loss skips the step (logged, counted, weights and optimizer untouched); several in a row
stop training with an error that says what to do."""

from __future__ import annotations

import logging

import pytest
import torch

import mrl_llm.update as update_mod
from mrl_llm.config import PolicyConfig, SamplingSection, TrainSection
from mrl_llm.distributed.actors import fetch_learner_rows
from mrl_llm.worker import LLMPolicyWorker, NaNLossError, WorkerConfig
from shared_interfaces.exchange import InMemoryExchange
from shared_interfaces.regimes import parse_regime
from tests.llm.helpers import ShortAnswerVerifier, install_verifier, problems, tiny


def test_nan_step_is_skipped_then_training_stops(monkeypatch, caplog):
    install_verifier(monkeypatch, ShortAnswerVerifier(max_chars=3))
    pol = PolicyConfig(name="A", model_config=tiny("llama"), tokenizer_dir="utf8-bytes", group_size=4,
                       sampling=SamplingSection(max_new_tokens=6), train=TrainSection(lr=1e-2, micro_batch=4))
    w = LLMPolicyWorker("A", WorkerConfig(policy=pol, max_nan_steps=2), seed=0)
    ex = InMemoryExchange()
    probs = problems(2)
    inject = {"nan": False}
    real_forward = update_mod.forward_logprobs

    def forward(model, batch, temperature=1.0, **kw):  # a loss that overflows, as bf16 or a bad batch would
        logp, ent = real_forward(model, batch, temperature, **kw)
        return (logp * float("nan") if inject["nan"] else logp), ent

    monkeypatch.setattr(update_mod, "forward_logprobs", forward)

    def step(s: int, nan: bool) -> dict:
        ex.publish(w.generate(probs, s))
        rows, _ = fetch_learner_rows(ex, "A", parse_regime("grpo"), [p.prompt_id for p in probs], s, present=["A"])
        inject["nan"] = nan
        return w.train_step(rows)

    assert step(0, False)["nan_skipped"] == 0 and w.nan_streak == 0
    before = {k: v.clone() for k, v in w.model.state_dict().items()}
    opt_steps = w.counters["optimizer_steps"]
    with caplog.at_level(logging.WARNING, logger="mrl_llm.worker"):
        m = step(1, True)
    assert m["nan_skipped"] == 1 and w.nan_streak == 1 and w.version == 2
    assert "step skipped" in caplog.text
    assert all(torch.equal(before[k], v) for k, v in w.model.state_dict().items())
    assert w.counters["optimizer_steps"] == opt_steps and w.counters["nan_skipped_steps"] == 1
    assert step(2, False)["nan_skipped"] == 0 and w.nan_streak == 0  # recovers, the streak resets
    step(3, True)
    with pytest.raises(NaNLossError, match="2 consecutive steps had a non-finite loss"):
        step(4, True)
