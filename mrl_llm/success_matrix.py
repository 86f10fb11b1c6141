"""A run directory's success matrix (:mod:`shared_interfaces.success_matrix`): written at the end of every
run as ``DIR/success_matrix.json``, and extracted from an existing run directory by
``python -m mrl_llm success-matrix --run DIR [--out FILE]``.

From the run's ``config.json`` and ``eval.jsonl`` (skipped rows left out): the step-0 ``samples``,
``successes`` and ``greedy_correct`` per (policy, prompt) with the prompts' families; ``curve``, each
policy's sample accuracy at every evaluation; ``run``, the settings a simulator mirrors; ``outcomes``, the
run's own regime's final and mean sample accuracy and its rescue rate (the share of the policies'
peer-exclusive prompts, :func:`mrl_llm.evaluate.peer_exclusive_sets`, solved at the last evaluation); ``split``,
which prompts were the run's RL pool and which it only evaluated (:func:`mrl_llm.run_problems.run_split`: a
run that cannot tell is an error saying why).

A damaged or hand-edited run directory is an error naming the file (and the ``eval.jsonl`` line) and the fix:
corrupt JSON, a missing key, a row of a policy the config does not have, or a second row for one (step,
policy, prompt) — a run writes each once (a resumed run cuts ``eval.jsonl`` back and does not evaluate a step
again), so a repeat is damage, not data. ``--out`` may be a directory: the matrix is written into it as
``success_matrix.json``.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from mrl_llm.evaluate import peer_exclusive_sets, read_eval_rows, solved
from mrl_llm.run_problems import run_split
from mrl_llm.runstate import read_json_object
from shared_interfaces.config_io import ConfigError
from shared_interfaces.success_matrix import SuccessMatrix, SuccessMatrixError, write_success_matrix

log = logging.getLogger(__name__)

FILE_NAME = "success_matrix.json"


CONFIG_FIX = "train writes it at a run's start: restore it from the experiment's YAML config"


def read_run_config(path: Path, error: type[ConfigError] = SuccessMatrixError) -> dict[str, Any]:
    """``config.json`` of a run, checked for what the success matrix and the dynamics read; ``error`` (the reader's
    error class) names the file and the key."""
    cfg = read_json_object(path, CONFIG_FIX, error)
    for key in ("policies", "regime", "steps", "prompts_per_step"):
        if key not in cfg:
            raise error(f"{path} has no {key!r}; {CONFIG_FIX}")
    pols = cfg["policies"]
    if not isinstance(pols, list) or not pols or not all(isinstance(p, dict) and isinstance(p.get("name"), str)
                                                         for p in pols):
        raise error(f"{path}: 'policies' is not a list of policies with a 'name' each; {CONFIG_FIX}")
    if not isinstance(cfg["regime"], dict) or not isinstance(cfg["regime"].get("name"), str):
        raise error(f"{path}: 'regime' has no 'name' (e.g. {{\"name\": \"sgt\"}}); {CONFIG_FIX}")
    for key in ("data", "eval", "loss"):
        if cfg.get(key) is not None and not isinstance(cfg[key], dict):
            raise error(f"{path}: {key!r} is {cfg[key]!r}, not a section (an object) or null; {CONFIG_FIX}")
    ev = cfg.get("eval") or {}
    if ev.get("data") is not None and not isinstance(ev["data"], dict):
        raise error(f"{path}: 'eval.data' is {ev['data']!r}, not a section or null; {CONFIG_FIX}")
    ints = [("steps", cfg["steps"], 1), ("prompts_per_step", cfg["prompts_per_step"], 1), ("seed", cfg.get("seed", 0), 0),
            ("eval.k", ev.get("k", 4), 0),
            *((f"policies[{i}].group_size", p.get("group_size", 8), 1) for i, p in enumerate(pols))]
    for key, v, lo in ints:
        if not _is_int(v, lo):
            raise error(f"{path}: {key} is {v!r}, not a whole number >= {lo}; {CONFIG_FIX}")
    if cfg.get("name") is not None and not isinstance(cfg["name"], str):
        raise error(f"{path}: 'name' is {cfg['name']!r}, not a string or null; {CONFIG_FIX}")
    return cfg


def _is_int(v: Any, lo: int | None = None) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and (lo is None or v >= lo)


def read_run_eval(path: Path, policies: list[str], config: Path) -> list[dict[str, Any]]:
    """The rows of a run's ``eval.jsonl``, checked: every row a JSON object with ``step``, ``policy`` (one of
    ``policies``, from ``config``), ``prompt_id`` and ``skipped``, and a non-skipped row with whole-number
    ``samples`` >= ``successes`` >= 0 and ``greedy_correct``; one row per (step, policy, prompt) (module
    docstring). Errors name the file and line."""
    rows: list[dict[str, Any]] = []
    first: dict[tuple[int, str, str], int] = {}
    lines = path.read_text(encoding="utf-8").split("\n")
    for k, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{path}, line {k}"
        try:
            r = json.loads(line)
        except ValueError as err:
            torn = " (a stopped run's torn last line: train --resume drops it)" if k == len(lines) else ""
            raise SuccessMatrixError(f"{where}: not a JSON row ({err}); repair or remove the line{torn}") from None
        if not isinstance(r, dict):
            raise SuccessMatrixError(f"{where}: not a JSON object; repair or remove the line")
        need = ("step", "policy", "prompt_id", "skipped") + (() if r.get("skipped") is True else
                                                              ("samples", "successes", "greedy_correct"))
        missing = [f for f in need if f not in r]
        if missing:
            raise SuccessMatrixError(f"{where}: the row has no {', '.join(map(repr, missing))}; an evaluation row "
                                     f"has {', '.join(need)} — repair or remove the line")
        bad = _bad_eval_value(r)
        if bad:
            raise SuccessMatrixError(f"{where}: {bad}; repair or remove the line")
        if r["policy"] not in policies:
            raise SuccessMatrixError(f"{where}: policy {r['policy']!r} is not one of {config}'s policies "
                                     f"({', '.join(policies)}); fix the row's policy or remove the line")
        key = (r["step"], r["policy"], str(r["prompt_id"]))
        if key in first:
            raise SuccessMatrixError(f"{where}: a second row for step {key[0]}, policy {key[1]!r}, prompt "
                                     f"{key[2]!r} (the first is line {first[key]}); a run writes one per evaluation "
                                     "— remove the repeated line")
        first[key] = k
        rows.append(r)
    return rows


def _bad_eval_value(r: dict[str, Any]) -> str | None:
    """What is wrong with a value of eval row ``r`` (its keys present), or None."""
    if not _is_int(r["step"]) or r["step"] < 0:
        return f"step is {r['step']!r}, not a step number"
    if not isinstance(r["policy"], str):
        return f"policy is {r['policy']!r}, not a policy name"
    if not isinstance(r["prompt_id"], str) and not _is_int(r["prompt_id"]):
        return f"prompt_id is {r['prompt_id']!r}, not a prompt id"
    if not isinstance(r["skipped"], bool):
        return f"skipped is {r['skipped']!r}, not true or false"
    if r["skipped"]:
        return None
    if not all(_is_int(r[f]) and r[f] >= 0 for f in ("samples", "successes")) or r["successes"] > r["samples"]:
        return f"samples {r['samples']!r} and successes {r['successes']!r} are not counts with successes <= samples"
    if r["greedy_correct"] not in (0, 1):
        return f"greedy_correct is {r['greedy_correct']!r}, not 0 or 1"
    return None


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
    cfg = read_run_config(cfg_path)
    pols = [p["name"] for p in cfg["policies"]]
    rows = [r for r in read_run_eval(ev_path, pols, cfg_path) if not r["skipped"]]
    step0 = [r for r in rows if r["step"] == 0]
    if not step0:
        raise SuccessMatrixError(f"{ev_path} has no step-0 evaluation; the success matrix is the runs' start (keep "
                                 "eval enabled)")
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
    split = run_split(d, cfg, prompts)
    return SuccessMatrix(
        policies=tuple(pols), prompts=tuple(prompts), samples=n, successes=s, greedy_correct=g,
        families=tuple(fam[p] for p in prompts) if len(fam) == len(prompts) else None, run=_run_settings(cfg),
        curve_steps=steps, curve_accuracy=acc, outcomes=outcomes, split=tuple(split),
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
    """Write ``run_dir``'s success matrix (to ``out``, a file or a directory to write ``success_matrix.json``
    into, :func:`output_path`; default ``run_dir/success_matrix.json``). At a run's end
    (``out`` None) a run whose start cannot make one (eval disabled, or greedy-only with ``eval.k: 0``) writes
    none, says why in the log and returns ``None``: the run itself succeeded. With ``out`` the error is raised."""
    d = Path(run_dir)
    if out is not None:
        matrix = matrix_from_run(d)
        return write_success_matrix(output_path(out), matrix)
    rows = read_eval_rows(d / "eval.jsonl")
    if not any(r["step"] == 0 and not r["skipped"] for r in rows):
        return None
    try:
        matrix = matrix_from_run(d)
    except SuccessMatrixError as e:
        log.warning("no %s written for %s: %s", FILE_NAME, d, e)
        return None
    return write_success_matrix(d / FILE_NAME, matrix)


def output_path(out: str | Path) -> Path:
    """The file ``--out`` names: ``out`` itself, or ``out/success_matrix.json`` when ``out`` is a directory. A
    path under an existing file, or a directory in the way of the file, is an error saying what to pass."""
    from shared_interfaces.out_paths import check_out_file

    p = Path(out)
    if p.is_dir():
        p = p / FILE_NAME
        if p.is_dir():
            raise SuccessMatrixError(f"{p} is a directory; remove it or pass --out FILE")
    check_out_file(p, "--out", example=FILE_NAME)
    return p
