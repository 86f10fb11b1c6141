"""Inverse-CDF sampling by binary search = ``torch.searchsorted`` on the CDF; the log-softmax backward =
autograd's."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from bandit_sim.sampling import float_below, inverse_cdf, log_softmax_backward


def _reference(logp: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    cdf = logp.exp().cumsum(dim=-1)
    total = cdf[..., -1:]
    x = torch.minimum(u * total, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, x, right=True).clamp_(max=logp.shape[-1] - 1)


@settings(max_examples=150, deadline=None)
@given(K=st.integers(1, 40), G=st.integers(1, 9), scale=st.sampled_from([0.1, 3.0, 30.0]),
       dtype=st.sampled_from([torch.float32, torch.float64]), seed=st.integers(0, 2**31 - 1))
def test_binary_search_equals_searchsorted(K, G, scale, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    z = torch.randn(3, 5, 2, K, generator=gen, dtype=dtype) * scale
    z[0, 0, 0] = -1e4  # probabilities far below the dtype's resolution but one
    z[0, 0, 0, K // 2] = 0.0
    logp = torch.log_softmax(z, dim=-1)
    u = 1.0 - torch.rand(5, 2, G, generator=gen, dtype=dtype)  # (0, 1], broadcast over the leading 3
    u[0, 0, 0] = 1.0
    u[0, 0, -1] = 2.0**-24
    a = inverse_cdf(logp, u)
    assert a.dtype == torch.int64 and a.shape == (3, 5, 2, G)
    assert torch.equal(a, _reference(logp, u))
    assert (a >= 0).all() and (a < K).all()


def test_samples_follow_the_probabilities():
    p = torch.tensor([0.1, 0.0, 0.6, 0.3])
    u = 1.0 - torch.rand(200_000, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    a = inverse_cdf(p.double().log().expand(1, 4), u.view(1, -1))
    freq = torch.bincount(a.view(-1), minlength=4).double() / u.numel()
    assert freq[1] == 0
    assert torch.allclose(freq, p.double(), atol=4e-3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_log_softmax_backward_is_autograds(dtype):
    z = torch.randn(4, 3, 7, dtype=dtype, requires_grad=True)
    logp = torch.log_softmax(z, dim=-1)
    g = torch.randn_like(logp)
    logp.backward(g)
    assert torch.equal(log_softmax_backward(g, logp.detach()), z.grad)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_float_below_is_nextafter_towards_zero(dtype):
    info = torch.finfo(dtype)
    t = torch.cat([torch.rand(1000, dtype=dtype) * 4 + 1e-3, torch.tensor([1.0, info.tiny, info.max, 2.0**-149 if dtype
                   == torch.float32 else 5e-324, math.inf], dtype=dtype)])
    assert torch.equal(float_below(t), torch.nextafter(t, torch.zeros_like(t)))
    with_zero = torch.tensor([0.0, 1.0], dtype=dtype)  # not all positive: the library call
    assert torch.equal(float_below(with_zero), torch.nextafter(with_zero, torch.zeros_like(with_zero)))
