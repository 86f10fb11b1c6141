"""Memory estimates: parameter counts against real HF models, and hand-computed byte counts."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from mrl_llm.distributed.memory import (
    KNOWN_SHAPES,
    ModelShape,
    PolicyFootprint,
    ShapeError,
    autocast_cache_bytes,
    backward_grad_bytes,
    checkpoint_host_bytes,
    known_shape,
    kv_bytes_per_sequence,
    layer_activation_bytes,
    optimizer_step_bytes,
    rollout_bytes,
    sampling_bytes_per_sequence,
    sync_copy_bytes,
    training_bytes,
)

TINY_CONFIGS = {
    "qwen2": dict(model_type="qwen2", hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, vocab_size=300, tie_word_embeddings=True),
    "llama": dict(model_type="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                  num_attention_heads=4, num_key_value_heads=4, vocab_size=257),
    "mistral": dict(model_type="mistral", hidden_size=48, intermediate_size=80, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=1, vocab_size=200),
    "qwen3": dict(model_type="qwen3", hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=32, vocab_size=300,
                  tie_word_embeddings=True),
    "gpt2": dict(model_type="gpt2", n_embd=48, n_layer=2, n_head=4, n_positions=64, vocab_size=211),
    "gemma3_text": dict(model_type="gemma3_text", hidden_size=48, intermediate_size=80, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=1, head_dim=32, vocab_size=200),
}


@pytest.mark.parametrize("family", sorted(TINY_CONFIGS))
def test_param_count_matches_a_real_hf_model(family: str) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = dict(TINY_CONFIGS[family])
    hf = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(hf)
    real = sum(p.numel() for p in model.parameters())
    est = ModelShape.from_hf_config(hf.to_dict()).n_params
    # Qwen3 adds per-head q/k RMSNorm weights (2 * head_dim per layer), which the shape ignores.
    slack = 2 * 32 * 2 if family == "qwen3" else 0
    assert real - slack <= est <= real
    if family != "qwen3":
        assert est == real


def test_shared_configs_give_the_published_sizes(shared_dir) -> None:
    sizes = {t: ModelShape.from_model_dir(shared_dir / "tokenizers" / t).n_params for t in ("llama2", "mistral", "gpt2")}
    # The model cards' parameter counts (exact counts of the released checkpoints).
    assert sizes == {"llama2": 6_738_415_616, "mistral": 7_241_732_096, "gpt2": 124_439_808}


def test_known_shapes_of_the_paper_pair() -> None:
    assert known_shape("/models/Qwen2.5-Math-1.5B/") is KNOWN_SHAPES["Qwen2.5-Math-1.5B"]
    assert 1.5e9 < KNOWN_SHAPES["Qwen2.5-Math-1.5B"].n_params < 1.6e9
    assert 1.65e9 < KNOWN_SHAPES["Qwen3-1.7B-Base"].n_params < 1.75e9


def test_known_shapes_of_the_real_cpu_pair() -> None:
    """The exact parameter counts of the prepared checkpoints (their safetensors), found by directory name."""
    assert known_shape("models/smollm2-135m-instruct").n_params == 134_515_008
    assert known_shape("models/gemma-3-270m/").n_params == 268_098_176
    assert known_shape("no-such-model") is None
    with pytest.raises(ShapeError, match="no config.json"):
        ModelShape.from_model_dir("/nonexistent/model")
    with pytest.raises(ShapeError, match="missing key 'vocab_size'"):
        ModelShape.from_hf_config({"num_attention_heads": 2, "num_hidden_layers": 1, "hidden_size": 8,
                                   "intermediate_size": 8})


def _tiny(**kw) -> PolicyFootprint:
    shape = ModelShape(n_layers=2, hidden_size=8, n_heads=2, n_kv_heads=1, intermediate_size=16, vocab_size=10)
    base = dict(name="t", shape=shape, dtype="bf16", prompt_len=3, max_response_len=5, micro_batch=2)
    return PolicyFootprint(**(base | kw))


def test_training_bytes_hand_computed() -> None:
    p = _tiny()
    n = p.n_params
    # 2 layers x (attn 8*8 + 2*8*4 + 8*8 = 192, mlp 3*8*16 = 384, norms 16) + embed 80 + head 80 + norm 8
    assert n == 2 * (192 + 384 + 16) + 80 + 80 + 8
    # one layer under mixed precision: s b (16h + e (5h + 2h_q + 2h_kv + 4I)) = 16 * (128 + 2 * (40 + 16 + 8 + 64))
    assert layer_activation_bytes(p) == 16 * (128 + 2 * 128)
    # in one precision: e s b (7h + 2h_q + 2h_kv + 4I) = 2 * 16 * (56 + 16 + 8 + 64)
    assert layer_activation_bytes(_tiny(master_weights=False)) == 2 * 16 * 144
    assert layer_activation_bytes(_tiny(dtype="fp32")) == 4 * 16 * 144
    logits = 2 * 16 * 10 + 8 * 16 * 10
    casts = 2 * (n - 80)  # every matmul's weight in bf16; the untied input embedding is looked up, not cast
    assert autocast_cache_bytes(p) == casts
    # the backward: one layer's activation gradients, and the head's weight gradient in bf16 and fp32 (V h = 80)
    head = (2 + 4) * 80
    assert backward_grad_bytes(p) == head and backward_grad_bytes(_tiny(dtype="fp32")) == 4 * 80
    m = training_bytes(p)
    # bf16 with master weights: fp32 weights and grads (the masters), fp32 AdamW moments
    assert (m.weights, m.gradients, m.optimizer) == (4 * n, 4 * n, 8 * n)
    assert m.activations == casts + 3 * 16 * 384 + logits + head
    pure = training_bytes(_tiny(master_weights=False))
    assert (pure.weights, pure.gradients, pure.optimizer) == (2 * n, 2 * n, 8 * n)
    assert pure.activations == 3 * 2 * 16 * 144 + logits + 2 * 80  # no autocast, no casts
    ck = training_bytes(_tiny(grad_checkpointing=True))
    # each layer keeps its input from the fp32 residual stream (4 B under autocast), one layer is recomputed
    assert ck.activations == casts + 2 * 4 * 16 * 8 + 2 * 16 * 384 + logits + head
    assert training_bytes(_tiny(grad_checkpointing=True, master_weights=False)).activations == (
        2 * 2 * 16 * 8 + 2 * 2 * 16 * 144 + logits + 2 * 80)
    fp32 = training_bytes(_tiny(dtype="fp32", optimizer="sgd"))
    assert (fp32.gradients, fp32.optimizer) == (4 * n, 0)
    sharded = training_bytes(_tiny(kl_coef=0.01), shards=4)
    # FSDP2 gathers bf16 units: nothing for autocast to cast
    assert sharded.activations == 3 * 16 * 384 + logits + head
    # fp32 master shard + the gathered layer and root unit (embed 80 + head 80 + norm 8) in bf16 + the bf16
    # reference copy's shard
    assert n - 2 * p.shape.layer_params == 80 + 80 + 8
    assert sharded.weights == 4 * n / 4 + 2 * (p.shape.layer_params + 168) + 2 * n / 4
    assert sharded.optimizer == 8 * n / 4
    whole = training_bytes(_tiny(kl_coef=0.01, fsdp_unit="model"), shards=4)  # the whole model is one FSDP unit
    assert whole.weights == 4 * n / 4 + 2 * n + 2 * n / 4
    assert training_bytes(_tiny(fsdp_unit="model")).weights == training_bytes(p).weights  # k = 1: nothing gathered
    # replicas: every rank holds the whole training state, the reference included
    assert training_bytes(_tiny(kl_coef=0.01, fsdp_unit="none"), shards=4) == training_bytes(_tiny(kl_coef=0.01))
    with pytest.raises(ValueError, match="fsdp_unit 'block' is not 'layer', 'model' or 'none'"):
        _tiny(fsdp_unit="block")
    # grad_sync mini_batch: every unit (the reference's too) stays gathered, the whole gradient accumulates in fp32
    kept = training_bytes(_tiny(kl_coef=0.01, grad_sync="mini_batch"), shards=4)
    assert kept.weights == 4 * n / 4 + 2 * n + 2 * n / 4 + 2 * n
    assert kept.gradients == 4 * n / 4 + 4 * n and kept.optimizer == sharded.optimizer
    assert training_bytes(_tiny(grad_sync="mini_batch")) == training_bytes(p)  # k = 1: nothing kept
    assert training_bytes(_tiny(fsdp_unit="none", grad_sync="mini_batch"), shards=4) == training_bytes(p)  # replicas
    with pytest.raises(ValueError, match="grad_sync 'step' is not 'micro_batch' or 'mini_batch'"):
        _tiny(grad_sync="step")


def test_logits_term_follows_the_chunk_and_the_token_budget() -> None:
    p = _tiny()
    base = training_bytes(p).activations
    chunked = training_bytes(_tiny(logprob_chunk=4)).activations
    # 16 positions of logits (2 B bf16 + 2 x 4 B fp32) -> 4 positions; the checkpointed LM head casts its weight
    # (V h = 80, 2 B) chunk by chunk, outside autocast's cache: not held into the backward
    lm_cast = 2 * 10 * 8
    assert base - chunked == (2 + 8) * (16 - 4) * 10 + lm_cast
    # a chunk above b s: the same logits, the LM head checkpointed all the same
    assert training_bytes(_tiny(logprob_chunk=1000)).activations == base - lm_cast
    assert training_bytes(_tiny(dtype="fp32", logprob_chunk=1000)).activations == training_bytes(_tiny(dtype="fp32")).activations
    budget = _tiny(max_tokens_per_micro_batch=8)
    assert budget.micro_tokens == 8 and layer_activation_bytes(budget) == 8 * 384


def test_kv_and_rollout_bytes() -> None:
    p = _tiny()
    assert kv_bytes_per_sequence(p) == 2 * 2 * 4 * 2 * 8
    r = rollout_bytes(p, 3, own_weights=True)
    assert r.kv_cache == 3 * kv_bytes_per_sequence(p)
    assert r.weights == 2 * p.n_params
    assert r.activations == 3 * 8 * 10  # vLLM: 2 x 4 V per sequence
    assert rollout_bytes(p, 3, own_weights=False).weights == 0
    assert rollout_bytes(p, 0, own_weights=False).total == 0  # nothing in flight, nothing held
    with pytest.raises(ValueError, match="micro_batch must be >= 1"):
        _tiny(micro_batch=0)


def test_hf_sampling_counts_the_last_position_logits_and_the_prefill() -> None:
    # the step's logits at the last position (e V), three fp32 [V] working tensors (12 V), and the prefill's
    # transients over the prompt: prompt_len (3 e I + 8 h)
    hf = _tiny(engine="hf")
    assert sampling_bytes_per_sequence(hf) == (2 + 12) * 10 + 3 * (3 * 2 * 16 + 8 * 8)
    assert sampling_bytes_per_sequence(_tiny(engine="hf", dtype="fp32")) == (4 + 12) * 10 + 3 * (3 * 4 * 16 + 64)
    assert rollout_bytes(hf, 4, own_weights=False).activations == 4 * sampling_bytes_per_sequence(hf)


def test_what_runs_beside_the_update_casts_sync_copy_step_and_checkpoint() -> None:
    p = _tiny()
    n = p.n_params
    tied = _tiny(shape=replace(p.shape, tie_embeddings=True))
    assert autocast_cache_bytes(tied) == 2 * tied.n_params  # the tied embedding is cast for the LM head
    assert autocast_cache_bytes(_tiny(dtype="fp32")) == autocast_cache_bytes(_tiny(master_weights=False)) == 0
    # the vLLM sync casts the whole fp32 state dict to the engine's bf16; an fp32 engine or the HF engine: none
    assert sync_copy_bytes(p) == 2 * n
    assert sync_copy_bytes(_tiny(dtype="fp32")) == sync_copy_bytes(_tiny(engine="hf")) == 0
    # AdamW's multi-tensor step: sqrt(v) for every parameter (of this rank's shard); SGD none
    assert optimizer_step_bytes(p) == 4 * n and optimizer_step_bytes(p, 4) == n
    assert optimizer_step_bytes(_tiny(optimizer="sgd")) == 0
    tiny_acts = _tiny(prompt_len=1, max_response_len=1, micro_batch=1, logprob_chunk=1, dtype="fp32")
    assert training_bytes(tiny_acts).activations == optimizer_step_bytes(tiny_acts)  # the step is the larger
    # a checkpoint of k > 1 FSDP ranks gathers AdamW's 8 N to rank 0; one rank, replicas or SGD: nothing
    assert checkpoint_host_bytes(p, 2) == 8 * n
    assert checkpoint_host_bytes(p, 1) == checkpoint_host_bytes(_tiny(fsdp_unit="none"), 4) == 0
    assert checkpoint_host_bytes(_tiny(optimizer="sgd"), 4) == 0


def test_the_root_unit_is_gathered_beside_a_layer_with_tied_and_untied_embeddings() -> None:
    # FSDP2's root unit (embeddings, final norm, LM head) stays gathered through the whole forward and backward
    for tied in (False, True):
        shape = ModelShape(n_layers=3, hidden_size=8, n_heads=2, n_kv_heads=1, intermediate_size=16, vocab_size=10,
                           tie_embeddings=tied)
        p = PolicyFootprint(name="t", shape=shape, dtype="bf16", prompt_len=3, max_response_len=5)
        root = (10 if tied else 20) * 8 + 8
        assert training_bytes(p, shards=2).weights == 4 * p.n_params / 2 + 2 * (shape.layer_params + root)


def test_bad_shapes_and_memory_constants_are_refused_with_what_to_fix() -> None:
    from mrl_llm.distributed.memory import MemoryModel

    cfg = dict(model_type="llama", hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
               vocab_size=100)
    with pytest.raises(ShapeError, match="sizes must be integers, got {'hidden_size': None}; fix them"):
        ModelShape.from_hf_config(cfg | {"hidden_size": None, "head_dim": None})  # head_dim: null is its default
    with pytest.raises(ShapeError, match="got {'num_hidden_layers': 'two'}"):
        ModelShape.from_hf_config(cfg | {"num_hidden_layers": "two"})
    with pytest.raises(ShapeError, match="head_dim must be >= 1, got 0.*give head_dim"):
        ModelShape.from_hf_config(cfg | {"num_attention_heads": 64})  # 32 // 64 = 0: no attention, no KV cache
    assert ModelShape.from_hf_config(cfg | {"num_attention_heads": 64, "head_dim": 8}).kv_width == 64 * 8
    for f in ("process_overhead_gib", "host_process_gib"):
        with pytest.raises(ValueError, match=f"{f} must be a finite number >= 0"):
            MemoryModel(**{f: -1.0})
        with pytest.raises(ValueError, match=f"{f} must be a finite number >= 0"):
            MemoryModel(**{f: float("nan")})
    assert MemoryModel(process_overhead_gib=0.0, host_process_gib=0.0).process_overhead_gib == 0.0
