"""The vectorised engine: every regime x seed x policy of a run advances together, one step at a time.

A step (:meth:`Engine.step`):

1. draw — per seed, B distinct prompts shared by all policies; uniforms for sampling, rewards and the
   THL residual. The draws do not depend on which regimes run (common random numbers), so a regime's
   trajectory is the same whether it runs alone or beside others;
2. rollout — each policy samples G arms per prompt by inverse CDF (cumsum + searchsorted) and gets
   ``r ~ Bernoulli(rewards[c, a])``; its log-probs are the behaviour trace;
3. learn — per regime, one call of the core (:func:`bandit_sim.batching.plan_batch` -> ``regime_plan``
   over ``[S, B, P, G]``) gives each learner its rows; then for ``epochs`` passes, one call of the core's
   ``regime_loss`` over ``[R, S, P, N, T=1]``, autograd to the batch logits, an optimizer step.

PRP peer rows use the core's behaviour correction with ``mu`` = the learner's snapshot (``prp_snapshot``)
or the peer's recorded log-prob plus the THL residual ``thl_bias + thl_sigma * xi`` (``prp_thl``).
"""

from __future__ import annotations

import math
import time
import zlib
from dataclasses import dataclass, field

import numpy as np
import torch

from bandit_sim.batching import LearnerBatch, behaviour_coef, plan_batch
from bandit_sim.config import RunConfig
from bandit_sim.metrics import ALL_METRICS, masked_var, policy_metrics
from bandit_sim.models import make_model
from bandit_sim.scenario import Scenario, load_features, rescue_sets
from shared_interfaces.losses import regime_loss
from shared_interfaces.regimes import behaviour_correction

DTYPES = {"float32": torch.float32, "float64": torch.float64}
_STACKED = ("advantages", "pg_mask", "sample_weight", "sgt_mask", "use_mu", "gate")


@dataclass
class Draw:
    """One step's randomness: prompts ``ctx [S, B]``, sampling and reward uniforms ``[S, P, B, G]``,
    THL residual normals ``xi [S, P, N]``."""

    ctx: torch.Tensor
    u_arm: torch.Tensor
    u_reward: torch.Tensor
    xi: torch.Tensor


@dataclass
class Rollout:
    """``actions``, ``rewards`` (0/1) and behaviour log-probs, each ``[R, S, P, B, G]``; the batch
    logits ``[R, S, P, B, K]`` they were sampled from (a leaf requiring grad) and their log-softmax."""

    actions: torch.Tensor
    rewards: torch.Tensor
    behaviour_logp: torch.Tensor
    logits: torch.Tensor
    logp_all: torch.Tensor


@dataclass
class RunResult:
    """Recorded metrics ``metrics[name][t, r, s, p]`` at ``steps[t]`` (step 0 = before any update)."""

    config: RunConfig
    regimes: list[str]
    policy_names: tuple[str, ...]
    steps: np.ndarray
    metrics: dict[str, np.ndarray]
    rescue_sizes: np.ndarray
    wall_s: float = 0.0
    extra: dict = field(default_factory=dict)


class Engine:
    def __init__(self, scenario: Scenario, cfg: RunConfig):
        torch.set_num_threads(cfg.threads)
        self.cfg = cfg
        self.specs = cfg.regime_specs()
        self.scenario = scenario
        self.dtype = DTYPES[cfg.dtype]
        self.R, self.S = len(self.specs), cfg.seeds
        self.P, self.C, self.K = scenario.init_logits.shape
        self.B, self.G = cfg.batch_prompts, cfg.group_size
        if self.B > self.C:
            raise ValueError(f"batch_prompts = {self.B} exceeds the scenario's {self.C} contexts; lower --batch-prompts")
        self.N = self.B * self.P * self.G
        init = torch.tensor(scenario.init_logits, dtype=self.dtype)
        self.init_logp = torch.log_softmax(init, dim=-1)
        self.rewards = torch.tensor(scenario.rewards, dtype=self.dtype)
        self.correct = torch.from_numpy(scenario.correct)
        self.rescue_np = rescue_sets(scenario, cfg.rescue_eps, cfg.rescue_peer_min)
        self.rescue = torch.from_numpy(self.rescue_np)
        feats = None
        if cfg.model == "loglinear":
            feats = torch.tensor(load_features(scenario, cfg.feature_dim, cfg.seed + 7919), dtype=self.dtype)
        self.model = make_model(cfg.model, init, self.R, self.S, cfg.optimizer, cfg.lr, feats)
        self.gens = {
            name: torch.Generator().manual_seed(int(np.random.SeedSequence([cfg.seed, k]).generate_state(1)[0]))
            for k, name in enumerate(("ctx", "arm", "reward", "thl"))
        }
        self.needs_xi = cfg.thl_sigma > 0 and any(s.denominator == "thl" for s in self.specs)
        self.sgt_groups = self._sgt_groups()
        self.sgt_rngs = [np.random.default_rng([cfg.seed, zlib.crc32(s.name.encode())]) for s in self.specs]
        self.t = 0

    # -- 1. draw -----------------------------------------------------------------------------------
    def draw(self) -> Draw:
        """Each stream has its own generator, so skipping one (no ``prp_thl`` regime, or sigma = 0)
        leaves the others — and every other regime's trajectory — unchanged."""
        S, P, B, G, g = self.S, self.P, self.B, self.G, self.gens
        ctx = torch.rand(S, self.C, generator=g["ctx"]).argsort(dim=1)[:, :B]
        u_arm = 1.0 - torch.rand(S, P, B, G, generator=g["arm"], dtype=self.dtype)  # in (0, 1]
        u_reward = torch.rand(S, P, B, G, generator=g["reward"], dtype=self.dtype)
        if self.needs_xi:
            xi = torch.randn(S, P, self.N, generator=g["thl"], dtype=self.dtype)
        else:
            xi = torch.zeros((), dtype=self.dtype)
        return Draw(ctx, u_arm, u_reward, xi)

    # -- 2. rollout ----------------------------------------------------------------------------------
    def rollout(self, d: Draw) -> Rollout:
        """Inverse-CDF sampling; an arm whose probability is below the dtype's resolution (2^-24 of the
        total in float32) is never drawn."""
        z = self.model.batch_logits(d.ctx).requires_grad_(True)  # [R, S, P, B, K], a leaf for learn()
        logp = torch.log_softmax(z, dim=-1)  # tracked: learn()'s first epoch reuses it
        cdf = logp.detach().exp().cumsum(dim=-1)
        total = cdf[..., -1:]
        x = torch.minimum(d.u_arm[None] * total, torch.nextafter(total, torch.zeros_like(total)))
        actions = torch.searchsorted(cdf, x, right=True).clamp_(max=self.K - 1)
        p_reward = self.rewards[d.ctx][None, :, None].expand(self.R, -1, self.P, -1, -1).gather(-1, actions)
        rewards = (d.u_reward[None] < p_reward).to(self.dtype)
        return Rollout(actions, rewards, logp.detach().gather(-1, actions), z, logp)

    # -- 3. learn ------------------------------------------------------------------------------------
    def plan(self, rewards: torch.Tensor) -> list[LearnerBatch]:
        """One core call per regime over ``[S, B, P, G]``."""
        r = rewards.permute(0, 1, 3, 2, 4).numpy()  # [R, S, B, P, G]
        np_dtype = np.float32 if self.dtype == torch.float32 else np.float64
        return [plan_batch(spec, r[i], rng=self.sgt_rngs[i], dtype=np_dtype) for i, spec in enumerate(self.specs)]

    def _rows(self, x: torch.Tensor) -> torch.Tensor:
        """``[R, S, P_src, B, G] -> [R, S, 1, N]`` in ``(b, j, g)`` row order."""
        R, S = x.shape[:2]
        return x.permute(0, 1, 3, 2, 4).reshape(R, S, 1, self.N)

    def learn(self, d: Draw, ro: Rollout, diagnose: bool = True) -> dict[str, torch.Tensor]:
        """Plan, then ``epochs`` optimizer passes on the batch. Returns step diagnostics ``[R, S, P]``
        (the density-ratio variances only when ``diagnose``)."""
        R, S, P, B, N = self.R, self.S, self.P, self.B, self.N
        batches = self.plan(ro.rewards)
        st = {k: torch.stack([getattr(b, k) for b in batches]) for k in _STACKED}
        adv, weight = st["advantages"], st["sample_weight"]
        pg_mask, sgt_mask = st["pg_mask"].unsqueeze(-1), st["sgt_mask"].unsqueeze(-1)
        idx = self._rows(ro.actions).reshape(R, S, 1, B, -1).expand(R, S, P, B, -1)
        src_logp = self._rows(ro.behaviour_logp).expand(R, S, P, N)
        mu = src_logp + self.cfg.thl_bias + self.cfg.thl_sigma * d.xi[None]
        ref = None
        if self.cfg.loss.kl_coef > 0:
            ref = self.init_logp[:, d.ctx].permute(1, 0, 2, 3)[None].expand(R, -1, -1, -1, -1)
            ref = ref.gather(-1, idx).reshape(R, S, P, N, 1)
        clip = torch.zeros(R, S, P, dtype=torch.float64)
        gnorm = torch.zeros(R, S, P, dtype=torch.float64)
        for epoch in range(self.cfg.epochs):
            if epoch == 0:
                z, logp_all = ro.logits, ro.logp_all
            else:
                z = self.model.batch_logits(d.ctx).requires_grad_(True)
                logp_all = torch.log_softmax(z, dim=-1)
            logp = logp_all.gather(-1, idx).reshape(R, S, P, N)
            if epoch == 0:
                old = logp.detach()
                coef = torch.ones_like(old)
                for i, b in enumerate(batches):
                    if b.denominator == "thl":
                        coef[i] = behaviour_coef(b, old[i], mu[i])
            total = logp.new_zeros(())
            for lam, rs in self.sgt_groups:
                sl = (lambda x: x) if len(rs) == R else (lambda x, rs=rs: x[rs])
                out = regime_loss(
                    sl(logp).unsqueeze(-1), sl(old).unsqueeze(-1), sl(adv), sl(pg_mask), self.cfg.loss,
                    behaviour_coef=sl(coef).unsqueeze(-1), sample_weight=sl(weight), sgt_mask=sl(sgt_mask),
                    sgt_weight=lam, ref_logp=None if ref is None else sl(ref),
                )
                total = total + out.loss.sum()
                clip[rs] += out.clip_fraction.double()
            total.backward()
            gnorm += self.model.apply(d.ctx, z.grad).double()
        stats = {
            "grad_norm": gnorm / self.cfg.epochs,
            "clip_fraction": clip / self.cfg.epochs,
            "sgt_activations": st["gate"].sum(-1).double(),
        }
        if diagnose:
            # Var[pi_old / mu] over the learner's peer rows (PRP): mu = the peer trace as THL delivers it
            # (with the residual), and without the residual. Untruncated: the core's correction, cap = inf.
            peer = st["pg_mask"] & batches[0].is_peer
            stats["ratio_variance"] = masked_var(behaviour_correction(old, mu, math.inf), peer).double()
            stats["true_ratio_variance"] = masked_var(behaviour_correction(old, src_logp, math.inf), peer).double()
        return stats

    def _sgt_groups(self) -> list[tuple[float, list[int]]]:
        """Regimes grouped by SGT weight (the core's loss takes one lambda per call); regimes without SGT
        have no SGT rows, so they join the first group."""
        lams: dict[float, list[int]] = {}
        plain = []
        for i, s in enumerate(self.specs):
            if s.sgt_enabled:
                lams.setdefault(s.sgt.weight, []).append(i)
            else:
                plain.append(i)
        groups = [(lam, rs) for lam, rs in lams.items()] or [(0.0, [])]
        groups[0] = (groups[0][0], sorted(groups[0][1] + plain))
        return groups

    def step(self, diagnose: bool = True) -> dict[str, torch.Tensor]:
        d = self.draw()
        stats = self.learn(d, self.rollout(d), diagnose)
        self.t += 1
        return stats

    # -- metrics and the run -------------------------------------------------------------------------
    def policy_metrics(self) -> dict[str, torch.Tensor]:
        with torch.no_grad():
            return policy_metrics(self.model.all_logits(), self.init_logp, self.rewards, self.correct,
                                  self.rescue, self.cfg.support_eps)

    def run(self, progress=None) -> RunResult:
        """All ``cfg.steps`` steps; metrics at step 0, every ``record_every`` steps and at the end.
        Step diagnostics are averaged (NaN-aware) over the steps since the previous record, except the
        density-ratio variances, measured on the recorded step's batch only (they cost a pass each)."""
        cfg = self.cfg
        rec_steps = sorted({0, *range(cfg.record_every, cfg.steps + 1, cfg.record_every), cfg.steps})
        rec_set = set(rec_steps)
        shape = (len(rec_steps), self.R, self.S, self.P)
        out = {k: np.full(shape, np.nan) for k in ALL_METRICS}
        acc: dict[str, torch.Tensor] = {}
        cnt: dict[str, torch.Tensor] = {}
        total_gates = torch.zeros(self.R, self.S, self.P, dtype=torch.float64)
        t0 = time.perf_counter()
        k = 0
        for t in range(cfg.steps + 1):
            if t > 0:
                stats = self.step(diagnose=t in rec_set)
                total_gates += stats["sgt_activations"]
                for name, v in stats.items():
                    ok = ~torch.isnan(v)
                    acc[name] = acc.get(name, 0) + torch.where(ok, v, 0.0)
                    cnt[name] = cnt.get(name, 0) + ok.double()
                if progress is not None:
                    progress(1)
            if t == rec_steps[k]:
                for name, v in self.policy_metrics().items():
                    out[name][k] = v.numpy()
                for name in acc:
                    out[name][k] = torch.where(cnt[name] > 0, acc[name] / cnt[name].clamp(min=1), math.nan).numpy()
                out["sgt_activations_total"][k] = total_gates.numpy()
                acc, cnt = {}, {}
                k += 1
        return RunResult(
            config=cfg,
            regimes=[s.name for s in self.specs],
            policy_names=self.scenario.policy_names,
            steps=np.array(rec_steps),
            metrics=out,
            rescue_sizes=self.rescue_np.sum(axis=1),
            wall_s=time.perf_counter() - t0,
        )


def run(scenario: Scenario, cfg: RunConfig, progress=None) -> RunResult:
    return Engine(scenario, cfg).run(progress)
