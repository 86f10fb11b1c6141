"""A run directory's success matrix (:mod:`shared_interfaces.success_matrix`): written at the end of every
run as ``DIR/success_matrix.json``, and extracted from an existing run directory by
``python -m mrl_llm success-matrix --run DIR [--out FILE]``.

From the run's ``config.json`` and ``eval.jsonl`` (skipped rows left out): the step-0 ``samples``,
``successes`` and ``greedy_correct`` per (policy, prompt) with the prompts' families; ``curve``, each
policy's sample accuracy at every evaluation; ``run``, the settings a simulator mirrors; ``outcomes``, the
run's own regime's final and mean sample accuracy and its rescue rate (the share of the policies'
peer-exclusive prompts, :func:`mrl_llm.evaluate.peer_exclusive_sets`, solved at the last evaluation).
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from mrl_llm.evaluate import peer_exclusive_sets, read_eval_rows, solved
from shared_interfaces.success_matrix import SuccessMatrix, SuccessMatrixError, write_success_matrix

log = logging.getLogger(__name__)

FILE_NAME = "success_matrix.json"


def _run_settings(cfg: dict[str, Any]) -> dict[str, Any]:
    pols = cfg.get("policies") or []
    return {"steps": int(cfg["steps"]), "prompts_per_step": int(cfg["prompts_per_step"]),
            "group_size": max(int(p.get("group_size", 8)) for p in pols), "seed": int(cfg.get("seed", 0)),
            "eval_k": int((cfg.get("eval") or {}).get("k") or 0), "regime": cfg["regime"], "loss": cfg.get("loss") or {}}


def matrix_from_run(run_dir: str | Path) -> SuccessMatrix:
    """The success matrix of one run directory (module docstring); errors name the directory."""
    d = Path(run_dir)
    cfg_path, ev_path = d / "config.json", d / "eval.jsonl"
    if not cfg_path.is_file() or not ev_path.is_file():
        raise SuccessMatrixError(f"{d} is not a run directory with an evaluation (it needs config.json and eval.jsonl)")
    cfg = json.loads(cfg_path.read_text())
    rows = [r for r in read_eval_rows(ev_path) if not r["skipped"]]
    step0 = [r for r in rows if r["step"] == 0]
    if not step0:
        raise SuccessMatrixError(f"{ev_path} has no step-0 evaluation; the success matrix is the runs' start (keep "
                                 "eval enabled)")
    pols = [p["name"] for p in cfg["policies"]]
    prompts = sorted({str(r["prompt_id"]) for r in step0})
    row, col = {p: i for i, p in enumerate(pols)}, {pid: c for c, pid in enumerate(prompts)}
    n = np.zeros((len(pols), len(prompts)), dtype=np.int64)
    s = np.zeros_like(n)
    g = np.full(n.shape, np.nan)
    fam: dict[str, str] = {}
    for r in step0:
        i, c = row[r["policy"]], col[str(r["prompt_id"])]
        n[i, c] += int(r["samples"])
        s[i, c] += int(r["successes"])
        g[i, c] = max(0.0 if np.isnan(g[i, c]) else g[i, c], float(bool(r["greedy_correct"])))
        if r.get("family") is not None:
            fam[str(r["prompt_id"])] = str(r["family"])
    steps, acc = _curve(rows, pols)
    outcomes = {cfg["regime"]["name"]: _outcome(rows, pols, steps, acc)}
    return SuccessMatrix(
        policies=tuple(pols), prompts=tuple(prompts), samples=n, successes=s, greedy_correct=g,
        families=tuple(fam[p] for p in prompts) if len(fam) == len(prompts) else None, run=_run_settings(cfg),
        curve_steps=steps, curve_accuracy=acc, outcomes=outcomes,
    )


def _curve(rows: list[dict], pols: list[str]) -> tuple[np.ndarray, np.ndarray]:
    steps = np.array(sorted({int(r["step"]) for r in rows}))
    tot: dict[tuple[int, str], list[int]] = defaultdict(lambda: [0, 0])
    for r in rows:
        t = tot[(int(r["step"]), r["policy"])]
        t[0] += int(r["successes"])
        t[1] += int(r["samples"])
    acc = np.full((len(pols), len(steps)), np.nan)
    for i, p in enumerate(pols):
        for t, step in enumerate(steps):
            succ, samp = tot.get((int(step), p), (0, 0))
            if samp:
                acc[i, t] = succ / samp
    return steps, acc


def _outcome(rows: list[dict], pols: list[str], steps: np.ndarray, acc: np.ndarray) -> dict[str, Any]:
    last = int(steps[-1])
    excl = peer_exclusive_sets([r for r in rows if r["step"] == 0])
    got = [solved(r) for r in rows if r["step"] == last and str(r["prompt_id"]) in excl.get(r["policy"], set())]
    after = acc[:, 1:] if acc.shape[1] > 1 else acc
    return {"final_accuracy": [float(np.nan_to_num(a)) for a in acc[:, -1]],
            "mean_accuracy": float(np.nanmean(after)) if np.isfinite(after).any() else None,
            "rescue_rate": float(np.mean(got)) if got else None,
            "rescue_set": int(sum(len(v) for v in excl.values())), "seeds": 1}


def write_run_matrix(run_dir: str | Path, out: str | Path | None = None) -> Path | None:
    """Write ``run_dir``'s success matrix (to ``out``, default ``run_dir/success_matrix.json``). At a run's end
    (``out`` None) a run whose start cannot make one (eval disabled, or greedy-only with ``eval.k: 0``) writes
    none, says why in the log and returns ``None``: the run itself succeeded. With ``out`` the error is raised."""
    d = Path(run_dir)
    if out is not None:
        return write_success_matrix(out, matrix_from_run(d))
    rows = read_eval_rows(d / "eval.jsonl")
    if not any(r["step"] == 0 and not r["skipped"] for r in rows):
        return None
    try:
        matrix = matrix_from_run(d)
    except SuccessMatrixError as e:
        log.warning("no %s written for %s: %s", FILE_NAME, d, e)
        return None
    return write_success_matrix(d / FILE_NAME, matrix)
