"""Run a config: build its scenario, run the engine (in one process, or sharded by regime over worker
processes), with a progress bar.

Sharding is exact: the engine's random draws do not depend on which regimes run together (see
:mod:`bandit_sim.engine`), so ``workers=2`` gives the same numbers as ``workers=1``, faster on two cores.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from dataclasses import replace

import numpy as np
from tqdm import tqdm

from bandit_sim.config import RunConfig
from bandit_sim.engine import Engine, RunResult
from bandit_sim.scenario import Scenario, generate_scenario, load_scenario


def scenario_of(cfg: RunConfig) -> Scenario:
    """The run's scenario: its ``.npz`` file, or the generator's."""
    if cfg.scenario is not None:
        sc = load_scenario(cfg.scenario)
    else:
        sc = generate_scenario(cfg.generator)
    if cfg.model == "loglinear" and sc.features is not None and sc.features.shape[-1] != cfg.feature_dim:
        raise ValueError(f"the scenario's features have D = {sc.features.shape[-1]} but feature_dim = {cfg.feature_dim}")
    return sc


def _shards(regimes: tuple[str, ...], workers: int) -> list[tuple[str, ...]]:
    n = max(1, min(workers, len(regimes)))
    return [tuple(regimes[i::n]) for i in range(n)]


_COUNTER = None


def _init_worker(counter) -> None:
    global _COUNTER
    _COUNTER = counter


def _worker(scenario: Scenario, cfg: RunConfig) -> RunResult:
    def tick(k: int) -> None:
        with _COUNTER.get_lock():
            _COUNTER.value += k

    return Engine(scenario, cfg).run(tick)


def run_config(cfg: RunConfig, scenario: Scenario | None = None, *, workers: int = 1, progress: bool = False,
               desc: str = "steps") -> RunResult:
    """Run ``cfg``; ``workers > 1`` shards the regimes over processes (one torch thread each)."""
    scenario = scenario if scenario is not None else scenario_of(cfg)
    shards = _shards(cfg.regimes, workers)
    if len(shards) == 1:
        bar = tqdm(total=cfg.steps, desc=desc, leave=False, disable=not progress)
        res = Engine(scenario, cfg).run(bar.update)
        bar.close()
        return res
    ctx = mp.get_context("spawn")
    counter = ctx.Value("l", 0)
    t0 = time.perf_counter()
    sub = [replace(cfg, regimes=s, threads=1) for s in shards]
    with ctx.Pool(len(sub), initializer=_init_worker, initargs=(counter,)) as pool:
        pending = [pool.apply_async(_worker, (scenario, c)) for c in sub]
        bar = tqdm(total=cfg.steps * len(sub), desc=desc, leave=False, disable=not progress)
        while not all(p.ready() for p in pending):
            time.sleep(0.2)
            bar.n = counter.value
            bar.refresh()
        bar.close()
        parts = [p.get() for p in pending]
    return merge_results(cfg, parts, time.perf_counter() - t0)


def merge_results(cfg: RunConfig, parts: list[RunResult], wall_s: float) -> RunResult:
    """Shard results (disjoint regimes) -> one result in ``cfg.regimes`` order."""
    names = [s.name for s in cfg.regime_specs()]
    where = {name: (k, r) for k, part in enumerate(parts) for r, name in enumerate(part.regimes)}
    metrics = {
        key: np.stack([parts[where[n][0]].metrics[key][:, where[n][1]] for n in names], axis=1)
        for key in parts[0].metrics
    }
    return RunResult(
        config=cfg, regimes=names, policy_names=parts[0].policy_names, steps=parts[0].steps, metrics=metrics,
        rescue_sizes=parts[0].rescue_sizes, wall_s=wall_s,
    )
