"""The LLM policy worker: one rank of a policy, composed of the parts in :mod:`mrl_llm.rank`.

It keeps the contract of :mod:`mrl_llm.distributed.actors` — ``build(name, config, seed) -> worker``
with ``version``, ``generate(problems, step)``, ``train_step(rows)``, ``save_checkpoint(dir)``,
``load_checkpoint(dir)`` and ``state()`` — so the same object runs in the single-process trainer and
under the Ray driver. ``config`` is the plain mapping of :class:`WorkerConfig`. The parts:

* ``policy_model`` (:class:`~mrl_llm.rank.model.PolicyModel`): the fp32 masters (FSDP2-sharded over the
  rank's group for k > 1), the reference, the rollout copy, the optimizer, the update;
* ``sampler`` (:class:`~mrl_llm.rank.engine.RankEngine`): the ``hf`` or ``vllm`` engine on ``device``, and the
  weight sync after every update with the vllm engine's drift check and the reload check of any engine or copy with
  weights of its own (``policies[].drift``; metrics ``sync_s``, ``drift_mean_abs``, ``drift_reload_err``); no engine with ``WorkerConfig.rollout_engine: false`` (a split policy's
  trainer: its rollout actors sample);
* ``prompts`` (:class:`~mrl_llm.rank.prompts.PromptCache`) and ``alignment``
  (:class:`~mrl_llm.rank.alignment.PeerAlignment`): the policy's rendered prompts, and THL of every peer
  record, cached by ``(record_id, target tokenizer)``;
* ``scorer`` (:class:`~mrl_llm.rank.scoring.Scorer`) and ``peer_check`` (:mod:`mrl_llm.peer_check`): the
  verifiers, and peers' claims re-scored against the problems this worker was given;
* :mod:`mrl_llm.rank.checkpoint` (exports, checkpoints) and :mod:`mrl_llm.rank.evaluation` (the eval protocol).

What the worker itself does: ``generate`` renders each problem, samples ``group_size`` responses (seed =
f(run seed, policy, step), :func:`~mrl_llm.rank.rollouts.rollout_sampling`), scores them in one batch (a
truncated response fails; an unusable gold answer skips the sample, counted) and returns the records;
``train_step`` turns the core's :class:`~shared_interfaces.regimes.rows.LearnerRows` into token sequences
(:meth:`build_batch`) and updates; it decides nothing about regimes. ``version`` counts training steps (a
NaN-skipped step counts too, so that a policy's lag stays ``step - version`` for the exchange's staleness
rule); after ``max_nan_steps`` consecutive skipped steps it raises :class:`NaNLossError`.

A worker group (``WorkerConfig.group``, :mod:`mrl_llm.parallel`): this worker is one of k ranks of the
policy, each called with the same arguments; rank 0 writes exports and checkpoints (full fp32 weights, the
optimizer state gathered: any k resumes them). Without a group (k = 1) the same code runs on a group of one.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mrl_llm.batch import build_batch
from mrl_llm.models import load_tokenizer, resolve_device, tokenizer_id
from mrl_llm.parallel.group import GroupSpec, WorkerGroup
from mrl_llm.peer_check import PeerCheck
from mrl_llm.precision import Precision
from mrl_llm.rank import checkpoint as ckpt
from mrl_llm.rank.alignment import PeerAlignment, run_tokenizers
from mrl_llm.rank.config import WorkerConfig, learner_loss
from mrl_llm.rank.engine import RankEngine, drift_config, make_rollout_engine
from mrl_llm.rank.evaluation import eval_rows
from mrl_llm.rank.model import PolicyModel, rollout_copy_device, step_metrics
from mrl_llm.rank.prompts import PromptCache
from mrl_llm.rank.rollouts import make_records, rollout_sampling
from mrl_llm.rank.scoring import Scorer
from mrl_llm.rank.seeds import derive_seed
from mrl_llm.rollout import SamplingConfig
from mrl_llm.rollout.base import graded_text
from mrl_llm.templates import PromptTemplate
from shared_interfaces.config_io import ConfigError, from_mapping
from shared_interfaces.records import ExperienceRecord
from shared_interfaces.regimes.rows import LearnerRows

__all__ = ["LLMPolicyWorker", "NaNLossError", "WorkerConfig", "build", "derive_seed", "learner_loss"]

log = logging.getLogger("mrl_llm.worker")


class NaNLossError(RuntimeError):
    """Too many consecutive training steps had a non-finite loss or gradient."""


class LLMPolicyWorker:
    """One rank of one policy (module docstring)."""

    # the parts' objects, under the names the callers and tests use
    model = property(lambda self: self.policy_model.model)
    ref_model = property(lambda self: self.policy_model.ref_model)
    rollout_model = property(lambda self: self.policy_model.rollout_model)
    optimizer = property(lambda self: self.policy_model.optimizer)
    share = property(lambda self: self.policy_model.share)
    params = property(lambda self: self.policy_model.params)
    engine = property(lambda self: self.sampler.engine)
    trace_cache = property(lambda self: self.alignment.trace_cache)
    peer_tokenizers = property(lambda self: self.alignment.tokenizers)
    verifiers = property(lambda self: self.scorer.verifiers)

    def __init__(self, name: str, config: WorkerConfig, seed: int) -> None:
        if config.policy.name != name:
            raise ConfigError(f"worker {name!r} was given the config of policy {config.policy.name!r}")
        self.name, self.cfg, self.seed = name, config, int(seed)
        pol = config.policy
        self.policy = pol
        self.loss_cfg = learner_loss(config.loss, pol)
        self.tokenizer = load_tokenizer(pol)
        self.tok_id = tokenizer_id(self.tokenizer)
        init_seed = config.init_seed if config.init_seed is not None else derive_seed(seed, name, "init")
        self.device = resolve_device(pol.device)
        if config.gpu_bundle and self.device.type != "cuda":
            raise ConfigError(f"policy {name!r} is placed on a GPU bundle but its device {pol.device!r} resolves to "
                              f"{self.device.type} (torch sees no GPU in this actor); check the actor's CUDA setup "
                              "or set runtime.placement: cpu")
        self.precision = Precision(pol.dtype)  # fp32 master weights, compute in pol.dtype
        self.group = WorkerGroup.join(config.group if config.group is not None else GroupSpec(rank=0, world_size=1))
        pm = self.policy_model = PolicyModel(pol, self.tokenizer, precision=self.precision, group=self.group,
                                             device=self.device, init_seed=init_seed,
                                             with_ref=config.loss.kl_coef > 0 or config.track_ref_kl,
                                             rollout_device=rollout_copy_device(self.device,
                                                                                engine=config.rollout_engine))
        engine = make_rollout_engine(pol, pm.rollout_model, self.tokenizer, seed=self.seed,
                                     max_positions=pm.max_positions,
                                     engine_args=config.engine_args) if config.rollout_engine else None
        self.sampler = RankEngine(engine, trained=pm.model, rollout=pm.rollout_model, precision=self.precision,
                                  device=self.device, drift=drift_config(pol))
        self.pad_id = int(self.tokenizer.pad_token_id)
        self.max_len = pm.max_positions
        self.version = 0
        self.nan_streak = 0
        self.counters: dict[str, float] = {"samples": 0, "gen_tokens": 0, "prompt_tokens": 0, "train_tokens": 0,
                                           "flops": 0.0, "optimizer_steps": 0, "nan_skipped_steps": 0}
        tokenizers = run_tokenizers(name, self.tokenizer, pol.tokenizer_path, config.tokenizers)
        self.template = PromptTemplate(pol.template, self.tokenizer, policy=f"policy {name!r}")
        self.prompts = PromptCache(name, self.tokenizer, self.template, max_prompt_len=pol.max_prompt_len)
        self.alignment = PeerAlignment(name, self.tokenizer, self.prompts, tokenizers=tokenizers,
                                       peer_eos_ids=config.peer_eos_ids)
        self.scorer = Scorer(config.verifier_options)
        self.peer_check = PeerCheck(name, self.score_many)
        self.last_generate: dict[str, float] = {}

    # -- verifiers, peers' claims --------------------------------------------------------------
    def verifier(self, name: str) -> Any:
        """The verifier named ``name``, built once with the run's options for it."""
        return self.scorer.verifier(name)

    def score(self, problem: Any, text: str, finish_reason: str) -> Any:
        """The problem's verifier's :class:`~mrl_llm.rewards.Verdict` on ``text`` (cut as :meth:`score_many` cuts)."""
        return self.scorer.score(problem, graded_text(text, self.policy.sampling.stop_at_newline), finish_reason)

    def score_many(self, items: Sequence[tuple[Any, str, str]]) -> list[Any]:
        """:meth:`score` of each ``(problem, text, finish_reason)``, in order, one batch per verifier; with
        ``sampling.stop_at_newline`` each text up to its first newline (:func:`~mrl_llm.rollout.base.graded_text`:
        the policy's own rollouts, its evaluation and its re-check of peers' claims alike)."""
        cut = self.policy.sampling.stop_at_newline
        return self.scorer.score_many([(p, graded_text(t, cut), r) for p, t, r in items])

    def check_peer_records(self, records: Sequence[ExperienceRecord]) -> dict[str, str]:
        """``{record_id: outcome}`` of the peer ``records`` whose claims fail this policy's re-check
        (:mod:`mrl_llm.peer_check`; called by :func:`~mrl_llm.distributed.actors.fetch_learner_rows`)."""
        return self.peer_check(records)

    def close(self) -> None:
        """Release the verifiers' resources (the MATH verifier's checker processes), the engine's and the group."""
        self.scorer.close()
        self.sampler.close()
        self.group.close()

    def sync_engine(self, state: Mapping[str, Any] | None = None) -> None:
        """The engine gets the current weights (:meth:`~mrl_llm.rank.engine.RankEngine.sync`; a collective);
        ``state``: the same weights as received in the engine's dtype (a rollout actor's), for a vLLM engine."""
        self.sampler.sync(state)

    def drift_metrics(self) -> dict[str, float]:
        """The engine's last drift check (:meth:`~mrl_llm.rank.engine.RankEngine.drift_metrics`; empty: none)."""
        return self.sampler.drift_metrics()

    # -- prompts, rollouts ---------------------------------------------------------------------
    def render(self, problem: Any) -> tuple[str, list[int]]:
        """The policy's prompt for ``problem`` (template applied) and its ids; cached by prompt id."""
        return self.prompts.render(problem)

    def set_prompt(self, pid: str, text: str) -> tuple[str, list[int]]:
        """Encode and cache the prompt text of prompt ``pid`` (what :meth:`render` stores)."""
        return self.prompts.set_prompt(pid, text)

    def prepare(self, problems: Sequence[Any]) -> None:
        """What :meth:`generate` keeps of a step's problems besides its samples: the rendered prompts and the
        problems for re-checking peers' claims (a rank of a worker group that does not sample)."""
        for p in problems:
            self.render(p)
        self.peer_check.remember(problems)

    def _sample(self, problems: Sequence[Any], n: int, sp: SamplingConfig) -> tuple[list, list, float]:
        rendered = [self.render(p) for p in problems]
        out, seconds = self.sampler.sample([ids for _, ids in rendered], n, sp)
        return rendered, out, seconds

    def generate(self, problems: Sequence[Any], step: int) -> list[ExperienceRecord]:
        pol = self.policy
        sp = rollout_sampling(pol, problems, seed=self.seed, step=step)
        rendered, out, gen_s = self._sample(problems, pol.group_size, sp)
        self.peer_check.remember(problems)  # the run's own copies, for re-checking peers' claims
        t0 = time.perf_counter()
        verdicts = self.score_many([(prob, s.text, s.finish_reason)
                                    for prob, samples in zip(problems, out, strict=True) for s in samples])
        records, st = make_records(problems, rendered, out, verdicts, policy=self.name, version=self.version,
                                   step=step, tok_id=self.tok_id, group_size=pol.group_size,
                                   flops_params=self.params["flops"])
        score_s = time.perf_counter() - t0
        for k, v in (("samples", st.samples), ("gen_tokens", st.gen_tokens), ("prompt_tokens", st.prompt_tokens),
                     ("flops", st.flops)):
            self.counters[k] += v
        self.last_generate = st.metrics(generation_s=gen_s, scoring_s=score_s)
        return records

    # -- training ------------------------------------------------------------------------------
    def build_batch(self, rows: LearnerRows):
        """The step's :class:`~mrl_llm.batch.TrainBatch` (the core's rows, tokenised; THL)."""
        self.alignment.prefetch(rows.row_records(), group=self.group)
        max_len = self.max_len
        if self.policy.train.max_tokens_per_micro_batch is not None:  # every row must fit the token budget
            max_len = min(max_len, self.policy.max_prompt_len + self.policy.sampling.max_new_tokens)
        return build_batch(rows, prompt_ids=self.prompts.ids, align=self.alignment.align, max_len=max_len)

    def train_step(self, rows: LearnerRows) -> dict[str, float]:
        t0 = time.perf_counter()
        batch = self.build_batch(rows)
        t1 = time.perf_counter()
        res = self.policy_model.update(batch, self.policy, loss_cfg=self.loss_cfg, pad_id=self.pad_id)
        t2 = time.perf_counter()
        self.version += 1
        self.sync_engine()
        t3 = time.perf_counter()
        flops = self.policy_model.update_flops(res)
        self.counters["train_tokens"] += res.tokens
        self.counters["flops"] += flops
        self.counters["optimizer_steps"] += res.optimizer_steps
        if res.nan_skipped:
            self.nan_streak += 1
            self.counters["nan_skipped_steps"] += 1
            log.warning("policy %s: non-finite loss or gradient at version %d; step skipped (%d in a row)",
                        self.name, self.version - 1, self.nan_streak)
            if self.nan_streak >= self.cfg.max_nan_steps:
                raise NaNLossError(
                    f"policy {self.name!r}: {self.nan_streak} consecutive steps had a non-finite loss or gradient; "
                    "lower the learning rate, use fp32, or check the data (training stopped)"
                )
        else:
            self.nan_streak = 0
        m = step_metrics(rows, batch, res, flops=flops)
        m.update({"thl_s": t1 - t0, "update_s": t2 - t1, "sync_s": t3 - t2, "nan_streak": float(self.nan_streak),
                  "version": float(self.version)})
        m.update(self.sampler.drift_metrics())
        return m

    # -- evaluation, checkpoints -----------------------------------------------------------------
    def evaluate(self, problems: Sequence[Any], *, step: int, k: int, temperature: float, top_p: float,
                 max_new_tokens: int | None = None) -> list[dict[str, Any]]:
        """One row per problem: the greedy answer's verdict and ``successes`` of ``k`` samples
        (:func:`mrl_llm.rank.evaluation.eval_rows`)."""
        return eval_rows(problems, sample=lambda n, sp: self._sample(problems, n, sp)[1], score_many=self.score_many,
                         k=k, temperature=temperature, top_p=top_p,
                         max_new_tokens=max_new_tokens or self.policy.sampling.max_new_tokens,
                         seed=derive_seed(self.seed, self.name, "eval", step))

    def export(self, out_dir: str | Path, *, master: bool = False) -> Path:
        """Save the policy as an HF model directory (:func:`mrl_llm.rank.checkpoint.export_policy`); in the
        policy's dtype, ``master=True`` (checkpoints): the fp32 masters. Rank 0 writes."""
        return ckpt.export_policy(self.policy_model, self.tokenizer, out_dir, policy=self.policy, version=self.version,
                                  tok_id=self.tok_id, master=master)

    def save_checkpoint(self, path: str) -> None:
        ckpt.save_checkpoint(Path(path), self.policy_model, export=lambda d: self.export(d, master=True),
                             state={"version": self.version, "nan_streak": self.nan_streak,
                                    "counters": self.counters, "tokenizer_id": self.tok_id})

    def load_checkpoint(self, path: str) -> None:
        meta = ckpt.load_checkpoint(Path(path), self.policy_model, tok_id=self.tok_id)
        self.version = int(meta["version"])
        self.nan_streak = int(meta["nan_streak"])
        self.counters = {k: float(v) for k, v in meta["counters"].items()}
        self.sync_engine()

    def state(self) -> dict[str, Any]:
        h = hashlib.sha256()
        for name, p in sorted(self.rollout_model.state_dict().items()):
            h.update(name.encode())
            h.update(p.detach().float().cpu().numpy().tobytes())
        return {"version": self.version, "weights_sha256": h.hexdigest(), "counters": dict(self.counters)}


def build(name: str, config: Mapping[str, Any], seed: int) -> LLMPolicyWorker:
    """The worker factory (``mrl_llm.worker:build``) for :class:`~mrl_llm.distributed.actors.PolicyActor`."""
    cfg = config if isinstance(config, WorkerConfig) else from_mapping(WorkerConfig, config, where=f"worker {name}")
    return LLMPolicyWorker(name, cfg, seed)
