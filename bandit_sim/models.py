"""Softmax policies for the bandit, stacked over ``[R, S, P]`` (regimes, seeds, policies).

* :class:`TabularModel`: one free logit per (context, arm), ``pi(a|c) = softmax(theta[c])_a``;
  ``grad_theta[c] log pi(a|c) = e_a - pi(.|c)`` — an update on one context never moves another.
* :class:`LogLinearModel`: ``z(c, a) = init_logits[c, a] + phi(c, a) . w`` with features ``phi [C, K, D]``
  shared by all contexts, ``w`` starting at 0 (so ``pi_0`` is the scenario's): learning on one prompt
  moves every other prompt whose features overlap.

Both expose, for a list of regimes ``regs``, the logits of a batch of contexts ``ctx [S, B]`` as
``[len(regs), S, B, P, K]``, per regime r all logits ``[S, P, C, K]``, and :meth:`apply` of the loss
gradient with respect to the batch logits (chain rule onto the parameters, then an SGD or Adam step).
Contexts in a batch are distinct (sampled without replacement), so the tabular scatter is exact.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


class _Optimizer:
    """SGD, or Adam (bias-corrected, elementwise, hence identical to one Adam per stacked model)."""

    def __init__(self, params: torch.Tensor, kind: str, lr: float, betas=(0.9, 0.999), eps: float = 1e-8):
        if kind not in ("sgd", "adam"):
            raise ValueError(f"unknown optimizer {kind!r}; use sgd or adam")
        self.kind, self.lr, self.betas, self.eps = kind, lr, betas, eps
        self.t = 0
        if kind == "adam":
            self.m = torch.zeros_like(params)
            self.v = torch.zeros_like(params)

    def step(self, params: torch.Tensor, grad: torch.Tensor) -> None:
        if self.kind == "sgd":
            params.sub_(self.lr * grad)
            return
        self.t += 1
        b1, b2 = self.betas
        self.m.mul_(b1).add_(grad, alpha=1 - b1)
        self.v.mul_(b2).addcmul_(grad, grad, value=1 - b2)
        denom = (self.v / (1 - b2**self.t)).sqrt_().add_(self.eps)
        params.addcdiv_(self.m, denom, value=-self.lr / (1 - b1**self.t))


class TabularModel:
    """Logits stored ``[R, S, C, P, K]``: regime-major, and a seed's batch of contexts is a row gather (every
    regime's batch rows in one gather)."""

    def __init__(self, init_logits: torch.Tensor, R: int, S: int, optimizer: str, lr: float):
        P, C, K = init_logits.shape
        self.shape = (R, S, P, C, K)
        self.theta = init_logits.permute(1, 0, 2)[None, None].expand(R, S, C, P, K).contiguous()
        self.opts = [_Optimizer(self._flat(r), optimizer, lr) for r in range(R)]
        self.sparse = optimizer == "sgd"
        self.lr = lr

    def _flat(self, r: int) -> torch.Tensor:
        R, S, P, C, K = self.shape
        return self.theta[r].view(S * C, P * K)

    def _rows(self, regs: Sequence[int], ctx: torch.Tensor) -> torch.Tensor:
        """Row ``((r * S + s) * C + ctx[s, b])`` of ``theta`` viewed ``[R * S * C, P * K]``, for each regime in
        ``regs`` and ``(s, b)``, flat in ``(r, s, b)`` order."""
        R, S, P, C, K = self.shape
        base = torch.as_tensor(list(regs)).view(-1, 1, 1) * S + torch.arange(S).view(1, S, 1)
        return (base * C + ctx.unsqueeze(0)).reshape(-1)

    def batch_logits(self, regs: Sequence[int], ctx: torch.Tensor) -> torch.Tensor:
        """The logits of the batch ``ctx [S, B]`` for regimes ``regs``: ``[len(regs), S, B, P, K]``."""
        R, S, P, C, K = self.shape
        flat = self.theta.view(R * S * C, P * K)
        return flat.index_select(0, self._rows(regs, ctx)).view(len(regs), S, -1, P, K)

    def logits(self, r: int) -> torch.Tensor:
        """Regime ``r``'s logits of every context, ``[S, P, C, K]``."""
        return self.theta[r].transpose(1, 2)

    def all_logits(self) -> torch.Tensor:
        return self.theta.permute(0, 1, 3, 2, 4)

    def grad_norm(self, ctx: torch.Tensor, grad_z: torch.Tensor, consume: bool = False) -> torch.Tensor:
        """``||dL/dtheta||`` per ``[..., S, P]``: the batch rows' gradient is ``dL/dz [..., S, B, P, K]`` itself
        (``consume``: ``grad_z`` is no longer needed and is squared in place)."""
        return (grad_z.square_() if consume else grad_z.square()).sum(dim=(-3, -1)).sqrt()

    def apply(self, regs: Sequence[int], ctx: torch.Tensor, grad_z: torch.Tensor,
              z: torch.Tensor | None = None) -> None:
        """Step on ``dL/dz [len(regs), S, B, P, K]`` of the batch logits (the gradient of the batch rows).
        ``z``: the batch logits as :meth:`batch_logits` returned them, if at hand (SGD steps them in place
        instead of gathering the rows again)."""
        R, S, P, C, K = self.shape
        if self.sparse:  # SGD touches only the batch's rows, distinct per (regime, seed): gather, step, scatter
            flat, rows = self.theta.view(R * S * C, P * K), self._rows(regs, ctx)
            z = flat.index_select(0, rows) if z is None else z.view(-1, P * K)
            z.add_(grad_z.reshape(-1, P * K), alpha=-self.lr)
            flat.numpy()[rows.numpy()] = z.numpy()  # a row copy (numpy's is faster than index_copy_)
            return
        rows = self._rows([0], ctx)  # regime 0's rows = row (s * C + ctx) of one regime's [S * C, P * K]
        for k, r in enumerate(regs):
            flat = self._flat(r)
            self.opts[r].step(flat, torch.zeros_like(flat).index_copy_(0, rows, grad_z[k].reshape(-1, P * K)))


class LogLinearModel:
    def __init__(self, init_logits: torch.Tensor, features: torch.Tensor, R: int, S: int, optimizer: str, lr: float):
        P, C, K = init_logits.shape
        if features.shape[:2] != (C, K):
            raise ValueError(f"features {tuple(features.shape)} do not match the scenario's [C, K] = [{C}, {K}]")
        self.init = init_logits
        self.phi = features
        self.w = torch.zeros(R, S, P, features.shape[-1], dtype=init_logits.dtype)
        self.opts = [_Optimizer(self.w[r], optimizer, lr) for r in range(R)]

    def batch_logits(self, regs: Sequence[int], ctx: torch.Tensor) -> torch.Tensor:
        base = self.init[:, ctx].permute(1, 2, 0, 3)  # [S, B, P, K]
        phi = self.phi[ctx]
        return torch.stack([base + torch.einsum("sbkd,spd->sbpk", phi, self.w[r]) for r in regs])

    def logits(self, r: int) -> torch.Tensor:
        return self.init[None] + torch.einsum("ckd,spd->spck", self.phi, self.w[r])

    def all_logits(self) -> torch.Tensor:
        return torch.stack([self.logits(r) for r in range(self.w.shape[0])])

    def grad_norm(self, ctx: torch.Tensor, grad_z: torch.Tensor, consume: bool = False) -> torch.Tensor:
        return torch.einsum("...sbpk,sbkd->...spd", grad_z, self.phi[ctx]).square().sum(dim=-1).sqrt()

    def apply(self, regs: Sequence[int], ctx: torch.Tensor, grad_z: torch.Tensor,
              z: torch.Tensor | None = None) -> None:
        """Chain rule ``dL/dw = sum_{b,k} dL/dz[b, k] phi[ctx_b, k]``, then the optimizer step."""
        phi = self.phi[ctx]
        for k, r in enumerate(regs):
            self.opts[r].step(self.w[r], torch.einsum("sbpk,sbkd->spd", grad_z[k], phi))


def make_model(kind: str, init_logits: torch.Tensor, R: int, S: int, optimizer: str, lr: float,
               features: torch.Tensor | None = None):
    if kind == "tabular":
        return TabularModel(init_logits, R, S, optimizer, lr)
    if kind == "loglinear":
        if features is None:
            raise ValueError("the log-linear model needs features [C, K, D]")
        return LogLinearModel(init_logits, features, R, S, optimizer, lr)
    raise ValueError(f"unknown model {kind!r}; use tabular or loglinear")
