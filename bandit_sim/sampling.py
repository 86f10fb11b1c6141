"""Inverse-CDF sampling of many small categoricals, and the log-softmax backward the engine chains through.

:func:`inverse_cdf`: for each row of log-probs ``logp [..., K]`` and uniforms ``u [..., G]`` in (0, 1],
``a_g = min(#{k : cdf_k <= x_g}, K - 1)`` with ``cdf = cumsum(exp(logp))`` and
``x_g = min(u_g * cdf_K, the largest float below cdf_K)`` — the arm whose CDF interval holds ``x_g``; an
arm whose probability is below the dtype's resolution (2^-24 of the total in float32) is never drawn.
The count is found by a branch-free binary search over the K entries (``log2 K`` gathers of one entry
per sample, instead of a per-sample search kernel); it is exactly ``torch.searchsorted(cdf, x,
right=True)`` for any non-decreasing ``cdf``, which a cumulative sum of non-negative terms is.

:func:`log_softmax_backward`: ``dL/dz = g - exp(logp) * sum_k g`` for ``logp = log_softmax(z)``, by the
same kernel autograd uses (so the engine's hand-chained gradient equals autograd's bit for bit).
"""

from __future__ import annotations

import torch


def _steps(K: int) -> list[int]:
    """Powers of two from the largest one <= K - 1 down to 1 (the bits of a count in [0, K - 1])."""
    steps, s = [], 1
    while 2 * s <= K - 1:
        s *= 2
    while K > 1 and s >= 1:
        steps.append(s)
        s //= 2
    return steps


_INT = {torch.float32: torch.int32, torch.float64: torch.int64}


def float_below(t: torch.Tensor) -> torch.Tensor:
    """``nextafter(t, 0)`` for ``t > 0`` (a CDF's total, >= exp(0) of its largest term): the float one unit
    in the last place below, by decrementing the bit pattern — exact there, and far cheaper than
    ``torch.nextafter`` (a scalar loop). Other dtypes, or any ``t <= 0``, go through ``torch.nextafter``."""
    if t.dtype not in _INT or not bool((t > 0).all()):
        return torch.nextafter(t, torch.zeros_like(t))
    return (t.view(_INT[t.dtype]) - 1).view(t.dtype)


def inverse_cdf(logp: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Sample arms: ``logp [..., K]`` (log-probs, possibly unnormalised by float rounding), ``u [..., G]``
    in (0, 1] broadcastable against ``logp``'s leading dims -> ``actions [..., G]`` (int64).

    Binary search: ``count`` collects the bits of ``#{k : cdf_k <= x}``, high to low; bit ``s`` is set
    when ``cdf[count + s - 1] <= x`` (the first probe, ``count = 0``, is a slice, not a gather). Since
    ``cdf_K > x`` by the choice of ``x``, the count is at most ``K - 1``, so a probe past ``K - 1``
    would never set a bit: it is clamped to ``K - 1`` (it cannot happen when K is a power of two)."""
    K = logp.shape[-1]
    cdf = logp.exp().cumsum_(dim=-1)
    total = cdf[..., -1:]
    x = torch.minimum(u * total, float_below(total))
    steps = _steps(K)
    if not steps:
        return torch.zeros(x.shape, dtype=torch.int64)
    count = (cdf[..., steps[0] - 1 : steps[0]] <= x).long().mul_(steps[0])
    clamp = K & (K - 1) != 0
    for s in steps[1:]:
        probe = count + (s - 1)
        if clamp:
            probe.clamp_(max=K - 1)
        count.add_((cdf.gather(-1, probe) <= x).long(), alpha=s)
    return count


def log_softmax_backward(grad: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
    """``dL/dz`` from ``dL/dlogp = grad`` and ``logp = log_softmax(z, dim=-1)``: ``grad - exp(logp) *
    grad.sum(-1)``, computed by autograd's own kernel for ``log_softmax``."""
    return torch.ops.aten._log_softmax_backward_data(grad, logp, -1, logp.dtype)
