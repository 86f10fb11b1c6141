"""Throughput of the vectorised bandit engine against the naive loop, measured in the same run.

Workload: the ``paper`` run preset — 256 contexts x 32 arms, 2 policies, the 5 standard regimes,
64 seeds, 1000 steps, 64 prompts per step, G = 8, one epoch, metrics every 10 steps. The vectorised
engine runs all of it; the naive loop (:mod:`experiments.bench.naive_bandit`: Python loops per regime,
seed, policy and prompt, numpy inside, the core's ``regime_plan`` per prompt) runs a slice — a few
seeds for a few steps, with its metrics pass amortised over 10 steps — and its time is scaled to the
full workload (time per step is linear in the number of seeds). Prints steps/s of both and the ratio.

    PYTHONPATH=. python experiments/bench/bandit_throughput.py [--workers 2] [--steps 1000]
"""

from __future__ import annotations

import argparse
import os
import resource
import time
from dataclasses import replace

import numpy as np

from bandit_sim.presets import get_preset
from bandit_sim.runner import run_config, scenario_of
from experiments.bench.naive_bandit import naive_metrics, naive_step


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _cpu() -> float:
    """CPU seconds of this process and its finished children (the engine's worker processes)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def bench_naive(cfg, scenario, seeds: int, steps: int) -> tuple[float, float]:
    """Wall and CPU seconds per step of the naive loop for ``seeds`` seeds (metrics every 10 steps
    amortised)."""
    specs = cfg.regime_specs()
    R, (P, C, K) = len(specs), scenario.init_logits.shape
    B, G = cfg.batch_prompts, cfg.group_size
    theta = np.broadcast_to(scenario.init_logits, (R, seeds, P, C, K)).copy()
    rng = np.random.default_rng(cfg.seed)
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(steps):
        ctx = np.stack([rng.permutation(C)[:B] for _ in range(seeds)])
        u_arm = 1.0 - rng.random((seeds, B, P, G))
        u_reward = rng.random((seeds, B, P, G))
        xi = rng.standard_normal((seeds, P, B * P * G))
        naive_step(theta, specs, scenario.rewards, ctx, u_arm, u_reward, xi, lr=cfg.lr, epochs=cfg.epochs,
                   clip_low=cfg.loss.clip_low, clip_high=cfg.loss.clip_high, thl_sigma=cfg.thl_sigma,
                   thl_bias=cfg.thl_bias)
    t_steps, c_steps = (time.perf_counter() - t0) / steps, (time.process_time() - c0) / steps
    t1, c1 = time.perf_counter(), time.process_time()
    naive_metrics(theta, scenario.init_logits, scenario.rewards)
    t_metrics, c_metrics = time.perf_counter() - t1, time.process_time() - c1
    return t_steps + t_metrics / cfg.record_every, c_steps + c_metrics / cfg.record_every


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=None, help="vectorised steps (default: the preset's 1000)")
    ap.add_argument("--workers", type=int, default=1, help="engine processes (regimes sharded, exact)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per engine process")
    ap.add_argument("--naive-seeds", type=int, default=2)
    ap.add_argument("--naive-steps", type=int, default=3)
    args = ap.parse_args()
    cfg = get_preset("paper")
    cfg = replace(cfg, threads=args.threads, steps=args.steps or cfg.steps)
    scenario = scenario_of(cfg)
    print(f"workload: {scenario.n_contexts} contexts x {scenario.n_arms} arms, {scenario.n_policies} policies, "
          f"{len(cfg.regimes)} regimes, {cfg.seeds} seeds, {cfg.steps} steps, B = {cfg.batch_prompts}, "
          f"G = {cfg.group_size}, epochs = {cfg.epochs}, metrics every {cfg.record_every} steps")
    print(f"load average before: {_load()}  (cpus: {os.cpu_count()})")
    c0, t0 = _cpu(), time.perf_counter()
    run_config(cfg, scenario, workers=args.workers)
    wall, cpu = time.perf_counter() - t0, _cpu() - c0
    vec_sps = cfg.steps / wall
    print(f"vectorised: {cfg.steps} steps in {wall:.1f} s wall, {cpu:.1f} CPU-s (workers={args.workers}, "
          f"threads={args.threads}) -> {vec_sps:.2f} steps/s")
    per_step, cpu_step = bench_naive(cfg, scenario, args.naive_seeds, args.naive_steps)
    naive_cpu = cpu_step * cfg.seeds / args.naive_seeds  # CPU-s per full-workload step
    naive_sps = 1.0 / (per_step * cfg.seeds / args.naive_seeds)
    print(f"naive loop: {per_step:.2f} s/step on a {args.naive_seeds}-seed slice ({args.naive_steps} steps) -> "
          f"{naive_sps:.4f} steps/s scaled to {cfg.seeds} seeds (full workload: {cfg.steps / naive_sps / 3600:.1f} h)")
    print(f"ratio: {vec_sps / naive_sps:.0f}x wall; {naive_cpu * cfg.steps / cpu:.0f}x in CPU time per step")
    print(f"load average after: {_load()}")


if __name__ == "__main__":
    main()
