"""Run a config: build its scenario, run the engine in one process or sharded over worker processes,
with a progress bar.

Sharding is exact (``workers=2`` gives the same numbers as ``workers=1``, faster on two cores): by seeds
— every worker makes the whole run's draws and keeps its slice of seeds (see :class:`Engine`) — or, when
a regime selects SGT targets at random (its generator draws for the whole seed batch at once), by
regimes, since a regime's trajectory does not depend on which regimes run beside it.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from dataclasses import replace

import numpy as np
from tqdm import tqdm

from bandit_sim.config import SimConfig
from bandit_sim.engine import Engine, SimResult, check_fits_in_memory
from bandit_sim.scenario import Scenario, generate_scenario, load_scenario


def scenario_of(cfg: SimConfig) -> Scenario:
    """The run's scenario: its ``.npz`` file, or the generator's."""
    sc = load_scenario(cfg.scenario) if cfg.scenario is not None else generate_scenario(cfg.generator)
    if cfg.model == "loglinear" and sc.features is not None and sc.features.shape[-1] != cfg.feature_dim:
        raise ValueError(f"the scenario's features have D = {sc.features.shape[-1]} but feature_dim = {cfg.feature_dim}")
    return sc


_COUNTER = None


def _init_worker(counter) -> None:
    global _COUNTER
    _COUNTER = counter


def _worker(scenario: Scenario, cfg: SimConfig, seed_range: tuple[int, int] | None) -> SimResult:
    def tick(k: int) -> None:
        with _COUNTER.get_lock():
            _COUNTER.value += k

    return Engine(scenario, cfg, seed_range).run(tick)


def _jobs(cfg: SimConfig, workers: int) -> tuple[str, list[tuple[SimConfig, tuple[int, int] | None]]]:
    if any(s.random_plan for s in cfg.regime_specs()):
        n = min(workers, len(cfg.regimes))
        return "regimes", [(replace(cfg, regimes=cfg.regimes[i::n], threads=1), None) for i in range(n)]
    n = min(workers, cfg.seeds)
    bounds = np.linspace(0, cfg.seeds, n + 1).round().astype(int)
    return "seeds", [(replace(cfg, threads=1), (int(lo), int(hi))) for lo, hi in zip(bounds, bounds[1:], strict=False)]


def run_config(cfg: SimConfig, scenario: Scenario | None = None, *, workers: int = 1, progress: bool = False,
               desc: str = "steps") -> SimResult:
    """Run ``cfg``; ``workers > 1`` shards it over processes (one torch thread each)."""
    scenario = scenario if scenario is not None else scenario_of(cfg)
    check_fits_in_memory(cfg, scenario)  # before any worker starts (each engine checks its own share too)
    if workers <= 1:
        bar = tqdm(total=cfg.steps, desc=desc, leave=False, disable=not progress)
        res = Engine(scenario, cfg).run(bar.update)
        bar.close()
        return res
    how, jobs = _jobs(cfg, workers)
    ctx = mp.get_context("spawn")
    counter = ctx.Value("l", 0)
    t0 = time.perf_counter()
    with ctx.Pool(len(jobs), initializer=_init_worker, initargs=(counter,)) as pool:
        pending = [pool.apply_async(_worker, (scenario, c, rng)) for c, rng in jobs]
        bar = tqdm(total=cfg.steps * len(jobs), desc=desc, leave=False, disable=not progress)
        while not all(p.ready() for p in pending):
            time.sleep(0.2)
            bar.n = counter.value
            bar.refresh()
        bar.close()
        parts = [p.get() for p in pending]
    return merge_results(cfg, parts, how, time.perf_counter() - t0)


def merge_results(cfg: SimConfig, parts: list[SimResult], how: str, wall_s: float) -> SimResult:
    """Shard results -> one result: seed slices are concatenated; regime shards are put back in
    ``cfg.regimes`` order."""
    if how == "seeds":
        names = parts[0].regimes
        metrics = {k: np.concatenate([p.metrics[k] for p in parts], axis=2) for k in parts[0].metrics}
    else:
        names = [s.name for s in cfg.regime_specs()]
        where = {name: (k, r) for k, part in enumerate(parts) for r, name in enumerate(part.regimes)}
        metrics = {
            key: np.stack([parts[where[n][0]].metrics[key][:, where[n][1]] for n in names], axis=1)
            for key in parts[0].metrics
        }
    return SimResult(
        config=cfg, regimes=names, policy_names=parts[0].policy_names, steps=parts[0].steps, metrics=metrics,
        rescue_sizes=parts[0].rescue_sizes, wall_s=wall_s,
    )
