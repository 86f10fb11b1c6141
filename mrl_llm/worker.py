"""The LLM policy worker: one policy's model, tokenizer, engine and optimizer behind the worker contract.

It keeps the contract of :mod:`mrl_llm.distributed.actors` — ``build(name, config, seed) -> worker``
with ``version``, ``generate(problems, step)``, ``train_step(rows)``, ``save_checkpoint(dir)``,
``load_checkpoint(dir)`` and ``state()`` — so the same object runs in the single-process trainer and
under the Ray driver. ``config`` is the plain mapping of :class:`WorkerConfig`.

* ``generate``: render each problem with the policy's template, sample ``group_size`` responses
  (seed = f(run seed, policy, step)), score them with the problem's verifier in one batch (a truncated
  response fails; an unusable gold answer skips the sample, counted) and return the records.
* ``check_peer_records``: peers' claims re-scored against the problems this worker was given
  (:mod:`mrl_llm.peer_check`).
* ``train_step``: the core's :class:`~shared_interfaces.regimes.rows.LearnerRows` -> token sequences (THL for
  every peer record, cached by ``(record_id, target tokenizer)``) -> :func:`mrl_llm.update.run_update`. The worker decides nothing
  about regimes. ``version`` counts training steps (a NaN-skipped step counts too, so that a
  policy's lag stays ``step - version`` for the exchange's staleness rule). After ``max_nan_steps``
  consecutive skipped steps it raises.
* the rollout engine: ``hf`` samples from the trainer's own model; ``vllm`` starts from the policy's
  ``model_dir`` (a ``model_config`` policy's initial weights are saved to a directory first), takes the
  new weights in place after every ``train_step`` and checks the drift against the trainer
  (``policies[].drift``; metrics ``sync_s``, ``drift_mean_abs``). The model lives on ``device``.
* ``evaluate``: the fixed eval protocol (greedy + ``k`` samples per prompt), see :mod:`mrl_llm.evaluate`.
* a worker group (``WorkerConfig.group``, :mod:`mrl_llm.parallel`): this worker is one of k ranks of the
  policy, each called with the same arguments. The trained model and the reference are sharded with FSDP2;
  the update takes this rank's token-balanced share of the rows with the global counts (``share``); the
  engine samples from a full copy (``rollout_model``) that gets the gathered weights after every update;
  rank 0 writes exports and checkpoints (full fp32 weights, the optimizer state gathered: any k resumes
  them). Without a group (k = 1) the same code runs on a group of one: nothing sharded, no copy.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import random
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mrl_llm import rewards
from mrl_llm.batch import build_batch, thl_metrics
from mrl_llm.byte_tokenizer import BYTE_TOKENIZER_ID, byte_tokenizer
from mrl_llm.config import PolicyConfig
from mrl_llm.models import (
    build_model,
    count_params,
    load_tokenizer,
    load_tokenizer_dir,
    resolve_device,
    save_policy,
    tokenizer_id,
)
from mrl_llm.parallel.checkpoint import gathered_optimizer_state, load_optimizer_state
from mrl_llm.parallel.fsdp import full_state_dict, load_full_state_dict, shard_model
from mrl_llm.parallel.group import GroupSpec, WorkerGroup
from mrl_llm.parallel.share import RankShare
from mrl_llm.param_groups import split_param_groups
from mrl_llm.peer_check import PeerCheck
from mrl_llm.precision import Precision, lowp_copy
from mrl_llm.rollout import HFEngine, SamplingConfig
from mrl_llm.runstate import CheckpointError, read_json
from mrl_llm.templates import PromptTemplate
from mrl_llm.thl import align_trace, align_traces
from mrl_llm.update import run_update
from shared_interfaces.config_io import ConfigError, from_mapping, to_mapping
from shared_interfaces.records import SUCCESS_THRESHOLD, ExperienceRecord, TraceCache, make_record_id
from shared_interfaces.regimes.config import LossConfig
from shared_interfaces.regimes.rows import LearnerRows

log = logging.getLogger("mrl_llm.worker")


class NaNLossError(RuntimeError):
    """Too many consecutive training steps had a non-finite loss or gradient."""


def derive_seed(*parts: Any) -> int:
    """A 63-bit seed from ``parts`` (stable across processes and Python versions)."""
    h = hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(h[:8], "little") >> 1


@dataclass(frozen=True)
class WorkerConfig:
    """What a worker is built from (plain data for Ray). ``tokenizers``: every policy's tokenizer
    directory in the run (to read peer records); ``peer_eos_ids``: per policy, the EOS ids its engine
    stops on beyond its tokenizer's (its ``generation_config.json``'s), which THL maps to this policy's
    EOS; ``init_seed``: seed of a fresh ``model_config`` model; ``verifier_options``: constructor options
    per verifier name (from the config's ``data`` sections, :meth:`mrl_llm.data.DataConfig.verifier_options`)."""

    policy: PolicyConfig
    loss: LossConfig = field(default_factory=LossConfig)
    tokenizers: tuple[str, ...] = ()
    peer_eos_ids: dict[str, list[int]] = field(default_factory=dict)
    track_ref_kl: bool = True
    max_nan_steps: int = 3
    init_seed: int | None = None
    engine_args: dict[str, Any] = field(default_factory=dict)  # vllm.LLM settings (MWRA: vllm_memory)
    gpu_bundle: bool = False  # placed on a GPU by the MWRA plan: the device must resolve to cuda
    verifier_options: dict[str, dict[str, Any]] = field(default_factory=dict)  # by verifier name (data.*)
    group: GroupSpec | None = None  # this rank's place in the policy's worker group (None: a group of one)


def learner_loss(loss: LossConfig, policy: PolicyConfig) -> LossConfig:
    """The loss settings of learner ``policy``: Dr.GRPO's divisor ``max_response_len`` is the policy's
    generation budget ``sampling.max_new_tokens`` unless the config gives one (the core's 1 would make the
    policy-gradient and KL terms ``max_new_tokens`` times too large against SGT's mean)."""
    if loss.max_response_len is not None:
        return loss
    return replace(loss, max_response_len=policy.sampling.max_new_tokens)


class LLMPolicyWorker:
    """One policy (module docstring)."""

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
        self.model = build_model(pol, self.tokenizer, seed=init_seed, dtype="fp32").to(self.device)
        self.params = count_params(self.model)
        self.ref_model = None
        if config.loss.kl_coef > 0 or config.track_ref_kl:
            self.ref_model = lowp_copy(self.model, self.precision.compute_dtype)
        # k > 1: the engine samples from a full copy; the trained model and the reference are sharded
        self.rollout_model = copy.deepcopy(self.model) if self.group.sharded else self.model
        shard_model(self.model, self.precision, self.group)
        if self.ref_model is not None:
            shard_model(self.ref_model, self.precision, self.group)
        self.share = RankShare(self.group)
        self.optimizer = self._make_optimizer()
        self.engine = self._make_engine()
        self.pad_id = int(self.tokenizer.pad_token_id)
        self.max_len = int(getattr(self.model.config, "max_position_embeddings", 0) or 10**9)
        self.version = 0
        self.nan_streak = 0
        self.counters: dict[str, float] = {"samples": 0, "gen_tokens": 0, "prompt_tokens": 0, "train_tokens": 0,
                                           "flops": 0.0, "optimizer_steps": 0, "nan_skipped_steps": 0}
        self.peer_tokenizers: dict[str, Any] = {self.tok_id: self.tokenizer, BYTE_TOKENIZER_ID: byte_tokenizer()}
        for d in config.tokenizers:
            if d == BYTE_TOKENIZER_ID:
                continue
            tok = self.tokenizer if d == pol.tokenizer_path else load_tokenizer_dir(d, who=f"a peer of {name!r}")
            self.peer_tokenizers.setdefault(tokenizer_id(tok), tok)
        self.template = PromptTemplate(pol.template, self.tokenizer, policy=f"policy {name!r}")
        self.verifiers: dict[str, Any] = {}
        self.peer_check = PeerCheck(name, self.score_many)
        self.trace_cache = TraceCache(max_entries=4096)  # a few steps of peer records (sync uses one)
        self._prompts: OrderedDict[str, tuple[str, list[int]]] = OrderedDict()
        self.last_generate: dict[str, float] = {}

    # -- construction ------------------------------------------------------------------------
    def _make_optimizer(self) -> torch.optim.Optimizer:
        t = self.policy.train
        params = split_param_groups(self.model.named_parameters(), t.lr_groups, t.lr, policy=self.name)
        stepped = {id(p) for g in params for p in g["params"]}
        for p in self.model.parameters():  # lr 0: frozen, so no gradient, and none in the clipping norm
            if id(p) not in stepped:
                p.requires_grad_(False)
        for g in params:
            g.pop("names")
        if t.optimizer in ("adamw", "adam"):
            cls = torch.optim.AdamW if t.optimizer == "adamw" else torch.optim.Adam
            return cls(params, lr=t.lr, betas=tuple(t.betas), eps=t.eps, weight_decay=t.weight_decay)
        return torch.optim.SGD(params, lr=t.lr, weight_decay=t.weight_decay)

    def _make_engine(self) -> Any:
        pol = self.policy
        if pol.engine == "hf":
            return HFEngine(self.rollout_model, self.tokenizer, max_batch_size=pol.sampling.max_batch_size)
        try:
            from mrl_llm.rollout import make_engine  # the vLLM engine, when this install has it
        except ImportError as err:
            raise ConfigError(
                f"policy {self.name!r}: engine 'vllm' needs mrl_llm.rollout.make_engine and vLLM, which this "
                f"install lacks ({err}); install the vllm extra or set engine: hf"
            ) from err
        from mrl_llm.rollout import DriftConfig

        d = pol.drift
        limit = int(getattr(self.model.config, "max_position_embeddings", 0) or 10**9)
        max_len = min(pol.max_prompt_len + pol.sampling.max_new_tokens, limit)
        engine_args = {**self.cfg.engine_args, **pol.engine_args}  # the plan's, then the policy's own
        if "max_model_len" in engine_args:  # the plan's sequence length, within the model's positions
            engine_args["max_model_len"] = min(int(engine_args["max_model_len"]), limit)
        options = {"dtype": {"bf16": "bfloat16", "fp32": "float32"}[pol.dtype],
                   "seed": derive_seed(self.seed, self.name, "engine") % 2**31,
                   "max_model_len": max_len,
                   "drift": DriftConfig(threshold=d.threshold, n_prompts=d.probe_prompts, max_new_tokens=d.probe_tokens,
                                        temperature=pol.sampling.temperature, enabled=d.enabled,
                                        on_exceed=d.on_exceed or "stop"),
                   "engine_args": engine_args}
        if pol.model_dir is not None and pol.tokenizer_path == pol.model_dir and Path(pol.model_dir).is_dir():
            # vLLM loads the initial weights itself; updates arrive by sync_weights
            return make_engine("vllm", model_dir=pol.model_dir, **options)
        # a model_config policy (or one with its own tokenizer_dir): its initial weights and tokenizer are
        # saved to a directory the engine starts from (and removes when closed)
        return make_engine("vllm", model=self.rollout_model, tokenizer=self.tokenizer, **options)

    # -- verifiers ---------------------------------------------------------------------------
    def verifier(self, name: str) -> Any:
        """The verifier named ``name``, built once with the run's options for it."""
        v = self.verifiers.get(name)
        if v is None:
            v = self.verifiers[name] = rewards.get_verifier(name, **self.cfg.verifier_options.get(name, {}))
        return v

    def score(self, problem: Any, text: str, finish_reason: str) -> Any:
        """The problem's verifier's :class:`~mrl_llm.rewards.Verdict` on ``text``."""
        return rewards.score_problem(self.verifier(problem.verifier), problem, text, finish_reason=finish_reason)

    def score_many(self, items: Sequence[tuple[Any, str, str]]) -> list[Any]:
        """:meth:`score` of each ``(problem, text, finish_reason)``, in order, one batch per verifier
        (:func:`mrl_llm.rewards.score_problems`: the MATH verifier scores it over its worker pool)."""
        out: list[Any] = [None] * len(items)
        by_name: dict[str, list[int]] = {}
        for i, (prob, _, _) in enumerate(items):
            by_name.setdefault(prob.verifier, []).append(i)
        for name, idx in by_name.items():
            for i, v in zip(idx, rewards.score_problems(self.verifier(name), [items[i] for i in idx]), strict=True):
                out[i] = v
        return out

    def check_peer_records(self, records: Sequence[ExperienceRecord]) -> dict[str, str]:
        """``{record_id: outcome}`` of the peer ``records`` whose claims fail this policy's re-check
        (:mod:`mrl_llm.peer_check`; called by :func:`~mrl_llm.distributed.actors.fetch_learner_rows`)."""
        return self.peer_check(records)

    def close(self) -> None:
        """Release the verifiers' resources (the MATH verifier's checker processes) and the engine's."""
        for v in self.verifiers.values():
            rewards.close_verifier(v)
        self.verifiers.clear()
        self.engine.close()
        self.group.close()

    def sync_engine(self) -> None:
        """The engine gets the current weights (the vllm engine runs its drift check); k > 1: gathered from the
        shards into the full rollout copy first (a collective: every rank calls it)."""
        if self.rollout_model is not self.model:
            load_full_state_dict(self.rollout_model, full_state_dict(self.model))
        with self.precision.autocast(self.device):
            self.engine.sync_weights(self.rollout_model)

    # -- prompts -----------------------------------------------------------------------------
    def render(self, problem: Any) -> tuple[str, list[int]]:
        """The policy's prompt for ``problem`` (template applied) and its ids; cached by prompt id."""
        pid = str(problem.prompt_id)
        text = self.template.render(problem)
        hit = self._prompts.get(pid)
        if hit is not None and hit[0] == text:
            self._prompts.move_to_end(pid)
            return hit
        return self.set_prompt(pid, text)

    def set_prompt(self, pid: str, text: str) -> tuple[str, list[int]]:
        """Encode and cache the prompt text of prompt ``pid`` (what :meth:`render` stores)."""
        ids = list(self.tokenizer(text, add_special_tokens=self.template.add_special_tokens).input_ids)
        if not ids:
            raise ValueError(f"policy {self.name!r}: prompt {pid!r} encodes to no tokens; check the template")
        if len(ids) > self.policy.max_prompt_len:
            raise ValueError(
                f"policy {self.name!r}: prompt {pid!r} has {len(ids)} tokens > max_prompt_len "
                f"{self.policy.max_prompt_len}; raise policies[].max_prompt_len or shorten the question"
            )
        self._prompts[pid] = (text, ids)
        if len(self._prompts) > 20_000:
            self._prompts.popitem(last=False)
        return text, ids

    def prepare(self, problems: Sequence[Any]) -> None:
        """What :meth:`generate` keeps of a step's problems besides its samples: the rendered prompts and the
        problems for re-checking peers' claims (a rank of a worker group that does not sample)."""
        for p in problems:
            self.render(p)
        self.peer_check.remember(problems)

    def _prompt_ids(self, prompt_id: str) -> list[int]:
        hit = self._prompts.get(prompt_id)
        if hit is None:
            raise KeyError(f"policy {self.name!r} has not rendered prompt {prompt_id!r}; generate() comes first")
        return hit[1]

    # -- rollouts ----------------------------------------------------------------------------
    def _sample(self, problems: Sequence[Any], n: int, sp: SamplingConfig) -> tuple[list, list, float]:
        rendered = [self.render(p) for p in problems]
        t0 = time.perf_counter()
        with self.precision.autocast(self.device):  # the hf engine samples from the master model
            out = self.engine.generate([ids for _, ids in rendered], n, sp)
        return rendered, out, time.perf_counter() - t0

    def generate(self, problems: Sequence[Any], step: int) -> list[ExperienceRecord]:
        pol = self.policy
        row_seeds = None
        if pol.sampling.seeding == "sample":  # a record is the same whichever rank samples it
            row_seeds = tuple(derive_seed(self.seed, self.name, "rollout", step, p.prompt_id, g)
                              for p in problems for g in range(pol.group_size))
        sp = SamplingConfig(temperature=pol.sampling.temperature, top_p=pol.sampling.top_p,
                            max_new_tokens=pol.sampling.max_new_tokens, seed=derive_seed(self.seed, self.name, "rollout", step),
                            row_seeds=row_seeds)
        rendered, out, gen_s = self._sample(problems, pol.group_size, sp)
        self.peer_check.remember(problems)  # the run's own copies, for re-checking peers' claims
        t0 = time.perf_counter()
        records, skipped, empty, truncated, gen_tokens = [], 0, 0, 0, 0
        batch = [(prob, s.text, s.finish_reason) for prob, samples in zip(problems, out, strict=True) for s in samples]
        verdicts = iter(self.score_many(batch))
        for prob, (text, _ids), samples in zip(problems, rendered, out, strict=True):
            for g, s in enumerate(samples):
                gen_tokens += len(s.token_ids)
                empty += int(not s.text.strip())
                truncated += int(s.finish_reason == "length")
                verdict = next(verdicts)
                if verdict.skip:
                    skipped += 1
                    continue
                records.append(ExperienceRecord(
                    record_id=make_record_id(self.name, step, str(prob.prompt_id), g), policy_id=self.name,
                    policy_version=self.version, step=step, prompt_id=str(prob.prompt_id), sample_index=g,
                    prompt_text=text, response_text=s.text, token_ids=s.token_ids, token_logprobs=s.logprobs,
                    tokenizer_id=self.tok_id, reward=verdict.reward, verified=verdict.verified,
                    verifier=str(prob.verifier), finish_reason=s.finish_reason,
                ))
        score_s = time.perf_counter() - t0
        prompt_tokens = sum(len(ids) for _, ids in rendered) * pol.group_size
        flops = 2.0 * self.params["flops"] * (prompt_tokens + gen_tokens)
        n = sum(len(o) for o in out)
        for k, v in (("samples", n), ("gen_tokens", gen_tokens), ("prompt_tokens", prompt_tokens), ("flops", flops)):
            self.counters[k] += v
        self.last_generate = {"generation_s": gen_s, "scoring_s": score_s, "samples": float(n),
                              "gen_tokens": float(gen_tokens), "skipped_samples": float(skipped),
                              "empty_responses": float(empty), "truncated_responses": float(truncated),
                              "gen_flops": flops}
        return records

    # -- THL ---------------------------------------------------------------------------------
    def _align(self, rec: ExperienceRecord) -> tuple[list[int], list[int], list[float], Any]:
        """``(prompt ids, response ids, aligned log-probs, residual)`` of a peer record in this policy's
        tokens: THL's own split of the learner's joint encoding of prompt + response (with special tokens
        as this policy's template tokenizes its prompts), so a token spanning the boundary appears once."""
        self._prompt_ids(rec.prompt_id)  # an unrendered prompt: the error that names it

        def compute() -> Any:
            return align_trace(self._source_tokenizer(rec), self.tokenizer, list(rec.token_ids),
                               list(rec.token_logprobs), **self._thl_options(rec))

        tr = self.trace_cache.get_or_compute(rec.record_id, self.tok_id, compute)
        return tr.prompt_ids.tolist(), tr.target_ids.tolist(), tr.target_logprobs.tolist(), tr.residual

    def _thl_options(self, rec: ExperienceRecord) -> dict[str, Any]:
        """THL's keyword arguments for ``rec``: this policy's prompt, how it tokenizes it, the peer's EOS ids."""
        return {"prompt_text": self._prompts[rec.prompt_id][0],
                "prompt_special_tokens": self.template.add_special_tokens,
                "source_eos_ids": self.cfg.peer_eos_ids.get(rec.policy_id, ())}

    def _source_tokenizer(self, rec: ExperienceRecord) -> Any:
        src = self.peer_tokenizers.get(rec.tokenizer_id)
        if src is None:
            raise KeyError(
                f"policy {self.name!r} cannot read record {rec.record_id!r}: tokenizer {rec.tokenizer_id!r} is "
                f"not one of the run's tokenizers {sorted(self.peer_tokenizers)}"
            )
        return src

    def _prefetch(self, records: Sequence[ExperienceRecord]) -> None:
        """Align the step's peer records in one :func:`mrl_llm.thl.align_traces` batch per source tokenizer
        into the trace cache (the same traces :meth:`_align` computes one by one, several times faster)."""
        groups: dict[tuple[str, str], dict[str, ExperienceRecord]] = {}
        for rec in records:
            if rec.policy_id != self.name:
                self._prompt_ids(rec.prompt_id)  # an unrendered prompt: the error that names it
                groups.setdefault((rec.tokenizer_id, rec.policy_id), {})[rec.record_id] = rec
        for recs in groups.values():
            todo = list(recs.values())
            opts = self._thl_options(todo[0])
            traces = align_traces(self._source_tokenizer(todo[0]), self.tokenizer, [r.token_ids for r in todo],
                                  [r.token_logprobs for r in todo],
                                  prompt_texts=[self._prompts[r.prompt_id][0] for r in todo],
                                  prompt_special_tokens=opts["prompt_special_tokens"],
                                  source_eos_ids=opts["source_eos_ids"])
            for rec, tr in zip(todo, traces, strict=True):
                self.trace_cache.get_or_compute(rec.record_id, self.tok_id, lambda tr=tr: tr)

    # -- training ----------------------------------------------------------------------------
    def build_batch(self, rows: LearnerRows):
        """The step's :class:`~mrl_llm.batch.TrainBatch` (the core's rows, tokenised; THL)."""
        self._prefetch(rows.row_records())
        max_len = self.max_len
        if self.policy.train.max_tokens_per_micro_batch is not None:  # every row must fit the token budget
            max_len = min(max_len, self.policy.max_prompt_len + self.policy.sampling.max_new_tokens)
        return build_batch(rows, prompt_ids=self._prompt_ids, align=self._align, max_len=max_len)

    def train_step(self, rows: LearnerRows) -> dict[str, float]:
        t0 = time.perf_counter()
        batch = self.build_batch(rows)
        t1 = time.perf_counter()
        t = self.policy.train
        with self.precision.autocast(self.device):  # forward/backward in pol.dtype, grads on the fp32 masters
            res = run_update(self.model, self.optimizer, batch, loss_cfg=self.loss_cfg,
                             temperature=self.policy.sampling.temperature, micro_batch=t.micro_batch,
                             grad_accum=t.grad_accum, grad_clip=t.grad_clip, pad_id=self.pad_id,
                             ref_model=self.ref_model, max_tokens=t.max_tokens_per_micro_batch,
                             logprob_chunk=t.logprob_chunk, share=self.share)
        t2 = time.perf_counter()
        if self.group.sharded:  # the policy's token counts, not this rank's share
            res.tokens, res.seq_tokens, res.ref_seq_tokens = (int(x) for x in self.group.sum(
                [res.tokens, res.seq_tokens, res.ref_seq_tokens]))
        self.version += 1
        self.sync_engine()
        t3 = time.perf_counter()
        nf = self.params["flops"]
        flops = 6.0 * nf * res.seq_tokens + 2.0 * nf * (res.ref_seq_tokens + res.old_seq_tokens)
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
        recs = rows.row_records()
        own = [r for r, o in zip(recs, (rows.own_mask & rows.pg_mask).tolist(), strict=True) if o]
        m = dict(res.metrics)
        m.update({
            "reward_mean": float(np.mean([r.reward for r in own])) if own else float("nan"),
            "success_rate": float(np.mean([r.is_success for r in own])) if own else float("nan"),
            "own_rows": float(int(rows.own_mask.sum())),
            "peer_rows": float(int((~rows.own_mask & rows.pg_mask).sum())),
            "sgt_rows": float(int(rows.sgt_mask.sum())),
            "sgt_activations": float(int(rows.sgt_gate.sum())),
            **thl_metrics(batch.residuals),
            "truncated_rows": float(batch.truncated_rows),
            "train_tokens": float(res.tokens),
            "train_flops": flops,
            "thl_s": t1 - t0,
            "update_s": t2 - t1,
            "sync_s": t3 - t2,
            "nan_streak": float(self.nan_streak),
            "version": float(self.version),
        })
        drift = getattr(self.engine, "last_drift", None)
        if drift is not None:
            m["drift_mean_abs"], m["drift_max_abs"] = float(drift.mean_abs), float(drift.max_abs)
            m["drift_exceeded"] = float(drift.exceeded)
        return m

    # -- evaluation ----------------------------------------------------------------------------
    def evaluate(self, problems: Sequence[Any], *, step: int, k: int, temperature: float, top_p: float,
                 max_new_tokens: int | None = None) -> list[dict[str, Any]]:
        """One row per problem: the greedy answer's verdict and ``successes`` of ``k`` samples."""
        mnt = max_new_tokens or self.policy.sampling.max_new_tokens
        _, greedy, _ = self._sample(problems, 1, SamplingConfig(max_new_tokens=mnt, greedy=True))
        sampled = [[] for _ in problems]
        if k > 0:
            sp = SamplingConfig(temperature=temperature, top_p=top_p, max_new_tokens=mnt,
                                seed=derive_seed(self.seed, self.name, "eval", step))
            _, sampled, _ = self._sample(problems, k, sp)
        rows = []
        batch = [(prob, o.text, o.finish_reason)
                 for prob, g, ss in zip(problems, greedy, sampled, strict=True) for o in (g[0], *ss)]
        scored = iter(self.score_many(batch))
        for prob, g, ss in zip(problems, greedy, sampled, strict=True):
            gv = next(scored)
            verdicts = [next(scored) for _ in ss]
            rows.append({"prompt_id": str(prob.prompt_id), "family": getattr(prob, "family", None),
                         "skipped": bool(gv.skip), "greedy_correct": int(gv.reward >= SUCCESS_THRESHOLD and not gv.skip),
                         "greedy_response": g[0].text[:500], "samples": len(verdicts),
                         "successes": int(sum(v.reward >= SUCCESS_THRESHOLD and not v.skip for v in verdicts))})
        return rows

    # -- checkpoints ---------------------------------------------------------------------------
    def export(self, out_dir: str | Path, *, master: bool = False) -> Path:
        """Save the policy as an HF model directory (model + tokenizer + ``mrl_policy.json``), in the
        policy's dtype; ``master=True`` (checkpoints) writes the fp32 master weights. Rank 0 writes (the full
        rollout copy holds the current weights); the other ranks of a group write nothing."""
        if self.group.rank != 0:
            return Path(out_dir)
        model = self.rollout_model
        if self.precision.mixed and not master:
            model = lowp_copy(self.rollout_model, self.precision.compute_dtype)
        meta = {"name": self.name, "template": to_mapping(self.policy.template), "dtype": self.policy.dtype,
                "weights_dtype": "fp32" if model is self.rollout_model else self.policy.dtype,
                "sampling": to_mapping(self.policy.sampling), "version": self.version, "tokenizer_id": self.tok_id}
        return save_policy(model, self.tokenizer, out_dir, meta)

    def save_checkpoint(self, path: str) -> None:
        d = Path(path)
        self.export(d / "model", master=True)
        optim = gathered_optimizer_state(self.optimizer) if self.group.sharded else self.optimizer.state_dict()
        if self.group.rank != 0:  # the gather above is a collective; rank 0 writes
            return
        torch.save(optim, d / "optimizer.pt")
        np_state = np.random.get_state()
        torch.save({"torch": torch.get_rng_state(), "python": random.getstate(),
                    "numpy": [np_state[0], np_state[1].tolist(), *np_state[2:]]}, d / "rng.pt")
        (d / "worker.json").write_text(json.dumps({"version": self.version, "nan_streak": self.nan_streak,
                                                   "counters": self.counters, "tokenizer_id": self.tok_id}))

    def load_checkpoint(self, path: str) -> None:
        from transformers import AutoModelForCausalLM

        d = Path(path)
        meta = read_json(d / "worker.json", "worker state")
        if not isinstance(meta, dict) or not {"version", "nan_streak", "counters", "tokenizer_id"} <= meta.keys():
            raise CheckpointError(f"{d / 'worker.json'}: expected the keys version, nan_streak, counters, tokenizer_id; "
                                  "the checkpoint is corrupt")
        if meta["tokenizer_id"] != self.tok_id:
            raise ValueError(f"checkpoint {d} was written with tokenizer {meta['tokenizer_id']!r}, this policy "
                             f"uses {self.tok_id!r}; resume with the same config")
        loaded = AutoModelForCausalLM.from_pretrained(str(d / "model"), dtype=torch.float32)
        load_full_state_dict(self.model, loaded.state_dict())  # k > 1: each rank its shard
        del loaded
        load_optimizer_state(self.optimizer, torch.load(d / "optimizer.pt", weights_only=True))
        rng = torch.load(d / "rng.pt", weights_only=True)
        torch.set_rng_state(rng["torch"])
        random.setstate(rng["python"])
        np.random.set_state((rng["numpy"][0], np.array(rng["numpy"][1], dtype=np.uint32), *rng["numpy"][2:]))
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
