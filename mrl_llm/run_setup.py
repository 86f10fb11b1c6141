"""What both runtimes set a run up with: problems, worker configs, actor specs, evaluation rows, the summary.

The in-process and the Ray backends of :mod:`mrl_llm.runner` (and the Ray setup in
:mod:`mrl_llm.distributed.ray_trainer`) import these; this module imports neither runtime, so there is
no import cycle between them.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mrl_llm.config import RunConfig
from mrl_llm.data import DataConfig, DataCursor, LoadReport, Problem, load_jsonl
from mrl_llm.data.shots import ShotsError, attach_shots, check_apart
from mrl_llm.distributed.actors import PolicyActorSpec
from mrl_llm.evaluate import peer_exclusive_sets, summarize
from mrl_llm.metrics import TIMES, MetricsLog, read_metrics
from mrl_llm.rollout.base import generation_eos_ids
from mrl_llm.worker import WorkerConfig
from shared_interfaces.config_io import ConfigError, to_mapping
from shared_interfaces.regimes import idle_signal_warnings

log = logging.getLogger("mrl_llm.trainer")

#: :class:`DataUse` ``source`` of training problems passed to ``train()`` (not loaded from the config's ``data``)
GIVEN_PROBLEMS = "the problems given to train()"
#: :class:`DataUse` ``source`` of an evaluation set taken from the training problems (no ``eval.data``)
EVAL_ON_TRAINING = "the training problems"


@dataclass(frozen=True)
class DataUse:
    """How one problem set of a run was obtained, for ``summary.json``'s ``data``: ``rows`` read (the problems
    given, when the caller passed them), ``skipped_rows`` the loader skipped (malformed under ``on_malformed:
    skip``, or a gold answer the verifier cannot use), ``skipped_prompts`` too long for a policy (preflight,
    under ``on_malformed: skip``) and ``problems`` used."""

    source: str
    rows: int
    skipped_rows: int
    skipped_prompts: int
    problems: int


@dataclass(frozen=True)
class RunProblems:
    """A run's training problems and evaluation set, with how each was obtained (:class:`DataUse`)."""

    train: list[Problem]
    eval: list[Problem]
    use: dict[str, DataUse]


def load_problems(data: DataConfig) -> LoadReport:
    """A dataset as :class:`mrl_llm.data.LoadReport`; rows whose gold answer the verifier cannot use are
    skipped (counted, warned)."""
    from mrl_llm import rewards

    v = rewards.get_verifier(data.verifier, **data.verifier_options())
    try:
        report = load_jsonl(data, check_gold=rewards.gold_checker(v))
    finally:
        rewards.close_verifier(v)
    if report.skipped:
        log.warning("%s", report.summary())
    return report


def resolve_problems(config: RunConfig, problems: Sequence[Problem] | None,
                     eval_problems: Sequence[Problem] | None) -> RunProblems:
    """The run's training problems and its evaluation set (at most ``eval.max_prompts``): the given ones,
    else loaded from the config's ``data`` / ``eval.data`` (evaluation defaults to the training data).
    Before any model loads, the policies' tokenizers and model configs are checked and every prompt must
    fit every policy's ``max_prompt_len`` (:mod:`mrl_llm.preflight`: an error, or skipped and counted
    under the dataset's ``on_malformed: skip``); ``prompts_per_step`` may not exceed the prompts that remain.
    With a ``few_shot`` section every problem of both sets gets its examples first (:func:`with_shots`), so the
    length check counts them."""
    from mrl_llm.preflight import check_model_configs, fit_prompts

    if problems is None:
        if config.data is None:
            raise ConfigError("config has no data section; add data: {path: FILE.jsonl, verifier: math}")
        report = load_problems(config.data)
        problems, source, rows, skipped_rows = list(report.problems), config.data.path, report.n_rows, len(report.skipped)
    else:
        problems, source, rows, skipped_rows = list(problems), GIVEN_PROBLEMS, len(problems), 0
    tokenizers = check_model_configs(config)
    examples = few_shot_examples(config)
    problems = with_shots(config, examples, problems, "the RL pool (data)")
    train_mode = config.data.on_malformed if config.data is not None else "error"
    problems, long = fit_prompts(config, problems, on_malformed=train_mode, tokenizers=tokenizers, source=source)
    if not problems:
        raise ConfigError("the run has no training problems; give a dataset with at least prompts_per_step rows")
    if config.prompts_per_step > len(problems):
        raise ConfigError(f"prompts_per_step {config.prompts_per_step} exceeds the {len(problems)} training prompts "
                          f"(a step would draw prompts twice); set prompts_per_step <= {len(problems)} or add data")
    use = {"train": DataUse(source, rows, skipped_rows, len(long), len(problems))}
    ev = config.eval.data
    if eval_problems is None and ev is not None:
        report = load_problems(ev)
        eval_problems, ev_source, ev_rows, ev_skipped = list(report.problems), ev.path, report.n_rows, len(report.skipped)
    elif eval_problems is not None:
        eval_problems = list(eval_problems)
        ev_source, ev_rows, ev_skipped = "the evaluation problems given to train()", len(eval_problems), 0
    if eval_problems is not None:
        eval_problems = with_shots(config, examples, eval_problems, "the evaluated prompts (eval.data)")
    else:
        eval_set = problems[: config.eval.max_prompts]
        use["eval"] = DataUse(EVAL_ON_TRAINING, len(eval_set), 0, 0, len(eval_set))
        return RunProblems(problems, eval_set, use)
    eval_set, ev_long = fit_prompts(config, eval_problems[: config.eval.max_prompts], tokenizers=tokenizers,
                                    on_malformed=ev.on_malformed if ev is not None else train_mode, source=ev_source)
    use["eval"] = DataUse(ev_source, ev_rows, ev_skipped, len(ev_long), len(eval_set))
    return RunProblems(problems, eval_set, use)


def few_shot_examples(config: RunConfig) -> list[Problem]:
    """The examples of the run's ``few_shot`` section (:mod:`mrl_llm.data.shots`); none when ``shots`` is 0."""
    fs = config.few_shot
    if fs.shots == 0 or fs.data is None:
        return []
    examples = list(load_problems(fs.data).problems)
    if not examples:
        raise ConfigError(f"few_shot.data {fs.data.path} holds no problems; give examples or set few_shot.shots: 0")
    return examples


def with_shots(config: RunConfig, examples: Sequence[Problem], problems: Sequence[Problem], what: str) -> list[Problem]:
    """``problems`` with their few-shot examples drawn (:func:`mrl_llm.data.shots.attach_shots`), after checking that
    no example is one of them (``what``: which set, for the error); the problems as they are without examples."""
    if config.few_shot.shots == 0:
        return list(problems)
    try:
        check_apart(examples, problems, what)
        return attach_shots(problems, examples, config.few_shot)
    except ShotsError as err:
        raise ConfigError(str(err)) from None


def setup_warnings(config: RunConfig) -> list[str]:
    """What in ``config`` trains less than it looks like, one message each (the run logs them at its start):
    the core's :func:`shared_interfaces.regimes.idle_signal_warnings` (one policy, a group of one), and a
    ``top_p < 1`` peer under ``prp_thl``, whose recorded behaviour log-probs are over the full vocabulary
    (:mod:`mrl_llm.rollout.base`) while it sampled from the renormalised nucleus, so the correction
    ``pi_old / mu`` is overstated by ``1 / Z`` per token (``Z``: the nucleus mass; capped at ``ratio_cap``)."""
    spec = config.regime_spec
    out = idle_signal_warnings(spec, {p.name: p.group_size for p in config.policies})
    nucleus = [p.name for p in config.policies if p.sampling.top_p < 1]
    if spec.denominator == "thl" and nucleus and len(config.policies) > 1:
        out.append(f"regime {spec.name}: policies {nucleus} sample with top_p < 1 but record full-vocabulary "
                   "behaviour log-probs, so a learner's correction pi_old / mu on their rollouts is overstated by "
                   "1 / (nucleus mass) per token; set sampling.top_p: 1.0 or use prp_snapshot")
    return out


def log_eval(log: MetricsLog, rows: list[dict[str, Any]], names: Sequence[str], t: int, regime: str,
             exclusive: dict[str, set[str]]) -> dict[str, set[str]]:
    """Write evaluation ``t``'s per-prompt ``rows`` to ``eval.jsonl`` and one ``kind: eval`` metrics row per
    policy of ``names``; returns the peer-exclusive prompt sets (measured at t = 0, else ``exclusive``).
    Both runtimes call it, so their evaluation output cannot drift apart."""
    if t == 0:
        exclusive = peer_exclusive_sets(rows)
    log.eval_rows(rows)
    summ = summarize(rows, exclusive)
    log.metrics([{"kind": "eval", "step": t, "policy": n, "regime": regime, **summ.get(n, {})} for n in names])
    return exclusive


def unique_prompts(batch: Sequence[Problem]) -> list[Problem]:
    """The batch without repeated prompt ids (a batch that spans two epochs can draw a prompt twice; a
    prompt is one group of the exchange, so its second draw is dropped, with a log line)."""
    seen: set[str] = set()
    out = [p for p in batch if not (str(p.prompt_id) in seen or seen.add(str(p.prompt_id)))]
    if len(out) < len(batch):
        log.info("dropped %d repeated prompt(s) from a batch spanning an epoch boundary", len(batch) - len(out))
    return out


def verifier_options(config: RunConfig) -> dict[str, dict[str, Any]]:
    """Verifier constructor options by verifier name, from the ``data`` and ``eval.data`` sections; two
    sections that configure one verifier differently are an error naming the keys."""
    out: dict[str, dict[str, Any]] = {}
    for where, d in (("data", config.data), ("eval.data", config.eval.data)):
        if d is None:
            continue
        opts = d.verifier_options()
        if d.verifier in out and out[d.verifier] != opts:
            diff = sorted(k for k in opts if opts[k] != out[d.verifier].get(k))
            raise ConfigError(f"{where} configures verifier {d.verifier!r} with {diff} different from data "
                              f"({ {k: out[d.verifier][k] for k in diff} } vs { {k: opts[k] for k in diff} }); "
                              "a run scores with one setting per verifier: make them equal")
        out[d.verifier] = opts
    return out


def worker_config(config: RunConfig, name: str) -> dict[str, Any]:
    """The plain mapping a policy's worker is built from (also what a Ray actor receives)."""
    pol = config.policy(name)
    toks = tuple(dict.fromkeys(p.tokenizer_path for p in config.policies if p.tokenizer_path))
    eos = {p.name: list(generation_eos_ids(p.model_dir)) for p in config.policies if p.model_dir}
    return to_mapping(WorkerConfig(policy=pol, loss=config.loss, tokenizers=toks,
                                   peer_eos_ids={k: v for k, v in eos.items() if v},
                                   track_ref_kl=config.track_ref_kl, max_nan_steps=config.max_nan_steps,
                                   init_seed=pol.init_seed, verifier_options=verifier_options(config)))


def actor_specs(config: RunConfig, ckpt_root: Path) -> list[PolicyActorSpec]:
    threads = config.threads or torch.get_num_threads()
    return [PolicyActorSpec(name=p.name, factory="mrl_llm.worker:build", config=worker_config(config, p.name),
                            seed=config.seed, regime=dict(config.regime), checkpoint_dir=str(ckpt_root / p.name),
                            checkpoint_every=0, threads=threads)
            for p in config.policies]


def run_summary(cfg: RunConfig, out: Path, counters: dict[str, dict[str, float]], wall_s: float,
                data: dict[str, DataUse] | None = None) -> dict[str, Any]:
    """``summary.json`` of a run from its ``metrics.jsonl``, each policy's worker counters and how its problem
    sets were obtained (``data``: :class:`DataUse` per set, skips counted)."""
    rows = read_metrics(out / "metrics.jsonl")
    regime = cfg.regime_spec.name
    pols = []
    for n, c in counters.items():
        train_rows = [r for r in rows if r["kind"] == "train" and r["policy"] == n]
        evals = [r for r in rows if r["kind"] == "eval" and r["policy"] == n]
        last_t = train_rows[-1] if train_rows else {}
        last_e = evals[-1] if evals else {}
        pols.append({
            "name": n,
            "eval_accuracy": last_e.get("eval_accuracy"), "pass_at_k": last_e.get("pass_at_k"),
            "peer_exclusive_accuracy": last_e.get("peer_exclusive_accuracy"),
            "peer_exclusive_n": last_e.get("peer_exclusive_n"),
            "eval_accuracy_start": evals[0].get("eval_accuracy") if evals else None,
            "kl_to_ref": last_t.get("kl_to_ref"), "entropy": last_t.get("entropy"),
            "reward_mean": last_t.get("reward_mean"),
            "sgt_activations": sum(r.get("sgt_activations") or 0 for r in train_rows),
            "nan_skipped_steps": c.get("nan_skipped_steps", 0.0),
            "compute": {k: c.get(k, 0.0) for k in ("samples", "gen_tokens", "train_tokens", "flops", "optimizer_steps")},
            "time_s": {k: sum(r.get(k) or 0.0 for r in train_rows) for k in TIMES},
            "policy_dir": str(out / "policies" / n),
        })
    return {"name": cfg.name, "regime": regime, "seed": cfg.seed, "steps": cfg.steps, "runtime": cfg.runtime.backend,
            "policies": pols, "data": {k: to_mapping(v) for k, v in (data or {}).items()},
            "wall_s_this_session": wall_s, "out_dir": str(out)}


class Batches:
    """``problems_for_step``: the data cursor's batches (repeats dropped, :func:`unique_prompts`), drawn once
    per step in step order, so step ``s``'s batch is the same whether a run starts at 0 or resumes at ``s``."""

    def __init__(self, cursor: DataCursor) -> None:
        self.cursor = cursor
        self.batches: list[list[Problem]] = []

    def __call__(self, step: int) -> list[Problem]:
        if step < 0:
            raise ValueError(f"no batch for step {step}: steps count from 0")
        while len(self.batches) <= step:
            self.batches.append(unique_prompts(self.cursor.next_batch()))
        return self.batches[step]
