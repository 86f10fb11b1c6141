"""The evaluation protocol: greedy accuracy, pass@k, and accuracy on each policy's peer-exclusive prompts.

For every (step, policy, prompt) a policy answers once greedily and samples ``k`` responses
(:meth:`mrl_llm.worker.LLMPolicyWorker.evaluate`); ``eval.jsonl`` gets one row each::

    {"step", "policy", "prompt_id", "family", "skipped", "greedy_correct", "samples", "successes", ...}

* ``eval_accuracy`` = mean ``greedy_correct``; ``pass_at_k`` = fraction of prompts with a success among
  the ``k`` samples (with n = k samples the unbiased pass@k estimator is exactly this). Skipped
  prompts (an unusable gold answer) count in neither.
* A prompt is *solved* by a policy at a step when its greedy answer or any of its samples is correct.
  Policy i's **peer-exclusive prompts** are those it did not solve at step 0 (before training) while
  some other policy did. ``peer_exclusive_accuracy`` is policy i's greedy accuracy on that set at a
  later step (None when the set is empty) — what sharing can transfer.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from shared_interfaces.config_io import ConfigError


def solved(row: Mapping[str, Any]) -> bool:
    return not row["skipped"] and (row["greedy_correct"] > 0 or row["successes"] > 0)


def peer_exclusive_sets(step0_rows: Iterable[Mapping[str, Any]]) -> dict[str, set[str]]:
    """``{policy: prompt ids only some other policy solved at step 0}`` (module docstring)."""
    by_prompt: dict[str, dict[str, bool]] = defaultdict(dict)
    for r in step0_rows:
        by_prompt[r["prompt_id"]][r["policy"]] = solved(r)
    policies = sorted({p for d in by_prompt.values() for p in d})
    out: dict[str, set[str]] = {p: set() for p in policies}
    for pid, d in by_prompt.items():
        for p in policies:
            if p in d and not d[p] and any(v for q, v in d.items() if q != p):
                out[p].add(pid)
    return out


def summarize(rows: Sequence[Mapping[str, Any]], exclusive: Mapping[str, set[str]] | None = None) -> dict[str, dict]:
    """Per policy: ``eval_accuracy``, ``pass_at_k``, ``peer_exclusive_accuracy``, ``peer_exclusive_n``, ``n``."""
    by_policy: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for r in rows:
        if not r["skipped"]:
            by_policy[r["policy"]].append(r)
    out = {}
    for p, rs in sorted(by_policy.items()):
        excl = (exclusive or {}).get(p, set())
        ex_rows = [r for r in rs if r["prompt_id"] in excl]
        k_rows = [r for r in rs if r["samples"] > 0]
        out[p] = {
            "n": len(rs),
            "eval_accuracy": sum(r["greedy_correct"] for r in rs) / len(rs),
            "pass_at_k": sum(r["successes"] > 0 for r in k_rows) / len(k_rows) if k_rows else None,
            "peer_exclusive_n": len(ex_rows),
            "peer_exclusive_accuracy": (sum(r["greedy_correct"] for r in ex_rows) / len(ex_rows)) if ex_rows else None,
        }
    return out


def read_eval_rows(path: str | Path) -> list[dict[str, Any]]:
    p = Path(path)
    if not p.is_file():
        return []
    return [json.loads(line) for line in p.read_text(encoding="utf-8").splitlines() if line.strip()]


def evaluate_workers(workers: Mapping[str, Any], problems: Sequence[Any], *, step: int, k: int, temperature: float,
                     top_p: float, max_new_tokens: int | None) -> list[dict[str, Any]]:
    """Every worker's eval rows at ``step`` (policies in the mapping's order)."""
    rows = []
    for name, w in workers.items():
        for r in w.evaluate(problems, step=step, k=k, temperature=temperature, top_p=top_p,
                            max_new_tokens=max_new_tokens):
            rows.append({"step": step, "policy": name, **r})
    return rows


#: ``mrl_llm eval``'s flag for each dataset setting a message may name (:func:`evaluate_saved_policy`), specific first.
EVAL_FLAGS = (("data.fields.question", "--question-field"), ("data.fields.answer", "--answer-field"),
              ("data.fields", "--question-field / --answer-field"),
              ("fields.question and fields.answer", "--question-field and --answer-field"),
              ("data.answer_format", "--answer-format"), ("remove answer_format", "remove --answer-format"),
              ("data.limit", "--max-prompts"),
              ("data.path in the config", "--data"))


def _in_eval_flags(err: BaseException) -> str:
    """A dataset error's text with the config keys it names replaced by ``mrl_llm eval``'s flags."""
    msg = str(err)
    for key, flag in EVAL_FLAGS:
        msg = msg.replace(key, flag)
    return msg


def check_eval_args(*, k: int, temperature: float, max_new_tokens: int | None, max_prompts: int | None) -> None:
    """The numbers of an evaluation, as ``mrl_llm eval`` takes them: ``k`` >= 0 (0: greedy only), ``temperature``
    finite and > 0, ``max_new_tokens`` and ``max_prompts`` >= 1 or None (the policy's own; every prompt).
    :class:`ConfigError` naming the flag."""
    def whole(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool)

    if not whole(k) or k < 0:
        raise ConfigError(f"--k must be an integer >= 0 (samples per prompt for pass@k; 0: greedy only), got {k!r}")
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not (
            math.isfinite(temperature) and temperature > 0):
        raise ConfigError(f"--temperature must be a finite number > 0, got {temperature!r}")
    if max_new_tokens is not None and (not whole(max_new_tokens) or max_new_tokens < 1):
        raise ConfigError(f"--max-new-tokens must be an integer >= 1 (leave it out for the policy's own "
                          f"sampling.max_new_tokens), got {max_new_tokens!r}")
    if max_prompts is not None and (not whole(max_prompts) or max_prompts < 1):
        raise ConfigError(f"--max-prompts must be an integer >= 1 (leave it out for every row), got {max_prompts!r}")


def evaluate_saved_policy(policy_dir: str | Path, data_path: str | Path, *, verifier: str = "math", k: int = 4,
                          temperature: float = 1.0, top_p: float = 1.0, max_new_tokens: int | None = None,
                          max_prompts: int | None = None, seed: int = 0,
                          question_field: str = "question", answer_field: str = "answer",
                          answer_format: str = "boxed") -> dict[str, Any]:
    """Evaluate a saved policy directory on a JSONL file: ``{"summary": ..., "rows": [...]}``
    (``answer_format``: the MATH verifier's, see :class:`mrl_llm.data.DataConfig`).

    The arguments are ``mrl_llm eval``'s flags (:func:`check_eval_args`) and its errors name them. Everything
    cheap is checked before the model is built: the arguments, the policy's ``mrl_policy.json``
    (:func:`mrl_llm.models.read_policy_meta`), the verifier and the whole dataset."""
    from mrl_llm import rewards
    from mrl_llm.config import POLICY_NAME, PolicyConfig, SamplingSection
    from mrl_llm.data import DataConfig, DataError, FieldMap, load_jsonl
    from mrl_llm.models import POLICY_META, read_policy_meta
    from mrl_llm.templates import TemplateConfig
    from mrl_llm.worker import LLMPolicyWorker, WorkerConfig
    from shared_interfaces.config_io import from_mapping

    check_eval_args(k=k, temperature=temperature, max_new_tokens=max_new_tokens, max_prompts=max_prompts)
    try:
        cfg = DataConfig(path=str(data_path), verifier=verifier, limit=max_prompts, answer_format=answer_format,
                         fields=FieldMap(question=question_field, answer=answer_field))
    except DataError as err:
        raise DataError(_in_eval_flags(err)) from err
    d = Path(policy_dir)
    if not (d / "config.json").is_file():
        raise ConfigError(f"{d} is not a saved policy (no {d / 'config.json'}); pass a run's DIR/policies/<name>, or any "
                          "HF model directory with its tokenizer")
    if not Path(data_path).is_file():
        raise ConfigError(f"evaluation data {data_path} is not a file; pass a JSONL file of question/answer rows")
    meta = read_policy_meta(d)
    meta_path = d / POLICY_META
    name = str(meta.get("name") or d.name).replace("/", "_")
    name = name if POLICY_NAME.fullmatch(name) else "policy"  # a name saved before names had a rule
    sampling = dict(meta.get("sampling") or {})
    if max_new_tokens is not None:
        sampling["max_new_tokens"] = max_new_tokens
    template = from_mapping(TemplateConfig, meta.get("template") or {}, where=f"{meta_path}: template")
    pol = PolicyConfig(name=name, model_dir=str(d), template=template, dtype=meta.get("dtype", "fp32"),
                       sampling=from_mapping(SamplingSection, sampling, where=f"{meta_path}: sampling"))
    options = cfg.verifier_options()
    v = rewards.get_verifier(verifier, **options)
    worker = None
    try:
        try:
            report = load_jsonl(cfg, check_gold=rewards.gold_checker(v))
        except DataError as err:
            raise DataError(_in_eval_flags(err)) from err
        worker = LLMPolicyWorker(name, WorkerConfig(policy=pol, track_ref_kl=False,
                                                    verifier_options={verifier: options}), seed=seed)
        rows = evaluate_workers({name: worker}, list(report.problems), step=int(meta.get("version", 0)), k=k,
                                temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens)
    finally:
        rewards.close_verifier(v)
        if worker is not None:
            worker.close()
    return {"policy": name, "data": str(data_path), "skipped_rows": len(report.skipped),
            "summary": summarize(rows)[name], "rows": rows}
