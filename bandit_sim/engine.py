"""The vectorised engine: every regime x seed x policy of a run advances together, one step at a time.

A step (:meth:`Engine.step`):

1. draw — per seed, B distinct prompts shared by all policies; uniforms for sampling, rewards and the
   THL residual. The draws do not depend on which regimes run (common random numbers), so a regime's
   trajectory is the same whether it runs alone or beside others;
2. rollout — every regime's policies sample G arms per prompt by inverse CDF
   (:func:`bandit_sim.sampling.inverse_cdf`) and get ``r ~ Bernoulli(rewards[c, a])``; their log-probs
   are the behaviour trace. One pass over ``[R, S, B, P, K]`` (all regimes stacked);
3. learn — per regime, the core's plan (:func:`bandit_sim.batching.plan_batch` -> ``regime_plan`` over
   ``[S, B, P, G]``, or the same decisions looked up in its table of every 0/1 outcome of a prompt,
   :mod:`bandit_sim.plan_table`) gives each learner its rows; regimes with as many rows are stacked
   (:mod:`bandit_sim.groups`). Then for ``epochs`` passes: per group one call of the core's
   ``regime_loss`` (its fast twin, :mod:`shared_interfaces.losses_fast`) over ``[R_g, S, P, N, T=1]`` on the rows' log-probs, autograd to those rows; then for
   all regimes at once the chain rule to the batch logits (the gather's scatter-add and the log-softmax
   backward, exactly what autograd computes) and one optimizer step.

Every shortcut here is exact: the run is bit for bit the one of a per-regime, per-step ``regime_plan``
and autograd through the batch logits (``tests/bandit``).

PRP peer rows use the core's behaviour correction with ``mu`` = the learner's snapshot (``prp_snapshot``)
or the peer's recorded log-prob plus the THL residual ``thl_bias + thl_sigma * xi`` (``prp_thl``).
"""

from __future__ import annotations

import math
import os
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from bandit_sim.batching import plan_batch
from bandit_sim.config import SimConfig
from bandit_sim.groups import RowGroup, group_rows
from bandit_sim.metrics import ALL_METRICS, masked_var, policy_metrics
from bandit_sim.models import make_model
from bandit_sim.plan_table import PlanTable, tabulable
from bandit_sim.sampling import inverse_cdf, log_softmax_backward
from bandit_sim.scenario import Scenario, load_features, rescue_sets
from shared_interfaces.config_io import ConfigError
from shared_interfaces.losses_fast import regime_loss_fast
from shared_interfaces.regimes import LearnerRows, behaviour_correction

DTYPES = {"float32": torch.float32, "float64": torch.float64}


@dataclass
class Draw:
    """One step's randomness: prompts ``ctx [S, B]``, sampling and reward uniforms ``[S, B, P, G]``,
    THL residual normals ``xi [S, P_learner, B * P * G]`` (per learner and sample ``(b, j, g)``); and
    the prompts' reward probabilities ``[S, B, P, K]``."""

    ctx: torch.Tensor
    u_arm: torch.Tensor
    u_reward: torch.Tensor
    xi: torch.Tensor
    reward_prob: torch.Tensor


@dataclass
class Rollout:
    """The rollouts of regimes ``regs`` (the leading dim of every field, in that order): ``actions``,
    ``rewards`` (0/1) and behaviour log-probs, each ``[R', S, B, P, G]`` (the core's layout behind the
    regime dim), the batch logits ``logits [R', S, B, P, K]`` and their log-softmax ``logp_all`` they were
    sampled from (:meth:`Engine.learn` steps ``logits`` in place)."""

    regs: tuple[int, ...]
    actions: torch.Tensor
    rewards: torch.Tensor
    behaviour_logp: torch.Tensor
    logits: torch.Tensor
    logp_all: torch.Tensor


@dataclass
class SimResult:
    """Recorded metrics ``metrics[name][t, r, s, p]`` at ``steps[t]`` (step 0 = before any update)."""

    config: SimConfig
    regimes: list[str]
    policy_names: tuple[str, ...]
    steps: np.ndarray
    metrics: dict[str, np.ndarray]
    rescue_sizes: np.ndarray
    wall_s: float = 0.0


#: Float copies of the [R, S, P, C, K] logits a run holds at once (parameters, gradients, Adam's two moments,
#: probabilities, log-probabilities and the initial policy's), and of the [R, S, P, B, G] samples of a step.
_TABLE_COPIES, _SAMPLE_COPIES = 8, 8


def memory_estimate(cfg: SimConfig, scenario: Scenario, seeds: int | None = None) -> int:
    """A rough upper estimate of the bytes a run holds (:data:`_TABLE_COPIES`, the per-step samples and the
    recorded metrics; for the log-linear model also its features ``[C, K, D]`` in float64 and in the run's dtype,
    a step's gathered features ``[S, B, K, D]`` and the weights ``[R, S, P, D]`` with Adam's moments) with ``seeds``
    of the run's seeds (default all): a guard against sizes that cannot fit, not a measurement."""
    R, S = len(cfg.regimes), cfg.seeds if seeds is None else seeds
    P, C, K = scenario.init_logits.shape
    itemsize = 4 if cfg.dtype == "float32" else 8
    n_records = cfg.steps // cfg.record_every + 2
    need = (itemsize * R * S * P * (_TABLE_COPIES * C * K + _SAMPLE_COPIES * cfg.batch_prompts * cfg.group_size)
            + 8 * n_records * R * S * P * len(ALL_METRICS))
    if cfg.model == "loglinear":
        D = scenario.features.shape[-1] if scenario.features is not None else cfg.feature_dim
        need += (8 + itemsize) * C * K * D + itemsize * (2 * S * cfg.batch_prompts * K * D + 3 * R * S * P * D)
    if cfg.model == "kernel":  # the kernel in float64 and the run's dtype, a step's [P, C, S, B] gather of it
        need += (8 + itemsize) * P * C * C + itemsize * P * C * S * cfg.batch_prompts
    return need


def check_fits_in_memory(cfg: SimConfig, scenario: Scenario, seeds: int | None = None) -> None:
    """A :class:`ConfigError` before anything is allocated when :func:`memory_estimate` exceeds this machine's
    physical memory (an allocator traceback, or the machine swapping, otherwise)."""
    need = memory_estimate(cfg, scenario, seeds)
    try:
        have = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # not a POSIX system: no guard
        return
    if need > have:
        P, C, K = scenario.init_logits.shape
        raise ConfigError(
            f"this run would need about {need / 2**30:,.1f} GiB ({len(cfg.regimes)} regimes x {seeds or cfg.seeds} seeds x "
            f"{P} policies x [{C} contexts x {K} arms], {cfg.steps} steps recorded every {cfg.record_every}), this "
            f"machine has {have / 2**30:,.1f} GiB; lower --seeds, the scenario's size, --batch-prompts x "
            "--group-size or steps / record_every" + (" or feature_dim" if cfg.model == "loglinear" else ""))



class DivergedError(ValueError):
    """A policy's logits became non-finite (NaN / inf): every later step and metric of it would be NaN."""


class Engine:
    """Runs ``cfg`` on ``scenario``. ``seed_range=(lo, hi)`` runs only seeds ``lo..hi-1`` of the
    ``cfg.seeds``: the draws are made for all seeds and sliced, so a seed's trajectory does not depend on
    the slice (this is how :mod:`bandit_sim.runner` shards a run over processes)."""

    def __init__(self, scenario: Scenario, cfg: SimConfig, seed_range: tuple[int, int] | None = None):
        torch.set_num_threads(min(cfg.threads, os.cpu_count() or 1))  # more threads than cores only contend
        lo, hi = seed_range or (0, cfg.seeds)
        check_fits_in_memory(cfg, scenario, hi - lo)
        self.cfg = cfg
        self.specs = cfg.regime_specs()
        self.scenario = scenario
        self.dtype = DTYPES[cfg.dtype]
        lo, hi = seed_range or (0, cfg.seeds)
        if not 0 <= lo < hi <= cfg.seeds:
            raise ValueError(f"seed_range {seed_range} is not within the run's {cfg.seeds} seeds")
        self.seed_slice = slice(lo, hi)
        self.R, self.S = len(self.specs), hi - lo
        self.P, self.C, self.K = scenario.init_logits.shape
        self.B, self.G = cfg.batch_prompts, cfg.group_size
        self.train = torch.from_numpy(scenario.train_index)
        self.C_train = len(self.train)
        if self.B > self.C_train:
            raise ValueError(f"batch_prompts = {self.B} exceeds the scenario's {self.C_train} training contexts; lower "
                             "--batch-prompts")
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
        kernel = drift_gen = None
        if cfg.model == "kernel":
            if scenario.kernel is None:
                raise ConfigError("model: kernel needs a scenario with a measured kernel (a success matrix written "
                                  "with python -m mrl_llm kernel --run DIR); use model: tabular otherwise")
            kernel = torch.tensor(scenario.kernel, dtype=self.dtype)
            drift_gen = torch.Generator().manual_seed(int(np.random.SeedSequence([cfg.seed, 4]).generate_state(1)[0]))
        self.model = make_model(cfg.model, init, self.R, self.S, cfg.optimizer, cfg.lr, feats, kernel,
                                cfg.temperature_lr, cfg.drift, drift_gen)
        self.gens = {
            name: torch.Generator().manual_seed(int(np.random.SeedSequence([cfg.seed, k]).generate_state(1)[0]))
            for k, name in enumerate(("ctx", "arm", "reward", "thl"))
        }
        # PRP regimes report Var[pi / mu] with THL's mu, so every PRP regime needs the residual draws
        self.needs_xi = cfg.thl_sigma > 0 and any(s.uses_peer_samples for s in self.specs)
        self.sgt_rngs = [np.random.default_rng([cfg.seed, zlib.crc32(s.name.encode())]) for s in self.specs]
        self.np_dtype = np.float32 if self.dtype == torch.float32 else np.float64
        self.tables = [PlanTable(s, self.P, self.G, self.np_dtype) if cfg.plan_table and tabulable(s, self.P, self.G)
                       else None for s in self.specs]
        self._lanes: dict[int, torch.Tensor] = {}
        self.t = 0
        self.last_draw: Draw | None = None

    # -- 1. draw -----------------------------------------------------------------------------------
    def draw(self) -> Draw:
        """Each stream has its own generator, so skipping one (no PRP regime, or sigma = 0) leaves the
        others — and every other regime's trajectory — unchanged."""
        S, P, B, G, g, sl = self.cfg.seeds, self.P, self.B, self.G, self.gens, self.seed_slice
        ctx = torch.rand(S, self.C_train, generator=g["ctx"])[sl].argsort(dim=1)[:, :B]  # (row by row: slice first)
        if self.C_train < self.C:  # held-out contexts are never drawn
            ctx = self.train[ctx]
        u_arm = 1.0 - torch.rand(S, B, P, G, generator=g["arm"], dtype=self.dtype)[sl]  # in (0, 1]
        u_reward = torch.rand(S, B, P, G, generator=g["reward"], dtype=self.dtype)[sl]
        if self.needs_xi:
            xi = torch.randn(S, P, self.N, generator=g["thl"], dtype=self.dtype)[sl]
        else:
            xi = torch.zeros((), dtype=self.dtype)
        return Draw(ctx, u_arm, u_reward, xi, self.rewards[ctx].unsqueeze(2).expand(-1, -1, P, -1))

    # -- 2. rollout ----------------------------------------------------------------------------------
    def _regs(self, regs: Sequence[int] | None) -> tuple[int, ...]:
        return tuple(range(self.R)) if regs is None else tuple(int(r) for r in regs)

    def rollout(self, d: Draw, regs: Sequence[int] | None = None) -> Rollout:
        """Regimes ``regs`` (default: all) sample by inverse CDF, all in one pass; an arm whose probability
        is below the dtype's resolution (2^-24 of the total in float32) is never drawn."""
        regs = self._regs(regs)
        z = self.model.batch_logits(regs, d.ctx)
        logp = torch.log_softmax(z, dim=-1)  # [R', S, B, P, K]
        actions = inverse_cdf(logp, d.u_arm)
        p_reward = d.reward_prob.expand(logp.shape).gather(-1, actions)
        rewards = (d.u_reward < p_reward).to(self.dtype)
        return Rollout(regs, actions, rewards, logp.gather(-1, actions), z, logp)

    # -- 3. learn ------------------------------------------------------------------------------------
    def plan(self, r: int, rewards: torch.Tensor, pattern_id: torch.Tensor | None = None) -> LearnerRows:
        """The core's decisions for regime ``r``'s rollouts ``[S, B, P, G]``: one ``regime_plan`` call, or
        its table of every prompt outcome (:mod:`bandit_sim.plan_table`, the same rows exactly; ``pattern_id``:
        the rollouts' pattern ids if at hand)."""
        if self.tables[r] is not None:
            return self.tables[r].batch(rewards, pattern_id)
        return plan_batch(self.specs[r], rewards.numpy(), rng=self.sgt_rngs[r], dtype=self.np_dtype)

    @staticmethod
    def per_row(x: torch.Tensor, rows: LearnerRows) -> torch.Tensor:
        """Per-sample values ``[S, B, P_src, G]`` -> each learner's rows ``[S, P, N]`` (``rows.src``)."""
        flat = x.reshape(x.shape[0], -1)  # [S, B * P * G] in (b, j, g) order
        return flat.index_select(1, rows.src.reshape(-1)).view(x.shape[0], *rows.src.shape)

    def _lane(self, rows: LearnerRows) -> torch.Tensor:
        """``(b * P + i) * K`` of row (b, j, g) of learner i: where its context's logits start in the flat
        batch ``[B * P * K]`` (depends only on the number of rows; cached)."""
        n = rows.src.shape[-1]
        if n not in self._lanes:
            P, K = self.P, self.K
            self._lanes[n] = ((rows.src // (P * self.G)) * P + torch.arange(P).unsqueeze(1)) * K
        return self._lanes[n]

    def plan_all(self, ro: Rollout) -> tuple[list[LearnerRows], list[RowGroup]]:
        """Every regime's plan of ``ro`` (:meth:`plan`) and the regimes grouped for the loss
        (:mod:`bandit_sim.groups`)."""
        table = next((t for t in self.tables if t is not None), None)
        patterns = table.pattern_ids(ro.rewards) if table is not None else [None] * len(ro.regs)  # all regimes at once
        rows = {k: self.plan(r, ro.rewards[k], patterns[k]) for k, r in enumerate(ro.regs)}
        return [rows[k] for k in range(len(ro.regs))], group_rows(rows, self.dtype)

    def _locate(self, d: Draw, ro: Rollout, g: RowGroup) -> None:
        """Group ``g``'s rows: where each row's log-prob sits in the step's flat batch log-softmax, its
        sample's behaviour log-prob, the PRP peer denominator and the KL reference (see :class:`RowGroup`)."""
        S, P, K, cfg = self.S, self.P, self.K, self.cfg
        Rg, src = len(g.ks), g.src
        base = torch.as_tensor(g.ks).view(-1, 1, 1) * S + torch.arange(S).view(1, S, 1)  # (regime, seed)
        sample = base * (self.B * P * self.G) + src.reshape(1, 1, -1)  # the row's sample in [R', S, B, P, G]
        actions = ro.actions.view(-1).take(sample)
        g.src_logp = ro.behaviour_logp.view(-1).take(sample).view(Rg, S, P, -1)
        # row (b, j, g) of learner i reads log pi_i(a | c_b): index (b * P + i) * K + a into [S, B * P * K]
        local = self._lane(g.rows[0]).reshape(1, 1, -1) + actions
        g.gidx = base * (self.B * P * K) + local
        if any(r.denominator is not None for r in g.rows):  # PRP: the peer trace as THL delivers it
            g.mu = g.src_logp + cfg.thl_bias
            if self.needs_xi:  # the THL residual of (learner i, sample n) is xi[s, i, n]
                g.mu = g.mu + cfg.thl_sigma * d.xi.gather(-1, src.expand(S, -1, -1))
        if cfg.loss.kl_coef > 0:
            init = self.init_logp[:, d.ctx].permute(1, 2, 0, 3).reshape(S, -1)
            g.ref = init.expand(Rg, -1, -1).gather(-1, local).view(Rg, S, P, -1, 1)

    def learn(self, d: Draw, ro: Rollout, diagnose: bool = True) -> dict[str, torch.Tensor]:
        """Regimes ``ro.regs``: plan, then ``epochs`` optimizer passes on the batch with the core's loss.
        Returns step diagnostics ``[R', S, P]`` (the density-ratio variances only when ``diagnose``).

        The core's loss runs once per group of regimes with as many rows (:mod:`bandit_sim.groups`) and is
        differentiated with respect to the rows' log-probs (a leaf); the rest of the chain rule is shared:
        scatter-add of the rows' gradients into ``[R', S, B, P, K]`` and the log-softmax backward, as
        autograd would do it on the batch logits."""
        S, P, cfg, regs = self.S, self.P, self.cfg, ro.regs
        plans, groups = self.plan_all(ro)
        for g in groups:
            self._locate(d, ro, g)
        clip = torch.zeros(len(regs), S, P, dtype=torch.float64)
        gnorm = torch.zeros(len(regs), S, P, dtype=torch.float64)
        z, logp_all = ro.logits, ro.logp_all
        for epoch in range(cfg.epochs):
            if epoch > 0:
                z = self.model.batch_logits(regs, d.ctx)
                logp_all = torch.log_softmax(z, dim=-1)
            flat = logp_all.view(-1)
            grad = torch.zeros_like(flat)
            for g in groups:
                logp = flat.take(g.gidx).view(len(g.ks), S, P, -1).requires_grad_(True)
                if epoch == 0:
                    g.snapshot(logp.detach())
                out = regime_loss_fast(
                    logp.unsqueeze(-1), g.old.unsqueeze(-1), g.advantages, g.pg_mask, cfg.loss, behaviour_coef=g.coef,
                    sample_weight=g.sample_weight, sgt_mask=g.sgt_mask, sgt_weight=g.sgt_weight, sgt_scale=g.sgt_scale,
                    ref_logp=g.ref, own_mask=g.rows[0].own_mask,
                )
                out.loss.sum().backward()
                grad.scatter_add_(0, g.gidx.view(-1), logp.grad.view(-1))  # rows in order, as autograd's gather
                clip[g.ks] += out.clip_fraction.double()
            grad_z = log_softmax_backward(grad.view_as(logp_all), logp_all)
            self.model.apply(regs, d.ctx, grad_z, z)
            if diagnose:
                gnorm += self.model.grad_norm(d.ctx, grad_z, consume=True).double()
        stats = {"clip_fraction": clip / cfg.epochs,
                 "sgt_activations": torch.stack([r.sgt_gate.sum(-1).double() for r in plans])}
        if diagnose:
            stats["grad_norm"] = gnorm / cfg.epochs
            stats.update(self._ratio_variances(len(regs), groups))
        return stats

    def _ratio_variances(self, R1: int, groups: list[RowGroup]) -> dict[str, torch.Tensor]:
        """Var[pi_old / mu] over each learner's peer rows (PRP): mu = the peer trace as THL delivers it
        (with the residual), and without the residual (``[2, R', S, P]``). Untruncated: the core's
        correction, cap = inf. NaN where a learner has fewer than two peer rows (every regime without
        peer samples). One pass per group over its PRP regimes."""
        out = torch.full((2, R1, self.S, self.P), math.nan, dtype=torch.float64)
        for g in groups:
            js = [j for j, r in enumerate(g.rows) if r.denominator is not None]
            if not js:
                continue
            den = torch.stack([g.mu[js], g.src_logp[js]])
            peer = torch.stack([g.rows[j].pg_mask & ~g.rows[j].own_mask for j in js])
            ratio = behaviour_correction(g.old[js].expand_as(den), den, math.inf)
            out[:, [g.ks[j] for j in js]] = masked_var(ratio, peer).double()
        return {"ratio_variance": out[0], "true_ratio_variance": out[1]}

    def step(self, diagnose: bool = True) -> dict[str, torch.Tensor]:
        """One step of every regime on the same draw; diagnostics ``[R, S, P]``."""
        d = self.last_draw = self.draw()
        stats = self.learn(d, self.rollout(d), diagnose)
        self.t += 1
        return stats

    # -- metrics and the run -------------------------------------------------------------------------
    def policy_metrics(self) -> dict[str, torch.Tensor]:
        """Policy metrics ``[R, S, P]``, one regime at a time (cache-sized chunks)."""
        with torch.no_grad():
            per = [policy_metrics(self.model.logits(r).contiguous(), self.init_logp, self.rewards, self.correct,
                                  self.rescue, self.cfg.support_eps) for r in range(self.R)]
        return {k: torch.stack([p[k] for p in per]) for k in per[0]}

    def check_finite(self, accuracy: torch.Tensor, since: int, t: int) -> None:
        """A :class:`DivergedError` naming the first (regime, seed, policy) whose ``accuracy [R, S, P]`` is NaN:
        its logits became NaN or infinite between steps ``since`` and ``t`` (an update too large for the dtype)."""
        bad = torch.isnan(accuracy).nonzero()
        if len(bad):
            r, s, p = bad[0].tolist()
            cfg = self.cfg
            raise DivergedError(
                f"regime {self.specs[r].name}, seed {self.seed_slice.start + s}, policy "
                f"{self.scenario.policy_names[p]}: the {cfg.model} model's logits became non-finite between step "
                f"{since} and step {t} ({len(bad)} of the {accuracy.numel()} regime x seed x policy runs; {cfg.optimizer} "
                f"with lr {cfg.lr:g} in {cfg.dtype}); lower lr")

    def run(self, progress=None) -> SimResult:
        """All ``cfg.steps`` steps; metrics at step 0, every ``record_every`` steps and at the end.
        Step diagnostics are averaged (NaN-aware) over the steps since the previous record. A policy whose logits
        became non-finite ends the run at the next record (:meth:`check_finite`)."""
        cfg = self.cfg
        rec_steps = sorted({0, *range(cfg.record_every, cfg.steps + 1, cfg.record_every), cfg.steps})
        shape = (len(rec_steps), self.R, self.S, self.P)
        out = {k: np.full(shape, np.nan) for k in ALL_METRICS}
        acc: dict[str, torch.Tensor] = {}
        cnt: dict[str, torch.Tensor] = {}
        total_gates = torch.zeros(self.R, self.S, self.P, dtype=torch.float64)
        t0 = time.perf_counter()
        k = 0
        for t in range(cfg.steps + 1):
            if t > 0:
                stats = self.step()
                total_gates += stats["sgt_activations"]
                for name, v in stats.items():
                    ok = ~torch.isnan(v)
                    acc[name] = acc.get(name, 0) + torch.where(ok, v, 0.0)
                    cnt[name] = cnt.get(name, 0) + ok.double()
                if progress is not None:
                    progress(1)
            if t == rec_steps[k]:
                metrics = self.policy_metrics()
                self.check_finite(metrics["accuracy"], rec_steps[k - 1] if k else 0, t)
                for name, v in metrics.items():
                    out[name][k] = v.numpy()
                for name in acc:
                    out[name][k] = torch.where(cnt[name] > 0, acc[name] / cnt[name].clamp(min=1), math.nan).numpy()
                out["sgt_activations_total"][k] = total_gates.numpy()
                acc, cnt = {}, {}
                k += 1
        return SimResult(
            config=cfg,
            regimes=[s.name for s in self.specs],
            policy_names=self.scenario.policy_names,
            steps=np.array(rec_steps),
            metrics=out,
            rescue_sizes=self.rescue_np.sum(axis=1),
            wall_s=time.perf_counter() - t0,
        )


def run(scenario: Scenario, cfg: SimConfig, progress=None) -> SimResult:
    return Engine(scenario, cfg).run(progress)
