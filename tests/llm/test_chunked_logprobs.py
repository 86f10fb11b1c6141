"""Chunked log-probs (:func:`mrl_llm.logprobs.chunked_forward_logprobs`): the LM head over checkpointed chunks
of response positions gives the unchunked log-probs, gradients and entropy to 1e-6 (fp32)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from mrl_llm.batch import pad_rows, pad_tensors
from mrl_llm.logprobs import chunkable, forward_logprobs, pack, response_logprob_rows, response_logprobs
from tests.llm.helpers import tiny


def _model(model_type: str = "llama", *, ckpt: bool = False, vocab: int = 97):
    cfg = dict(tiny(model_type))
    cfg.pop("model_type")
    torch.manual_seed(0)
    m = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, vocab_size=vocab, **cfg)).float()
    if ckpt:
        m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return m.train()


def _batch(vocab: int = 97, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    lens = [(3, 9), (1, 1), (6, 0), (2, 17), (5, 4)]  # mixed prompt / response lengths, one empty response
    prompts = [torch.randint(1, vocab, (p,), generator=g).tolist() for p, _ in lens]
    responses = [torch.randint(1, vocab, (r,), generator=g).tolist() for _, r in lens]
    return pack(prompts, responses, pad_id=0)


def _run(model, packed, chunk):
    model.zero_grad(set_to_none=True)
    logp, ent = forward_logprobs(model, packed, 0.7, with_entropy=True, chunk_size=chunk)
    m = packed.response_mask
    w = torch.linspace(-1, 1, int(m.sum()))
    (logp[m] * w).sum().backward()
    grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    return logp[m].detach(), ent[m], grads


@pytest.mark.parametrize("model_type,ckpt", [("llama", False), ("qwen2", True)])
@pytest.mark.parametrize("chunk", [1, 5, 4096])
def test_chunked_equals_unchunked(model_type, ckpt, chunk):
    model, packed = _model(model_type, ckpt=ckpt), _batch()
    assert chunkable(model)
    lp0, ent0, g0 = _run(model, packed, None)
    lp1, ent1, g1 = _run(model, packed, chunk)
    torch.testing.assert_close(lp1, lp0, atol=1e-6, rtol=0)
    torch.testing.assert_close(ent1, ent0, atol=1e-6, rtol=1e-6)  # entropies ~4.5: 2 ulp
    torch.testing.assert_close(g1, g0, atol=1e-6, rtol=1e-5)
    assert lp0.numel() == 31


def test_chunked_zeroes_non_response_positions_and_handles_no_response_tokens():
    model = _model()
    packed = pack([[5, 6], [7]], [[], []], pad_id=0)
    logp, ent = forward_logprobs(model, packed, with_entropy=True, chunk_size=4)
    assert logp.shape == (2, 1) and not logp.any() and not ent.any()


def test_a_model_with_a_logit_transform_takes_the_unchunked_path():
    model = _model("llama")
    model.config.final_logit_softcapping = 30.0
    assert not chunkable(model)
    packed = _batch()
    a, _ = forward_logprobs(model, packed, chunk_size=3)
    b, _ = forward_logprobs(model, packed)
    assert torch.equal(a, b)
    with pytest.raises(ValueError, match="chunk_size must be >= 1"):
        from mrl_llm.logprobs import chunked_forward_logprobs

        chunked_forward_logprobs(_model(), packed, chunk_size=0)


def test_response_logprobs_by_groups_equals_by_rows():
    model = _model()
    prompts = [[3, 4], [5], [6, 7, 8]]
    responses = [[9, 10, 11], [12], [13, 14]]
    rows = response_logprobs(model, prompts, responses, pad_id=0, micro_batch=2)
    grouped = response_logprobs(model, prompts, responses, pad_id=0, groups=[[2, 0], [1]], chunk_size=2)
    for a, b in zip(rows, grouped, strict=True):
        assert a == pytest.approx(b, abs=1e-6)
    assert response_logprobs(model, [], [], pad_id=0) == []
    with pytest.raises(ValueError, match=r"groups leave rows \[1\] out"):
        response_logprobs(model, prompts, responses, pad_id=0, groups=[[0, 2]])


def test_response_logprob_rows_are_the_lists_as_tensors_and_pad_exactly():
    """The snapshot log-probs stay tensors (float32, one per row): the same numbers as the list form, and
    ``pad_tensors`` lays them out ``[rows, T]`` as ``pad_rows`` does the lists (cut at T, zeros after)."""
    model = _model()
    prompts, responses = [[3, 4], [5], [6, 7, 8]], [[9, 10, 11], [12], [13, 14]]
    rows = response_logprob_rows(model, prompts, responses, pad_id=0, micro_batch=2)
    lists = response_logprobs(model, prompts, responses, pad_id=0, micro_batch=2)
    assert [r.dtype for r in rows] == [torch.float32] * len(rows) and [r.tolist() for r in rows] == lists
    for T in (1, max(len(r) for r in responses) + 2):
        assert torch.equal(pad_tensors(rows, T), pad_rows(lists, T))
    assert pad_tensors([], 3).shape == (0, 3) and response_logprob_rows(model, [], [], pad_id=0) == []
    with pytest.raises(ValueError, match="every row needs one group"):
        response_logprob_rows(model, prompts, responses, pad_id=0, groups=[[0], [2]])


class _Ignores(torch.nn.Module):
    """A CausalLM wrapper whose ``forward(**kwargs)`` drops ``logits_to_keep`` silently (every position back)."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, **kwargs):
        kwargs.pop("logits_to_keep", None)
        return self.inner(**kwargs)


class _Refuses(_Ignores):
    """A CausalLM without the argument: a TypeError, as an old architecture's signature gives."""

    def forward(self, input_ids, attention_mask, use_cache):
        return self.inner(input_ids=input_ids, attention_mask=attention_mask, use_cache=use_cache)


def test_a_model_that_ignores_or_lacks_logits_to_keep_gives_the_same_logprobs():
    """Every prompt longer than one token, so the window starts past 0: a forward that ignored logits_to_keep
    returned every position, and they were read shifted by the window's start (no error)."""
    model = _model().eval()
    g = torch.Generator().manual_seed(3)
    packed = pack([torch.randint(1, 97, (n,), generator=g).tolist() for n in (4, 6)],
                  [torch.randint(1, 97, (n,), generator=g).tolist() for n in (5, 2)], pad_id=0)
    with torch.no_grad():
        want, _ = forward_logprobs(model, packed)
        for wrapped in (_Ignores(model), _Refuses(model)):
            got, _ = forward_logprobs(wrapped, packed)
            torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
    assert want[:, :3].eq(0).all() and want[packed.response_mask].lt(0).all()


def test_head_logprobs_of_no_rows_and_in_chunks():
    """:func:`mrl_llm.logprobs.head_logprobs`: no rows give empty tensors; chunks give what one pass gives."""
    import torch

    from mrl_llm.logprobs import head_logprobs

    head = torch.nn.Linear(4, 7, bias=False)
    lp, ent = head_logprobs(head, torch.zeros(0, 4), torch.zeros(0, dtype=torch.long), 1.0, with_entropy=True,
                            chunk_size=None)
    assert lp.shape == ent.shape == (0,)
    h, y = torch.randn(5, 4), torch.tensor([0, 3, 6, 1, 2])
    whole, none = head_logprobs(head, h, y, 0.7, with_entropy=False, chunk_size=None)
    parts, ent = head_logprobs(head, h, y, 0.7, with_entropy=True, chunk_size=2)
    assert none is None and ent.shape == (5,)
    torch.testing.assert_close(parts, whole)
    torch.testing.assert_close(whole, torch.log_softmax(head(h) / 0.7, -1).gather(-1, y[:, None]).squeeze(-1))
