"""The rank's engine part (:mod:`mrl_llm.rank.engine`) alone: the weight sync and its drift report, sampling,
and the engine options a policy builds — with a recording engine and plain torch modules."""

from __future__ import annotations

import pytest
import torch

import mrl_llm.rollout
from mrl_llm.byte_tokenizer import byte_tokenizer
from mrl_llm.config import PolicyConfig, SamplingSection
from mrl_llm.precision import Precision
from mrl_llm.rank.engine import RankEngine, make_rollout_engine
from mrl_llm.rank.seeds import derive_seed
from mrl_llm.rollout import DriftReport, HFEngine, Sample, SamplingConfig
from shared_interfaces.config_io import ConfigError
from tests.llm.helpers import tiny


class RecordingEngine:
    """Records what it is given; ``drift``: the report its next sync leaves in ``last_drift``."""

    def __init__(self, drift: DriftReport | None = None) -> None:
        self.drift, self.synced, self.calls, self.closed = drift, [], [], False

    def sync_weights(self, model: torch.nn.Module) -> None:
        self.synced.append((model, {k: v.clone() for k, v in model.state_dict().items()}))
        if self.drift is not None:
            self.last_drift = self.drift

    def generate(self, prompt_ids, n, sampling):
        self.calls.append((list(prompt_ids), n, sampling))
        return [[Sample((1,), (-0.5,), "stop", "x")] * n for _ in prompt_ids]

    def close(self) -> None:
        self.closed = True


def linear(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Linear(3, 2)


def part(engine, trained, rollout) -> RankEngine:
    return RankEngine(engine, trained=trained, rollout=rollout, precision=Precision("fp32"), device=torch.device("cpu"))


def test_sync_copies_the_trained_weights_into_the_rollout_copy_then_the_engine():
    trained, rollout, eng = linear(0), linear(1), RecordingEngine()
    part(eng, trained, rollout).sync()
    [(model, weights)] = eng.synced
    assert model is rollout and rollout is not trained
    for k, v in trained.state_dict().items():
        assert torch.equal(weights[k], v) and torch.equal(rollout.state_dict()[k], v)


def test_sync_releases_the_updates_cached_device_memory_before_the_engine_takes_the_weights(monkeypatch):
    log = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: log.append("empty_cache"))
    eng = RecordingEngine()
    eng.sync_weights = lambda model: log.append("sync_weights")
    part(eng, linear(0), linear(1)).sync()
    assert log == ["empty_cache", "sync_weights"]
    log.clear()
    part(None, linear(0), linear(1)).sync()  # a rank without an engine releases it too (a split trainer)
    assert log == ["empty_cache"]


def test_release_is_a_no_op_without_cuda():
    from mrl_llm.rollout.base import release_cached_device_memory

    release_cached_device_memory()  # the CPU build: nothing initialised, nothing to release, no error


def test_vllm_sleep_and_wake_release_torchs_cached_blocks_around_vllms(monkeypatch):
    from mrl_llm.rollout.vllm_engine import VLLMEngine

    log = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: log.append("empty_cache"))

    class FakeLLM:
        def sleep(self, level):
            log.append(f"sleep {level}")

        def wake_up(self, tags):
            log.append(f"wake_up {','.join(tags)}")

    eng = object.__new__(VLLMEngine)  # _sleep / _wake need only these
    eng._llm, eng.sleep_mode, eng._sleeping = FakeLLM(), True, set()
    eng._sleep()
    eng._wake(["weights"])
    eng._wake()
    eng._wake()  # awake: nothing to do
    assert log == ["sleep 1", "empty_cache", "empty_cache", "wake_up weights", "empty_cache", "wake_up kv_cache"]
    log.clear()
    eng.sleep_mode = False
    eng._sleep()  # no sleep mode (the CPU): neither sleeps nor releases
    assert log == []


def test_sync_of_a_group_of_one_hands_the_trained_model_itself():
    trained, eng = linear(0), RecordingEngine()
    before = {k: v.clone() for k, v in trained.state_dict().items()}
    part(eng, trained, trained).sync()
    assert eng.synced[0][0] is trained and all(torch.equal(before[k], v) for k, v in trained.state_dict().items())


def test_drift_metrics_report_the_engines_last_check_and_nothing_without_one():
    eng = RecordingEngine(DriftReport(mean_abs=0.01, max_abs=0.2, n_tokens=5, exceeded=True))
    p = part(eng, linear(0), linear(1))
    assert p.drift_metrics() == {}  # no sync yet: no check
    p.sync()
    assert p.drift_metrics() == {"drift_mean_abs": 0.01, "drift_max_abs": 0.2, "drift_exceeded": 1.0}
    assert part(RecordingEngine(), linear(0), linear(0)).drift_metrics() == {}


def test_sample_passes_prompts_through_and_times_them_also_when_there_are_none():
    eng = RecordingEngine()
    p = part(eng, linear(0), linear(0))
    sp = SamplingConfig(seed=3)
    out, seconds = p.sample([[1, 2], [3]], 2, sp)
    assert [len(o) for o in out] == [2, 2] and eng.calls == [([[1, 2], [3]], 2, sp)] and seconds >= 0
    assert p.sample([], 2, sp)[0] == []
    p.close()
    assert eng.closed


def policy(**kw) -> PolicyConfig:
    return PolicyConfig(name="a", model_config=tiny("llama"), tokenizer_dir="utf8-bytes", max_prompt_len=100,
                        sampling=SamplingSection(max_new_tokens=50, max_batch_size=7), **kw)


def test_an_hf_policy_samples_from_the_rollout_model_itself():
    from transformers import AutoConfig, AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**tiny("llama", vocab_size=260)))
    eng = make_rollout_engine(policy(), model, byte_tokenizer(), seed=1, max_positions=512, engine_args={})
    assert isinstance(eng, HFEngine) and eng.model is model and eng.max_batch_size == 7


def test_a_vllm_policy_gets_the_seed_budget_and_engine_args_within_the_models_positions(monkeypatch):
    seen = {}

    def fake(kind, **kw):
        seen.update(kind=kind, **kw)
        return "engine"

    monkeypatch.setattr(mrl_llm.rollout, "make_engine", fake)
    pol = policy(engine="vllm", engine_args={"enforce_eager": True})
    got = make_rollout_engine(pol, linear(0), byte_tokenizer(), seed=5, max_positions=120,
                              engine_args={"max_model_len": 4096, "enforce_eager": False, "swap_space": 1})
    assert got == "engine" and seen["kind"] == "vllm" and seen["dtype"] == "float32"
    assert seen["seed"] == derive_seed(5, "a", "engine") % 2**31
    assert seen["max_model_len"] == 120  # 100 + 50 tokens, capped at the model's 120 positions
    assert seen["engine_args"] == {"max_model_len": 120, "enforce_eager": True, "swap_space": 1}  # the policy's win
    assert seen["drift"].temperature == pol.sampling.temperature and "model" in seen  # a model_config policy


def test_a_vllm_policy_without_the_engine_says_how_to_install_it(monkeypatch):
    monkeypatch.delattr(mrl_llm.rollout, "make_engine")
    with pytest.raises(ConfigError, match="policy 'a': engine 'vllm' needs .* install the vllm extra or set engine: hf"):
        make_rollout_engine(policy(engine="vllm"), linear(0), byte_tokenizer(), seed=5, max_positions=120,
                            engine_args={})
