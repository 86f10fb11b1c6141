"""Reading the LLM runs: one trainer run directory per (regime, seed), as ``mrl_llm train`` and the demo
write them (``config.json``, ``eval.jsonl``; row schema in :mod:`mrl_llm.evaluate`).

:func:`discover` accepts ``DIR`` holding the run directories directly (``DIR/<regime>/``), a demo
directory (``DIR/seed<S>/<regime>/``), or one run directory itself. A run's regime is its
``config.json``'s ``regime.name`` in canonical form, its seed ``config.json``'s ``seed``.

Per run (skipped eval rows are left out everywhere):

* :meth:`LLMRun.accuracy_curve` — per policy and evaluation step, the **sample accuracy**
  ``sum successes / sum samples`` over the prompts: the estimate of the mean over prompts of
  ``pi(correct | x)``, which is what the bandit's ``accuracy`` metric is; and the greedy accuracy;
* :meth:`LLMRun.solved` — ``[P, C]`` at a step: greedy answer or any sample correct.

:func:`step0_counts` pools the distinct step-0 evaluations of a seed's runs (every regime starts from
the same weights, so they measure the same policies; identical copies are counted once).
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bandit_sim.calibrate import Counts
from mrl_llm.evaluate import read_eval_rows, solved
from shared_interfaces.regimes.config import parse_regime_config


class RunsError(ValueError):
    """The runs directory cannot be cross-checked; the message says what to change."""


@dataclass(frozen=True)
class LLMRun:
    """One LLM run directory."""

    path: Path
    regime: str
    seed: int
    config: dict[str, Any]
    rows: tuple[dict[str, Any], ...]

    @property
    def policies(self) -> tuple[str, ...]:
        return tuple(p["name"] for p in self.config["policies"])

    @property
    def steps(self) -> int:
        return int(self.config["steps"])

    @property
    def eval_steps(self) -> tuple[int, ...]:
        return tuple(sorted({int(r["step"]) for r in self.rows}))

    @property
    def prompt_ids(self) -> tuple[str, ...]:
        """Prompt ids of the step-0 evaluation, sorted."""
        return tuple(sorted({str(r["prompt_id"]) for r in self.rows if r["step"] == 0 and not r["skipped"]}))

    def _at(self, step: int) -> list[dict[str, Any]]:
        return [r for r in self.rows if r["step"] == step and not r["skipped"]]

    def accuracy_curve(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(steps [T], sample_accuracy [P, T], greedy_accuracy [P, T])`` (module docstring)."""
        steps = np.array(self.eval_steps)
        samp = np.full((len(self.policies), len(steps)), np.nan)
        greedy = np.full_like(samp, np.nan)
        for t, s in enumerate(steps):
            by_pol: dict[str, list[dict]] = defaultdict(list)
            for r in self._at(int(s)):
                by_pol[r["policy"]].append(r)
            for i, name in enumerate(self.policies):
                rs = by_pol.get(name, [])
                n = sum(r["samples"] for r in rs)
                if n:
                    samp[i, t] = sum(r["successes"] for r in rs) / n
                if rs:
                    greedy[i, t] = sum(r["greedy_correct"] for r in rs) / len(rs)
        return steps, samp, greedy

    def solved(self, step: int, prompt_ids: tuple[str, ...]) -> np.ndarray:
        """``[P, C]`` bool: solved at ``step`` (greedy or any sample correct); prompts missing there count as
        unsolved."""
        col = {pid: c for c, pid in enumerate(prompt_ids)}
        row = {name: i for i, name in enumerate(self.policies)}
        out = np.zeros((len(self.policies), len(prompt_ids)), dtype=bool)
        for r in self._at(step):
            c = col.get(str(r["prompt_id"]))
            if c is not None and r["policy"] in row:
                out[row[r["policy"]], c] |= solved(r)
        return out

    def eval_k(self) -> int:
        """Samples per prompt at an evaluation (the run's ``eval.k``, else the most seen in its rows)."""
        k = (self.config.get("eval") or {}).get("k")
        return int(k) if k else max((int(r["samples"]) for r in self.rows), default=0)


def read_run(path: str | Path) -> LLMRun:
    """One run directory (needs ``config.json`` and ``eval.jsonl``)."""
    d = Path(path)
    cfg_path, ev = d / "config.json", d / "eval.jsonl"
    if not cfg_path.is_file() or not ev.is_file():
        raise RunsError(f"{d} is not a trainer run directory (it needs config.json and eval.jsonl)")
    cfg = json.loads(cfg_path.read_text())
    try:
        regime = parse_regime_config(cfg["regime"]).name
    except (KeyError, ValueError) as err:
        raise RunsError(f"{cfg_path}: cannot read the regime ({err})") from err
    rows = tuple(read_eval_rows(ev))
    if not any(r["step"] == 0 for r in rows):
        raise RunsError(f"{ev} has no step-0 evaluation; the cross-check calibrates from it (keep eval enabled)")
    return LLMRun(d, regime, int(cfg.get("seed", 0)), cfg, rows)


def _is_run(d: Path) -> bool:
    return (d / "config.json").is_file() and (d / "eval.jsonl").is_file()


def discover(root: str | Path) -> tuple[dict[int, dict[str, LLMRun]], list[Path]]:
    """``({seed: {regime: run}}, unfinished)`` under ``root`` (module docstring): a run directory without
    ``summary.json`` (written when a run ends) is unfinished and left out. Errors name what is missing."""
    base = Path(root)
    if not base.is_dir():
        raise RunsError(f"--llm-runs {base} is not a directory")
    if _is_run(base):
        dirs = [base]
    else:
        dirs = sorted(d for d in base.iterdir() if d.is_dir() and _is_run(d))
        dirs += sorted(g for d in base.iterdir() if d.is_dir() and not _is_run(d)
                       for g in d.iterdir() if g.is_dir() and _is_run(g))
    if not dirs:
        raise RunsError(f"no run directories (config.json + eval.jsonl) under {base} or its subdirectories; "
                        "pass the demo directory or a directory of `mrl_llm train` runs")
    out: dict[int, dict[str, LLMRun]] = defaultdict(dict)
    unfinished = [d for d in dirs if not (d / "summary.json").is_file()]
    for d in dirs:
        if d in unfinished:
            continue
        run = read_run(d)
        if run.regime in out[run.seed]:
            raise RunsError(f"two runs of regime {run.regime} with seed {run.seed}: {out[run.seed][run.regime].path} "
                            f"and {d}; keep one per (regime, seed)")
        out[run.seed][run.regime] = run
    if not out:
        raise RunsError(f"every run directory under {base} is unfinished (no summary.json): {unfinished[:3]}")
    for seed, runs in out.items():
        check_seed(seed, runs)
    return dict(sorted(out.items())), unfinished


def check_seed(seed: int, runs: dict[str, LLMRun]) -> None:
    """The runs of one seed must train the same policies on the same budget and evaluate the same prompts."""
    if "grpo" not in runs:
        raise RunsError(f"seed {seed} has no grpo run (regimes: {sorted(runs)}); the bandit is fitted on GRPO")
    ref = runs["grpo"]
    for name, run in runs.items():
        for what in ("policies", "steps", "prompt_ids"):
            if getattr(run, what) != getattr(ref, what):
                raise RunsError(f"seed {seed}: run {run.path} differs from {ref.path} in {what}; the runs of one "
                                "seed must share policies, steps and evaluation prompts")
        if run.config.get("prompts_per_step") != ref.config.get("prompts_per_step"):
            raise RunsError(f"seed {seed}: {name} and grpo differ in prompts_per_step")


def distinct_step0(runs: dict[str, LLMRun]) -> list[list[dict[str, Any]]]:
    """The runs' step-0 rows, one list per *distinct* evaluation: runs that start from the same weights
    with the same seed often write identical step-0 rows, and pooling copies would fake precision."""
    seen, out = set(), []
    for reg in sorted(runs):
        rows = [r for r in runs[reg].rows if r["step"] == 0]
        key = tuple(sorted(json.dumps(r, sort_keys=True) for r in rows))
        if key not in seen:
            seen.add(key)
            out.append(rows)
    return out


def step0_counts(runs: dict[str, LLMRun]) -> tuple[Counts, tuple[str, ...], tuple[str, ...]]:
    """Pooled step-0 ``Counts`` of one seed's runs, with the policy names and the sorted prompt ids."""
    ref = runs["grpo"]
    pols, pids = ref.policies, ref.prompt_ids
    row = {name: i for i, name in enumerate(pols)}
    col = {pid: c for c, pid in enumerate(pids)}
    n = np.zeros((len(pols), len(pids)), dtype=np.int64)
    s = np.zeros_like(n)
    g = np.zeros(n.shape, dtype=bool)
    for rows in distinct_step0(runs):
        for r in rows:
            if r["skipped"]:
                continue
            i, c = row[r["policy"]], col[str(r["prompt_id"])]
            n[i, c] += int(r["samples"])
            s[i, c] += int(r["successes"])
            g[i, c] |= bool(r["greedy_correct"])
    missing = [(pols[i], pids[c]) for i, c in zip(*np.nonzero(n == 0), strict=True)]
    if missing:
        raise RunsError(f"no step-0 samples for (policy, prompt) {missing[:3]}{'...' if len(missing) > 3 else ''}; "
                        "the runs need eval.k >= 1 and every policy evaluated on every prompt")
    return Counts(n, s, g), pols, pids


def group_size(run: LLMRun) -> int:
    """The bandit has one G: the policies' common group size (the largest, when they differ)."""
    return max(int(p.get("group_size", 8)) for p in run.config["policies"])
