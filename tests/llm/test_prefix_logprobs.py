"""Shared-prefix log-probs (:mod:`mrl_llm.prefix_logprobs`) against the plain pass: the same log-probs, entropies,
loss and gradients (fp32, 1e-5), for Llama and Gemma-3 (sliding-window layers) shapes, prompts of mixed lengths
shared by several rows, responses of mixed lengths (one token, empty), with and without chunking."""

from __future__ import annotations

import pytest
import torch

from mrl_llm.logprobs import chunked_forward_logprobs, forward_logprobs, pack
from mrl_llm.prefix_logprobs import shareable, shared_prefix_logprobs


def _llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                        tie_word_embeddings=True))


def _gemma3():
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(0)
    return Gemma3ForCausalLM(Gemma3TextConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                                              num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                                              max_position_embeddings=64, sliding_window=5,
                                              layer_types=["sliding_attention", "sliding_attention",
                                                           "full_attention"]))


MODELS = {"llama": _llama, "gemma3": _gemma3}
P1, P2, P3 = [2, 5, 6, 7, 8, 9, 10, 11], [2, 12, 13], [2, 14, 15, 16, 17]
PROMPTS = [P1, P1, P1, P2, P2, P3, P1]
RESPONSES = [[20, 21, 22, 23], [20, 24], [30], [31, 32, 33, 34, 35, 36], [37, 38, 39], [40, 41], []]


def _loss(logp, batch):
    w = torch.linspace(-1.0, 1.0, logp.numel()).reshape(logp.shape)  # a weight per position: gradients differ
    return (logp * w * batch.response_mask).sum()


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("chunk", [None, 3])
def test_shared_prefix_equals_the_plain_pass_in_values_and_gradients(name, chunk):
    model = MODELS[name]()
    model.train()
    batch = pack(PROMPTS, RESPONSES, pad_id=0)
    want, want_ent = chunked_forward_logprobs(model, batch, 0.7, with_entropy=True, chunk_size=1024)
    _loss(want, batch).backward()
    want_g = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    got, got_ent = shared_prefix_logprobs(model, batch, 0.7, with_entropy=True, chunk_size=chunk)
    _loss(got, batch).backward()
    m = batch.response_mask
    torch.testing.assert_close(got[m], want[m], atol=1e-5, rtol=0)
    torch.testing.assert_close(got_ent[m], want_ent[m], atol=1e-5, rtol=0)
    assert not got[~m].any()
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, want_g[n], atol=1e-5, rtol=1e-4, msg=lambda s, n=n: f"{n}: {s}")


def test_forward_logprobs_takes_the_shared_path_when_asked_and_allowed():
    model = _llama().eval()
    batch = pack(PROMPTS, RESPONSES, pad_id=0)
    seen = []
    h = model.model.register_forward_pre_hook(lambda _m, _a, kw: seen.append(kw["input_ids"].shape), with_kwargs=True)
    with torch.no_grad():
        plain, _ = forward_logprobs(model, batch, chunk_size=1024)
        n_plain = len(seen)
        shared, _ = forward_logprobs(model, batch, chunk_size=1024, share_prefix=True)
    h.remove()
    assert seen[:n_plain] == [batch.input_ids.shape]
    assert seen[n_plain:] == [torch.Size([3, len(P1)]), torch.Size([len(PROMPTS), 5])]  # 3 prompts, then responses
    torch.testing.assert_close(shared[batch.response_mask], plain[batch.response_mask], atol=1e-5, rtol=0)
    model.gradient_checkpointing_enable()
    assert not shareable(model)  # a checkpointed layer keeps no cache: the plain pass


def test_one_token_responses_and_the_empty_cases():
    model = _llama().eval()
    with torch.no_grad():
        batch = pack([P1, P1, P2], [[3], [4], [5]], pad_id=0)  # no response pass at all
        got, _ = shared_prefix_logprobs(model, batch)
        want, _ = chunked_forward_logprobs(model, batch)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
        empty = pack([P1, P2], [[], []], pad_id=0)
        lp, ent = shared_prefix_logprobs(model, empty, with_entropy=True)
        assert lp.shape == ent.shape == (2, empty.input_ids.shape[1] - 1) and not lp.any()
        none = pack([], [], pad_id=0)
        assert shared_prefix_logprobs(model, none)[0].shape == (0, 1)
    with pytest.raises(ValueError, match="chunk_size must be >= 1"):
        shared_prefix_logprobs(model, batch, chunk_size=0)


@pytest.mark.parametrize("grad_accum", [None, 2])
def test_the_update_with_shared_prefixes_equals_the_plain_update(monkeypatch, grad_accum):
    """``run_update(share_prefix=True)`` on a worker's step batch (4 prompts x 8 samples, responses cut to 0-8
    tokens, a reference model): the same gradients of every mini-batch (grad_accum 2: with the snapshot pass) and
    the same loss and KL as the plain update."""
    from mrl_llm.update import run_update
    from tests.llm.test_micro_batches import _mixed_batch
    from tests.llm.test_precision import GradCapture, _worker

    w = _worker(monkeypatch, dtype="fp32", kl=0.05)
    batch = _mixed_batch(w)
    assert len({tuple(p) for p in batch.prompts}) < len(batch)  # prompts shared by rows
    import mrl_llm.prefix_logprobs as pl

    calls = []
    shared = pl.shared_prefix_logprobs
    monkeypatch.setattr(pl, "shared_prefix_logprobs", lambda *a, **kw: calls.append(1) or shared(*a, **kw))
    grads, metrics = [], []
    for share in (False, True):
        assert len(calls) == 0 or share
        opt = GradCapture(w.model.parameters())
        res = run_update(w.model, opt, batch, loss_cfg=w.cfg.loss, temperature=1.0, micro_batch=8,
                         grad_accum=grad_accum, grad_clip=None, pad_id=w.pad_id, ref_model=w.ref_model,
                         share_prefix=share)
        grads.append(torch.stack(opt.grads))
        metrics.append(res.metrics)
    assert len(calls) >= 2 * -(-len(batch) // 8)  # the policy's and the reference's passes took the shared path
    torch.testing.assert_close(grads[1], grads[0], atol=1e-6, rtol=1e-4)
    for k in ("loss", "kl_to_ref", "entropy", "logprob_drift_max"):
        assert metrics[1][k] == pytest.approx(metrics[0][k], abs=1e-5), k


@pytest.mark.parametrize("share", [False, True])
def test_the_worker_trains_with_shared_prefixes_when_the_config_says_so(monkeypatch, share):
    """``train.share_prefix`` reaches the update: the worker's step takes the shared path exactly when it is set."""
    import mrl_llm.prefix_logprobs as pl
    from mrl_llm.config import PolicyConfig, SamplingSection, TrainSection
    from mrl_llm.worker import LLMPolicyWorker, WorkerConfig
    from shared_interfaces.exchange import InMemoryExchange
    from shared_interfaces.regimes.config import LossConfig
    from tests.llm.helpers import install_verifier, tiny
    from tests.llm.test_precision import ParityVerifier, _rows

    install_verifier(monkeypatch, ParityVerifier())
    pol = PolicyConfig(name="A", model_config=tiny("llama"), tokenizer_dir="utf8-bytes", group_size=8, device="cpu",
                       sampling=SamplingSection(max_new_tokens=4),
                       train=TrainSection(micro_batch=8, share_prefix=share))
    w = LLMPolicyWorker("A", WorkerConfig(policy=pol, loss=LossConfig(kl_coef=0.0), track_ref_kl=False), seed=0)
    calls = []
    shared = pl.shared_prefix_logprobs
    monkeypatch.setattr(pl, "shared_prefix_logprobs", lambda *a, **kw: calls.append(1) or shared(*a, **kw))
    m = w.train_step(_rows(w, InMemoryExchange(), 0))
    assert (len(calls) > 0) == share and m["nan_skipped"] == 0.0
