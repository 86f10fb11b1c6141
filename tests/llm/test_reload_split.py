"""A split policy's HF rollout actor runs the reload check (issue 38 item 5, :mod:`mrl_llm.rollout.drift`) against
the trainers' probe log-probs, which travel with the weights (:meth:`~mrl_llm.distributed.actors.PolicyActor.weights`;
over the weight bus as its extra values, ``tests/llm/test_weight_bus.py``): a bf16 policy, one AdamW update at lr
1e-6 on the trainer's fp32 masters, then a load that takes effect passes and one that does nothing is caught at
that load. In one process, no Ray."""

from __future__ import annotations

import pytest
import torch

from mrl_llm.config import DriftSection, PolicyConfig, SamplingSection, TrainSection
from mrl_llm.distributed.actors import PolicyActor, PolicyActorSpec
from mrl_llm.rollout import DriftError
from mrl_llm.worker import WorkerConfig
from shared_interfaces.config_io import to_mapping
from shared_interfaces.exchange import InMemoryExchange
from shared_interfaces.regimes.config import LossConfig
from tests.llm.helpers import tiny


def _actor(tmp_path, role: str, engine: str = "hf") -> PolicyActor:
    pol = PolicyConfig(name="A", model_config=tiny("llama"), tokenizer_dir="utf8-bytes", group_size=2, device="cpu",
                       dtype="bf16", engine=engine, sampling=SamplingSection(max_new_tokens=4), drift=DriftSection(on_exceed="stop"),
                       train=TrainSection(lr=1e-6, weight_decay=0.0))
    cfg = WorkerConfig(policy=pol, loss=LossConfig(kl_coef=0.0), rollout_engine=role != "train")
    spec = PolicyActorSpec(name="A", factory="mrl_llm.worker:build", config=to_mapping(cfg), seed=0,
                           regime={"name": "grpo"}, checkpoint_dir=str(tmp_path / role), role=role)
    return PolicyActor(spec, InMemoryExchange())


def _update(trainer: PolicyActor) -> None:
    """One AdamW step of the trainer's masters (lr 1e-6), then its weight sync (its probe log-probs move on)."""
    w = trainer.worker
    ids = torch.randint(3, 200, (4, 12), generator=torch.Generator().manual_seed(1))
    with w.precision.autocast("cpu"):
        loss = w.model(input_ids=ids, labels=ids).loss
    loss.backward()
    w.optimizer.step()
    w.optimizer.zero_grad(set_to_none=True)
    w.version += 1
    w.sync_engine()


def test_a_split_rollout_actor_checks_the_load_against_the_trainers(tmp_path, monkeypatch):
    trainer, rollout = _actor(tmp_path, "train"), _actor(tmp_path, "rollout")
    _update(trainer)
    payload = trainer.weights()
    old, new = payload["reference"]
    assert old != new  # the update moved the trainers' probe log-probs
    m = rollout.load_weights(payload)["metrics"]
    assert m["drift_reload_exceeded"] == 0.0 and m["drift_reload_err"] < 1e-6 < m["drift_reload_move"]

    _update(trainer)
    import mrl_llm.parallel.fsdp as fsdp

    monkeypatch.setattr(fsdp, "load_full_state_dict", lambda model, state: None)  # the load does nothing
    with pytest.raises(DriftError, match="this rollout actor's HFEngine did not take weight sync v2"):
        rollout.load_weights(trainer.weights())


def test_the_trainers_send_in_the_rollout_engines_dtype(tmp_path):
    """Issue 38 item 6: a bf16 vLLM policy's trainers send bf16 (the masters cast), an HF policy's the fp32 masters
    (its rollout actors sample from fp32 weights under autocast). A trainer builds no engine, so no vLLM here."""
    for engine, dtype in (("vllm", torch.bfloat16), ("hf", torch.float32)):
        trainer = _actor(tmp_path / engine, "train", engine=engine)
        _update(trainer)
        state = trainer.weights()["state"]
        masters = trainer.worker.model.state_dict()
        assert state.keys() == masters.keys()
        for k, v in masters.items():
            assert state[k].dtype == dtype and torch.equal(state[k], v.detach().to(dtype)), (engine, k)
