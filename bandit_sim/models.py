"""Softmax policies for the bandit, stacked over ``[R, S, P]`` (regimes, seeds, policies).

* :class:`TabularModel`: one free logit per (context, arm), ``pi(a|c) = softmax(theta[c])_a``;
  ``grad_theta[c] log pi(a|c) = e_a - pi(.|c)`` — an update on one context never moves another.
* :class:`LogLinearModel`: ``z(c, a) = init_logits[c, a] + phi(c, a) . w`` with features ``phi [C, K, D]``
  shared by all contexts, ``w`` starting at 0 (so ``pi_0`` is the scenario's): learning on one prompt
  moves every other prompt whose features overlap.

* :class:`KernelModel`: ``z(c, a) = beta * u(c, a)``; a step moves the correct-answer logit of **every** context
  by the learning rate x a measured transfer kernel ``K(c, c')`` x the loss's gradient on the batch's correct
  answers (the first-order change of log pi(y*|c) under a step on c', the LLM's empirical NTK), the batch's
  wrong arms as the tabular model does (scaled by ``K(c, c)``), a per-policy inverse temperature ``beta``
  (Adam, its own rate: the LLM's norm gains) and a drift (the optimizer's noise).

All expose, for a list of regimes ``regs``, the logits of a batch of contexts ``ctx [S, B]`` as
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


class KernelModel:
    """Logits ``z[r, s, c, p, :] = beta[r, s, p] * u[r, s, c, p, :]`` (``u`` starts at the scenario's logits,
    ``beta`` at 1), stored ``[R, S, C, P, K]`` as :class:`TabularModel`'s table.

    With ``g = dL/du = beta * dL/dz`` on the batch ``ctx [S, B]`` (arm 0 correct, the calibrated scenario's
    :data:`bandit_sim.calibrate.CORRECT_ARM`) and ``Kn = K / mean_p mean_c K_p(c, c)`` (the kernel in units of the
    policies' mean self-transfer, so ``lr`` is the step a context takes on itself), one step is::

        u[c, p, 0]    -= eta * sum_b Kn_p(c, ctx_b) * g[b, p, 0]         every context c (transfer)
        u[ctx_b, p, a] -= eta * Kn_p(ctx_b, ctx_b) * g[b, p, a]          a >= 1, the batch's wrong arms
        beta          <- Adam(beta, sum_{b, a} dL/dz[b, p, a] * u[ctx_b, p, a], temperature_lr)
        u[c, p, 0]    += drift * xi[s, c, p],  xi ~ N(0, 1)               the same xi for every regime

    The kernel carries what one prompt's correct-answer gradient does to another's (same-family transfer,
    cross-family interference: ``K < 0``); ``beta`` is the global sharpness the LLM's norm gains set (GRPO raises
    it, an NLL on text the policy finds unlikely lowers it); the drift is the noise of an optimizer step in the
    directions no measured gradient spans.

    ``optimizer``: ``sgd``, ``eta = lr``; ``adam``, the step normalised as Adam normalises the LLM's, by the running
    RMS of its own size: ``eta = lr / (sqrt(v_hat) + 1e-8)``, ``v <- 0.999 v + 0.001 n``, ``n = g^T Kn g`` (the squared
    preconditioned norm of the parameter step the batch's gradient asks for), bias-corrected, per (regime, seed,
    policy), no momentum. Under Adam a term with a large gradient (an NLL on text the policy finds unlikely) does not
    step proportionally further, it takes over the step's direction. With ``K = I``, ``temperature_lr = drift = 0``
    and ``sgd`` it is the tabular model under SGD."""

    def __init__(self, init_logits: torch.Tensor, kernel: torch.Tensor, R: int, S: int, lr: float,
                 temperature_lr: float = 0.0, drift: float = 0.0, generator: torch.Generator | None = None,
                 optimizer: str = "sgd"):
        if optimizer not in ("sgd", "adam"):
            raise ValueError(f"unknown optimizer {optimizer!r}; use sgd or adam")
        P, C, K = init_logits.shape
        if kernel.shape != (P, C, C):
            raise ValueError(f"kernel {tuple(kernel.shape)} does not match the scenario's [P, C, C] = [{P}, {C}, {C}]")
        scale = kernel.diagonal(dim1=1, dim2=2).mean()
        if not scale > 0:
            raise ValueError("the kernel's mean diagonal must be > 0")
        self.shape = (R, S, P, C, K)
        self.kn = (kernel / scale).to(init_logits.dtype)  # [P, C, C]
        self.diag = self.kn.diagonal(dim1=1, dim2=2).contiguous()  # [P, C]
        self.u = init_logits.permute(1, 0, 2)[None, None].expand(R, S, C, P, K).contiguous()
        self.beta = torch.ones(R, S, P, dtype=init_logits.dtype)
        self.beta_opts = [_Optimizer(self.beta[r], "adam", temperature_lr) for r in range(R)] if temperature_lr else None
        self.lr, self.drift, self.gen = lr, drift, generator
        self._seeds = torch.arange(S).view(S, 1)
        self.normalise = optimizer == "adam"
        self.v = torch.zeros(R, S, P, dtype=init_logits.dtype)
        self.t = [0] * R

    def batch_logits(self, regs: Sequence[int], ctx: torch.Tensor) -> torch.Tensor:
        regs = list(regs)
        u = self.u[regs][:, self._seeds, ctx]  # [R', S, B, P, K]
        return u * self.beta[regs][:, :, None, :, None]

    def logits(self, r: int) -> torch.Tensor:
        return self.u[r].transpose(1, 2) * self.beta[r][:, :, None, None]

    def all_logits(self) -> torch.Tensor:
        return self.u.permute(0, 1, 3, 2, 4) * self.beta[:, :, :, None, None]

    def grad_norm(self, ctx: torch.Tensor, grad_z: torch.Tensor, consume: bool = False) -> torch.Tensor:
        return (grad_z.square_() if consume else grad_z.square()).sum(dim=(-3, -1)).sqrt()

    def apply(self, regs: Sequence[int], ctx: torch.Tensor, grad_z: torch.Tensor,
              z: torch.Tensor | None = None) -> None:
        S = self.shape[1]
        kb = self.kn[:, :, ctx]  # [P, C, S, B]: K(c, ctx_b)
        diag = self.diag[:, ctx].permute(1, 2, 0)  # [S, B, P]
        xi = torch.randn(S, self.shape[3], self.shape[2], generator=self.gen, dtype=self.u.dtype) if self.drift else None
        for k, r in enumerate(regs):
            u_b = self.u[r][self._seeds, ctx]  # [S, B, P, K], before the step
            beta = self.beta[r]  # [S, P]
            g = grad_z[k] * beta[:, None, :, None]
            g_beta = (grad_z[k] * u_b).sum(dim=(1, 3))
            step = torch.einsum("pcsb,sbp->scp", kb, g[..., 0])  # [S, C, P]
            eta = torch.full((S, 1, self.shape[2]), self.lr, dtype=g.dtype)
            if self.normalise:  # n = g^T Kn g: the correct arms through the kernel, the wrong arms through its diagonal
                own = step[self._seeds, ctx]  # [S, B, P]: (Kn g)_b on the batch's contexts
                n = (own * g[..., 0]).sum(1) + (diag.unsqueeze(-1) * g[..., 1:].square()).sum(dim=(1, 3))
                self.t[r] += 1
                self.v[r].mul_(0.999).add_(n.clamp(min=0), alpha=0.001)
                eta = (self.lr / ((self.v[r] / (1 - 0.999 ** self.t[r])).sqrt() + 1e-8)).unsqueeze(1)
            self.u[r][..., 0] -= eta * step
            u_b = self.u[r][self._seeds, ctx]  # the transfer moved the batch's correct arms: read them again
            u_b[..., 1:] -= eta.unsqueeze(-1) * diag.unsqueeze(-1) * g[..., 1:]
            self.u[r][self._seeds, ctx] = u_b
            if self.beta_opts is not None:
                self.beta_opts[r].step(beta, g_beta)
            if xi is not None:
                self.u[r][..., 0] += self.drift * xi


def make_model(kind: str, init_logits: torch.Tensor, R: int, S: int, optimizer: str, lr: float,
               features: torch.Tensor | None = None, kernel: torch.Tensor | None = None, temperature_lr: float = 0.0,
               drift: float = 0.0, generator: torch.Generator | None = None):
    if kind == "tabular":
        return TabularModel(init_logits, R, S, optimizer, lr)
    if kind == "loglinear":
        if features is None:
            raise ValueError("the log-linear model needs features [C, K, D]")
        return LogLinearModel(init_logits, features, R, S, optimizer, lr)
    if kind == "kernel":
        if kernel is None:
            raise ValueError("the kernel model needs a measured kernel [P, C, C] (the success matrix's kernel: "
                             "python -m mrl_llm kernel --run DIR)")
        return KernelModel(init_logits, kernel, R, S, lr, temperature_lr, drift, generator, optimizer)
    raise ValueError(f"unknown model {kind!r}; use tabular, loglinear or kernel")
