"""The cross-check's SGT weight diagnostic (not a prediction): λ stays the LLM's for the prediction; the scan
reruns the SGT regimes at the fitted settings (:mod:`bandit_sim.fit`) with λ multiplied by each factor, to
say how far the bandit's λ would have to move to match what the LLM's SGT did.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from bandit_sim.config import with_overrides
from bandit_sim.fit import FitCase, FreeSettings, SimOptions, bandit_config, eval_gcd, simulate


def sgt_weight_scan(case: FitCase, regimes: tuple[str, ...], free: FreeSettings, opts: SimOptions,
                    factors: tuple[float, ...], rescue: np.ndarray) -> list[dict[str, Any]]:
    """For each factor ``f``: the SGT ``regimes`` at ``free`` with ``lambda = f * lambda_LLM``; per regime the
    final accuracy (mean over policies and bandit seeds) and the rescue share (mean P(solved) over the
    ``rescue [P, C]`` entries)."""
    out = []
    for f in factors:
        cfg = bandit_config(case.llm_config, regimes, case.scenario.n_contexts, free, opts, case.group_size,
                            eval_gcd(case.fractions, int(case.llm_config["steps"])))
        cfg = with_overrides(cfg, sgt_weight=cfg.sgt.weight * f)
        pred = simulate(case.scenario, cfg, case.eval_k)
        for r, reg in enumerate(pred.regimes):
            q = pred.final_solve_prob[r].mean(axis=0)
            out.append({"factor": f, "sgt_weight": cfg.sgt.weight, "regime": reg,
                        "final": float(pred.curve(reg, np.array([1.0]))[:, 0].mean()),
                        "rescue_rate": float(q[rescue].mean()) if rescue.any() else math.nan})
    return out
