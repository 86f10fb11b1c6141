"""Fabricated LLM run directories (``config.json``, ``eval.jsonl``, ``summary.json``) in the trainer's format."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

POLICIES = ("alpha", "beta")


def llm_config(regime: str, seed: int = 0, steps: int = 10, prompts_per_step: int = 4, group_size: int = 4,
               k: int = 4, every: int = 5, sgt_weight: float = 0.5) -> dict:
    return {
        "policies": [{"name": p, "group_size": group_size} for p in POLICIES],
        "regime": {"name": regime, "sgt": {"weight": sgt_weight, "successes_per_prompt": 1, "selection": "shortest"},
                   "prp": {"peer_weight": 1.0, "ratio_cap": 2.0}},
        "loss": {"clip_low": 0.2, "clip_high": 0.28, "agg": "token-mean", "kl_coef": 0.0, "max_response_len": 1},
        "data": None, "eval": {"data": None, "every": every, "k": k},
        "name": "fab", "seed": seed, "steps": steps, "prompts_per_step": prompts_per_step,
    }


def eval_rows(step: int, successes: np.ndarray, greedy: np.ndarray, k: int, prompts: list[str]) -> list[dict]:
    """``successes / greedy [P, C]`` -> the trainer's eval rows at ``step``."""
    return [{"step": step, "policy": pol, "prompt_id": pid, "family": pid.split(":")[0], "skipped": False,
             "greedy_correct": int(greedy[i, c]), "greedy_response": "", "samples": k,
             "successes": int(successes[i, c])}
            for i, pol in enumerate(POLICIES) for c, pid in enumerate(prompts)]


def write_run(d: Path, regime: str, per_step: dict[int, tuple[np.ndarray, np.ndarray]], prompts: list[str],
              finished: bool = True, pool: list[str] | None = None, **cfg) -> Path:
    """A run directory whose evaluation at each step of ``per_step`` gives ``(successes, greedy)``; ``pool``: the
    prompts it trained on (default: all of ``prompts``; ``[]``: no ``problems.json``)."""
    pool = list(prompts) if pool is None else (pool or None)
    d.mkdir(parents=True, exist_ok=True)
    conf = llm_config(regime, **cfg)
    (d / "config.json").write_text(json.dumps(conf))
    k = conf["eval"]["k"]
    with open(d / "eval.jsonl", "w") as fh:
        for step in sorted(per_step):
            s, g = per_step[step]
            for r in eval_rows(step, s, g, k, prompts):
                fh.write(json.dumps(r) + "\n")
    if pool is not None:  # what the trainer records at a run's start (mrl_llm.run_problems)
        (d / "problems.json").write_text(json.dumps({
            "format": "mrl-run-problems", "version": 1, "train": list(pool),
            "eval": [{"prompt_id": p, "question": f"What is {p}?", "gold": "1", "verifier": "arithmetic",
                      "choices": [], "family": p.split(":")[0]} for p in prompts]}))
    with open(d / "metrics.jsonl", "w") as fh:  # the sampling entropy of every training step
        for step in range(conf["steps"]):
            for pol in conf["policies"]:
                fh.write(json.dumps({"kind": "train", "step": step, "policy": pol["name"], "entropy": 1.0 - step / 100})
                         + "\n")
    if finished:
        (d / "summary.json").write_text(json.dumps({"regime": regime, "seed": conf["seed"]}))
    return d


def two_family_prompts(n: int = 4) -> list[str]:
    return [f"add:{i}" for i in range(n)] + [f"sub:{i}" for i in range(n)]


def start_counts(n: int = 4, k: int = 4) -> tuple[np.ndarray, np.ndarray]:
    """Policy alpha solves 'add' (2/k .. k/k), never 'sub'; beta the other way round. Every prompt of the
    other family is in the policy's rescue set."""
    s = np.zeros((2, 2 * n), dtype=int)
    s[0, :n] = np.clip(np.arange(n) + 1, 1, k)
    s[1, n:] = np.clip(np.arange(n) + 1, 1, k)
    return s, s > k // 2


def fabricate(root: Path, regimes=("grpo", "xgrpo", "sgt"), seeds=(0,), rescued: dict[str, int] | None = None,
              n: int = 4, steps: int = 10, every: int = 5) -> Path:
    """A demo-style directory ``root/seed<S>/<regime>/``: every regime starts from :func:`start_counts`;
    at each later evaluation the own family gains one success per prompt (capped) and, at the last one,
    regime ``r`` solves the first ``rescued[r]`` rescue prompts of each policy with one success."""
    prompts = two_family_prompts(n)
    k = 4
    s0, g0 = start_counts(n, k)
    for seed in seeds:
        for reg in regimes:
            per_step = {0: (s0, g0)}
            eval_steps = sorted({*range(every, steps + 1, every), steps})
            for j, t in enumerate(eval_steps, start=1):
                s = np.where(s0 > 0, np.minimum(s0 + j, k), 0)
                if t == eval_steps[-1]:
                    m = (rescued or {}).get(reg, 0)
                    s[0, n:n + m] = 1
                    s[1, :m] = 1
                per_step[t] = (s, s > k // 2)
            write_run(root / f"seed{seed}" / reg, reg, per_step, prompts, seed=seed, steps=steps, every=every, k=k)
    return root
