"""Softmax policies for the bandit, stacked over ``[R, S, P]`` (regimes, seeds, policies).

* :class:`TabularModel`: one free logit per (context, arm), ``pi(a|c) = softmax(theta[c])_a``;
  ``grad_theta[c] log pi(a|c) = e_a - pi(.|c)`` — an update on one context never moves another.
* :class:`LogLinearModel`: ``z(c, a) = init_logits[c, a] + phi(c, a) . w`` with features ``phi [C, K, D]``
  shared by all contexts, ``w`` starting at 0 (so ``pi_0`` is the scenario's): learning on one prompt
  moves every other prompt whose features overlap.

Both expose the logits of a batch of contexts ``ctx [S, B]`` as ``[R, S, P, B, K]``, all logits
``[R, S, P, C, K]``, and :meth:`apply` of the loss gradient with respect to the batch logits (chain rule
onto the parameters, then an SGD or Adam step). Contexts in a batch are distinct (sampled without
replacement), so the tabular scatter is exact.
"""

from __future__ import annotations

import math

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
    """Logits stored ``[S, C, R, P, K]`` so that a seed's batch of contexts is a row gather."""

    def __init__(self, init_logits: torch.Tensor, R: int, S: int, optimizer: str, lr: float):
        P, C, K = init_logits.shape
        self.shape = (R, S, P, C, K)
        self.theta = init_logits.permute(1, 0, 2)[None, :, None].expand(S, C, R, P, K).contiguous()
        self.flat = self.theta.view(S * C, R * P * K)
        self.opt = _Optimizer(self.flat, optimizer, lr)
        self.sparse = optimizer == "sgd"

    def _rows(self, ctx: torch.Tensor) -> torch.Tensor:
        S, B = ctx.shape
        return (ctx + torch.arange(S).unsqueeze(1) * self.shape[3]).reshape(S * B)

    def batch_logits(self, ctx: torch.Tensor) -> torch.Tensor:
        R, S, P, C, K = self.shape
        z = self.flat.index_select(0, self._rows(ctx)).view(S, -1, R, P, K)
        return z.permute(2, 0, 3, 1, 4).contiguous()

    def all_logits(self) -> torch.Tensor:
        return self.theta.permute(2, 0, 3, 1, 4)

    def apply(self, ctx: torch.Tensor, grad_z: torch.Tensor) -> torch.Tensor:
        """Step on ``dL/dz`` of the batch logits; returns the gradient norm per ``[R, S, P]``."""
        norm = grad_z.square().sum(dim=(-2, -1)).sqrt()
        R, S, P, C, K = self.shape
        g = grad_z.permute(1, 3, 0, 2, 4).reshape(-1, R * P * K)
        if self.sparse:  # SGD touches only the batch's rows (distinct contexts per seed)
            self.flat.index_add_(0, self._rows(ctx), g, alpha=-self.opt.lr)
        else:
            dense = torch.zeros_like(self.flat).index_copy_(0, self._rows(ctx), g)
            self.opt.step(self.flat, dense)
        return norm


class LogLinearModel:
    def __init__(self, init_logits: torch.Tensor, features: torch.Tensor, R: int, S: int, optimizer: str, lr: float):
        P, C, K = init_logits.shape
        if features.shape[:2] != (C, K):
            raise ValueError(f"features {tuple(features.shape)} do not match the scenario's [C, K] = [{C}, {K}]")
        self.init = init_logits
        self.phi = features
        self.w = torch.zeros(R, S, P, features.shape[-1], dtype=init_logits.dtype)
        self.opt = _Optimizer(self.w, optimizer, lr)

    def _batch_parts(self, ctx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        base = self.init[:, ctx].permute(1, 0, 2, 3)  # [S, P, B, K]
        return base, self.phi[ctx]  # [S, B, K, D]

    def batch_logits(self, ctx: torch.Tensor) -> torch.Tensor:
        base, phi = self._batch_parts(ctx)
        return base[None] + torch.einsum("sbkd,rspd->rspbk", phi, self.w)

    def all_logits(self) -> torch.Tensor:
        return self.init[None, None] + torch.einsum("ckd,rspd->rspck", self.phi, self.w)

    def apply(self, ctx: torch.Tensor, grad_z: torch.Tensor) -> torch.Tensor:
        grad_w = torch.einsum("rspbk,sbkd->rspd", grad_z, self.phi[ctx])
        self.opt.step(self.w, grad_w)
        return grad_w.square().sum(dim=-1).sqrt()


def make_model(kind: str, init_logits: torch.Tensor, R: int, S: int, optimizer: str, lr: float,
               features: torch.Tensor | None = None):
    if kind == "tabular":
        return TabularModel(init_logits, R, S, optimizer, lr)
    if kind == "loglinear":
        if features is None:
            raise ValueError("the log-linear model needs features [C, K, D]")
        return LogLinearModel(init_logits, features, R, S, optimizer, lr)
    raise ValueError(f"unknown model {kind!r}; use tabular or loglinear")


def param_count(model) -> int:
    t = model.theta if isinstance(model, TabularModel) else model.w
    return math.prod(t.shape)
