"""Which prompts a run trained on and what its evaluated prompts were: ``DIR/problems.json``.

A run is given its training problems (the config's ``data`` section, or ``train(problems=...)`` as the demo
and the study do) and an evaluation set (``eval.data``, ``train(eval_problems=...)``, or the training
data's first ``eval.max_prompts``). The run writes, at its start::

    {"format": "mrl-run-problems", "version": 1,
     "train": [prompt ids of the RL pool],
     "eval": [{"prompt_id", "question", "gold", "verifier", "choices", "family"} per evaluated prompt]}

(an evaluated prompt with few-shot examples also has ``"shots"``: a list of such objects, its examples in order)

so that the success matrix can say which evaluated prompts were trained on (its ``split``) and the kernel
(:mod:`mrl_llm.kernel`) can render every evaluated prompt again. A run directory from before this file
falls back, in order, on (:func:`run_split`, :func:`run_eval_problems`):

* the config's ``data`` / ``eval.data`` files (loaded again; the pool is ``data``'s prompts);
* for the pool alone, ``exchange.jsonl``: the data cursor visits the pool epoch by epoch without
  repeats (:mod:`mrl_llm.data.cursor`), so once the run has drawn more prompts than distinct ones it has
  finished an epoch and drawn every pool prompt: the drawn prompts are the pool;
* for the prompts' text alone, the arithmetic task's ids (``add:12+7``,
  :func:`mrl_llm.rewards.arithmetic.problem_from_id`).

Where none decides, the functions raise :class:`~shared_interfaces.success_matrix.SuccessMatrixError`
saying why and what to do.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mrl_llm.data import Problem, ProblemError
from shared_interfaces.success_matrix import SuccessMatrixError

FILE_NAME = "problems.json"
FORMAT = "mrl-run-problems"
VERSION = 1
FIELDS = ("prompt_id", "question", "gold", "verifier", "choices", "family")


def write_run_problems(out: Path, train: Sequence[Problem], evaluated: Sequence[Problem]) -> Path:
    """Write ``out/problems.json`` (module docstring), atomically."""
    doc = {"format": FORMAT, "version": VERSION, "train": [str(p.prompt_id) for p in train],
           "eval": [_row(p) for p in evaluated]}
    path = Path(out) / FILE_NAME
    tmp = path.with_name(f".{FILE_NAME}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(doc) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


def _row(p: Problem) -> dict[str, Any]:
    row = {"prompt_id": str(p.prompt_id), "question": p.question, "gold": p.gold, "verifier": p.verifier,
           "choices": list(p.choices), "family": p.family}
    return {**row, "shots": [_row(s) for s in p.shots]} if p.shots else row


def _problem(row: Any) -> Problem:
    """The :class:`Problem` of a row (with its examples); a ``TypeError`` / ``ProblemError`` when malformed."""
    if not isinstance(row, dict) or set(row) - {"shots"} != set(FIELDS):
        raise TypeError(f"must be an object with exactly {list(FIELDS)} (and optionally 'shots')")
    shots = row.get("shots", [])
    if not isinstance(shots, list):
        raise TypeError("'shots' must be a list of problems")
    fields = {k: row[k] for k in FIELDS}
    return Problem(**{**fields, "choices": tuple(row["choices"] or ())}, shots=tuple(_problem(s) for s in shots))


def read_run_problems(run_dir: Path) -> tuple[set[str], dict[str, Problem]] | None:
    """``(pool ids, evaluated problems by id)`` of ``run_dir/problems.json``, None when the run has none; a
    damaged file is an error naming it."""
    path = Path(run_dir) / FILE_NAME
    if not path.is_file():
        return None
    fix = "the run writes it at its start; remove it to fall back on the config and exchange.jsonl"
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as err:
        raise SuccessMatrixError(f"{path}: not JSON ({err}); {fix}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or doc.get("version") != VERSION:
        raise SuccessMatrixError(f"{path}: not a {FORMAT} version {VERSION} file; {fix}")
    train, ev = doc.get("train"), doc.get("eval")
    if not isinstance(train, list) or not all(isinstance(x, str) for x in train) or not isinstance(ev, list):
        raise SuccessMatrixError(f"{path}: 'train' must be a list of prompt ids and 'eval' a list of problems; {fix}")
    problems: dict[str, Problem] = {}
    for k, row in enumerate(ev):
        try:
            prob = _problem(row)
        except TypeError as err:
            raise SuccessMatrixError(f"{path}: eval[{k}] {err}; {fix}") from None
        except ProblemError as err:
            raise SuccessMatrixError(f"{path}: eval[{k}]: {err}; {fix}") from None
        problems[prob.prompt_id] = prob
    return set(train), problems


def run_split(run_dir: Path, cfg: dict[str, Any], prompts: Sequence[str]) -> list[str]:
    """Per prompt of ``prompts`` (evaluated by the run in ``run_dir``, config mapping ``cfg``) ``"train"`` when it
    is in the run's RL pool, else ``"heldout"`` (module docstring for how the pool is found); an error saying
    why when it cannot be told."""
    pool = _pool(Path(run_dir), cfg)
    return ["train" if p in pool else "heldout" for p in prompts]


def _pool(d: Path, cfg: dict[str, Any]) -> set[str]:
    rec = read_run_problems(d)
    if rec is not None:
        return rec[0]
    if cfg.get("data") is not None:
        return {str(p.prompt_id) for p in _load(d, cfg, "data")}
    drawn = exchange_pool(d / "exchange.jsonl", int(cfg.get("prompts_per_step", 0) or 0))
    if drawn is not None:
        return drawn
    raise SuccessMatrixError(
        f"cannot tell which of {d}'s evaluated prompts it trained on: it has no {FILE_NAME} (runs write one), its "
        f"config has no data section (the problems were given to train()), and exchange.jsonl does not show a whole "
        f"epoch of the pool; train the run again with this version, or extract its matrix with an older one")


def exchange_pool(path: Path, prompts_per_step: int) -> set[str] | None:
    """The pool's prompt ids from a run's ``exchange.jsonl`` when the run drew more prompts (``steps seen x
    prompts_per_step``) than distinct ones (it finished an epoch, so it drew them all); None otherwise."""
    if not path.is_file() or prompts_per_step < 1:
        return None
    steps: set[int] = set()
    ids: set[str] = set()
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            try:
                r = json.loads(line)
            except ValueError:
                continue  # a stopped run's torn last line
            if isinstance(r, dict) and "step" in r and "prompt_id" in r:
                steps.add(int(r["step"]))
                ids.add(str(r["prompt_id"]))
    return ids if ids and len(steps) * prompts_per_step > len(ids) else None


def run_eval_problems(run_dir: Path, cfg: dict[str, Any], prompts: Sequence[str]) -> dict[str, Problem]:
    """The problems of ``prompts`` (evaluated by the run in ``run_dir``) by id (module docstring); an error
    naming the first prompt whose text cannot be found."""
    d = Path(run_dir)
    rec = read_run_problems(d)
    found: dict[str, Problem] = dict(rec[1]) if rec is not None else {}
    for key in ("eval.data", "data"):
        if rec is None and all(p not in found for p in prompts) and _section(cfg, key) is not None:
            found.update({str(p.prompt_id): p for p in _load(d, cfg, key)})
    from mrl_llm.rewards.arithmetic import problem_from_id

    missing = []
    for p in prompts:
        if p not in found:
            prob = problem_from_id(p)
            if prob is None:
                missing.append(p)
            else:
                found[p] = prob
    if missing:
        raise SuccessMatrixError(f"{d}: the text of prompt {missing[0]!r} (and {len(missing) - 1} more) is not "
                                 f"recorded: the run has no {FILE_NAME} and its config names no data file holding "
                                 "them; train the run again with this version")
    return {p: found[p] for p in prompts}


def _section(cfg: dict[str, Any], key: str) -> Any:
    head, _, rest = key.partition(".")
    v = cfg.get(head)
    return (v or {}).get(rest) if rest else v


def _load(d: Path, cfg: dict[str, Any], key: str) -> list[Problem]:
    from mrl_llm.data import DataConfig
    from mrl_llm.run_setup import load_problems
    from shared_interfaces.config_io import ConfigError, from_mapping

    try:
        report = load_problems(from_mapping(DataConfig, _section(cfg, key), where=f"{d}/config.json {key}"))
    except (ConfigError, OSError, ValueError) as err:
        raise SuccessMatrixError(f"{d}: cannot load the run's {key} again to tell its prompts ({err}); put the "
                                 "dataset back where config.json names it") from None
    return list(report.problems)
