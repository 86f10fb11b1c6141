"""A rank's rollout engine: built from the policy (HF or vLLM), sampling, and the weight sync after an update.

* :func:`make_rollout_engine` — ``engine: hf`` samples from the rank's rollout model itself; ``engine: vllm``
  starts from the policy's ``model_dir`` (a ``model_config`` policy's initial weights, or a policy with its
  own tokenizer directory, are saved to a directory first), seeded by ``derive_seed(run seed, policy,
  "engine")``, with the plan's ``engine_args`` and then the policy's own, ``max_model_len`` capped at the
  model's positions, and the policy's drift check (``policies[].drift``); with ``sampling.stop_at_newline`` it
  also stops at every newline-holding token (:meth:`~mrl_llm.rollout.base.RolloutEngine.add_stop_ids`).
* :class:`RankEngine` — :meth:`~RankEngine.sample` runs the engine under the precision's autocast (the HF
  engine samples from the fp32 master model in the compute dtype); :meth:`~RankEngine.sync` gives the engine
  the trained weights after an update: for k > 1 gathered from the shards into the full rollout copy first
  (a collective: every rank calls it), torch's cached CUDA blocks released, then ``engine.sync_weights`` (vLLM
  reloads in place and runs its drift check), then the reload check of an engine that holds weights of its own
  (vLLM, or the HF engine over a k > 1 rank's rollout copy: :func:`mrl_llm.rollout.drift.reload_check`);
  :meth:`~RankEngine.drift_metrics` reports both. A rank without an engine (``engine
  None``: a split policy's trainer, ``WorkerConfig.rollout_engine: false``) still gathers its rollout copy in
  :meth:`~RankEngine.sync` (what :meth:`mrl_llm.worker.LLMPolicyWorker.state` hashes) and refuses to sample.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from mrl_llm.config import PolicyConfig
from mrl_llm.parallel.fsdp import gather_into
from mrl_llm.precision import Precision
from mrl_llm.rank.seeds import derive_seed
from mrl_llm.rollout import DriftConfig, HFEngine, Sample, SamplingConfig
from mrl_llm.rollout.base import newline_token_ids, release_cached_device_memory
from mrl_llm.rollout.drift import ReloadReport, model_vocab_size, probe_logprobs, reload_check, reload_probe
from shared_interfaces.config_io import ConfigError


def transfer_dtype(policy: PolicyConfig) -> torch.dtype:
    """The dtype a split policy's trainers send floating-point weights in: its rollout engine's — the compute dtype
    for ``engine: vllm`` (a bf16 engine holds bf16 weights), fp32 for ``engine: hf`` (it samples from fp32 weights
    under the precision's autocast, so its copy takes the masters as they are)."""
    return Precision(policy.dtype).compute_dtype if policy.engine == "vllm" else torch.float32


def drift_config(policy: PolicyConfig) -> DriftConfig:
    """The policy's drift checks (``policies[].drift``) as a :class:`~mrl_llm.rollout.DriftConfig`."""
    d = policy.drift
    return DriftConfig(threshold=d.threshold, n_prompts=d.probe_prompts, max_new_tokens=d.probe_tokens,
                       temperature=policy.sampling.temperature, enabled=d.enabled, on_exceed=d.on_exceed or "stop",
                       reload_floor=d.reload_floor)


def make_rollout_engine(policy: PolicyConfig, model: torch.nn.Module, tokenizer: Any, *, seed: int,
                        max_positions: int, engine_args: dict[str, Any]) -> Any:
    """The engine of ``policy`` (module docstring) over the rollout ``model``; ``seed``: the run's seed;
    ``engine_args``: the plan's ``vllm.LLM`` settings (the policy's own ``engine_args`` win)."""
    engine = _engine(policy, model, tokenizer, seed=seed, max_positions=max_positions, engine_args=engine_args)
    if policy.sampling.stop_at_newline:
        engine.add_stop_ids(newline_token_ids(tokenizer))
    return engine


def _engine(policy: PolicyConfig, model: torch.nn.Module, tokenizer: Any, *, seed: int, max_positions: int,
            engine_args: dict[str, Any]) -> Any:
    if policy.engine == "hf":
        return HFEngine(model, tokenizer, max_batch_size=policy.sampling.max_batch_size)
    try:
        from mrl_llm.rollout import make_engine  # the vLLM engine, when this install has it
    except ImportError as err:
        raise ConfigError(
            f"policy {policy.name!r}: engine 'vllm' needs mrl_llm.rollout.make_engine and vLLM, which this "
            f"install lacks ({err}); install the vllm extra or set engine: hf"
        ) from err
    max_len = min(policy.max_prompt_len + policy.sampling.max_new_tokens, max_positions)
    args = {**engine_args, **policy.engine_args}  # the plan's, then the policy's own
    if "max_model_len" in args:  # the plan's sequence length, within the model's positions
        args["max_model_len"] = min(int(args["max_model_len"]), max_positions)
    options = {"dtype": {"bf16": "bfloat16", "fp32": "float32"}[policy.dtype],
               "seed": derive_seed(seed, policy.name, "engine") % 2**31,
               "max_model_len": max_len,
               "drift": drift_config(policy),
               "engine_args": args}
    if policy.model_dir is not None and policy.tokenizer_path == policy.model_dir and Path(policy.model_dir).is_dir():
        # vLLM loads the initial weights itself; updates arrive by sync_weights
        return make_engine("vllm", model_dir=policy.model_dir, **options)
    # a model_config policy (or one with its own tokenizer_dir): its initial weights and tokenizer are
    # saved to a directory the engine starts from (and removes when closed)
    return make_engine("vllm", model=model, tokenizer=tokenizer, **options)


def reload_metrics(r: ReloadReport) -> dict[str, float]:
    """A reload check's metrics row: ``drift_reload_err``, ``drift_reload_move``, ``drift_reload_engine_move``,
    ``drift_reload_exceeded``."""
    return {"drift_reload_err": r.err, "drift_reload_move": r.move, "drift_reload_engine_move": r.engine_move,
            "drift_reload_exceeded": float(r.exceeded)}


class RankEngine:
    """A rank's engine and the two models it syncs between (module docstring): ``trained`` (the masters,
    sharded for k > 1) and ``rollout`` (what the engine samples from; ``trained`` itself for k = 1). ``drift``:
    the policy's drift checks (None: none); the reload check needs the trainer's probe log-probs of the previous
    sync, taken here first (a collective for k > 1: every rank builds its RankEngine)."""

    def __init__(self, engine: Any | None, *, trained: torch.nn.Module, rollout: torch.nn.Module, precision: Precision,
                 device: torch.device, drift: DriftConfig | None = None) -> None:
        self.engine, self.trained, self.rollout = engine, trained, rollout
        self.precision, self.device = precision, device
        self.autocast = functools.partial(precision.autocast, device)
        self.drift = drift if drift is not None and drift.enabled else None
        self.last_reload: ReloadReport | None = None
        self.syncs = 0  # weight syncs so far (the reload check's version)
        self.probe = None if self.drift is None else reload_probe(model_vocab_size(rollout), self.drift)
        #: the trainer's probe log-probs at the previous sync and at the latest (what a split policy's trainers send)
        self.reference: tuple[list[list[float]], list[list[float]]] | None = None
        if self.probe is not None and (self.reloads or engine is None):
            now = probe_logprobs(trained, self.probe, self.autocast)
            self.reference = (now, now)

    @property
    def reloads(self) -> bool:
        """Whether the engine holds weights of its own that a sync must reload: a vLLM engine, or an HF engine over a
        k > 1 rank's rollout copy (at k = 1 the HF engine samples from the masters themselves)."""
        return self.engine is not None and (self.rollout is not self.trained or not self.samples_rollout)

    @property
    def samples_rollout(self) -> bool:
        """Whether the engine samples from the rollout model object itself (the HF engine), not from weights of
        its own (vLLM)."""
        return getattr(self.engine, "model", None) is self.rollout

    @property
    def exact(self) -> bool:
        """Whether the engine computes the probe as the trainer's reference does (the reload check's exact bound): an
        HF engine over a copy (the same code under the same autocast), or an engine of its own fp32 weights under an
        fp32 policy; not a low-precision engine of its own (a bf16 vLLM engine)."""
        if self.samples_rollout:
            return True
        return not self.precision.mixed and getattr(self.engine, "weight_dtype", None) == torch.float32

    def engine_logprobs(self) -> list[list[float]]:
        """The engine's log-probs of the reload probe: a vLLM engine scores it, an HF engine's model is run as it
        samples (under the precision's autocast)."""
        if self.probe is None:
            raise RuntimeError("the reload probe needs the policy's drift check (policies[].drift.enabled: true)")
        if self.samples_rollout:
            return probe_logprobs(self.rollout, self.probe, self.autocast)
        return self.engine.probe_logprobs(self.probe.prompts, self.probe.responses)

    def sample(self, prompt_ids: Sequence[Sequence[int]], n: int, sp: SamplingConfig) -> tuple[list[list[Sample]], float]:
        """``(n samples per prompt, seconds)``: the engine's ``generate`` under the precision's autocast."""
        if self.engine is None:
            raise RuntimeError("this rank has no rollout engine (a split policy's trainer: its rollout actors "
                               "sample); sampling was asked of it")
        t0 = time.perf_counter()
        with self.precision.autocast(self.device):  # the hf engine samples from the master model
            out = self.engine.generate(prompt_ids, n, sp)
        return out, time.perf_counter() - t0

    def sync(self, state: Mapping[str, torch.Tensor] | None = None) -> None:
        """The engine gets the trained weights (the vllm engine runs its sample drift check); for k > 1 gathered from
        the shards into the full rollout copy first, bucket by bucket (a collective: every rank calls it). Then the
        reload check (:func:`~mrl_llm.rollout.drift.reload_check`) of an engine that holds its own weights
        (:attr:`reloads`), and the trainer's probe log-probs move on (:attr:`reference`). ``state``: the weights as
        received (a split policy's rollout actor, in the engine's dtype), which a vLLM engine loads as they are."""
        self.syncs += 1
        check = self.probe is not None and self.reloads
        engine_old = self.engine_logprobs() if check else None
        if self.rollout is not self.trained:
            gather_into(self.trained, self.rollout)
        release_cached_device_memory()  # the update's activations and gradients, before the engine needs the room
        if self.engine is not None:
            with self.precision.autocast(self.device):
                if state is not None and not self.samples_rollout:
                    self.engine.sync_weights(self.rollout, state)
                else:  # the HF engine samples from the model, which has them
                    self.engine.sync_weights(self.rollout)
        if self.reference is None:
            return
        ref_new = probe_logprobs(self.trained, self.probe, self.autocast)
        self.reference = (self.reference[1], ref_new)
        if check:
            self.last_reload = reload_check(engine_old, self.engine_logprobs(), *self.reference, self.drift,
                                            exact=self.exact, version=self.syncs, where=self.describe())

    def check_received(self, engine_old: list[list[float]], reference: Any, *, version: int) -> None:
        """A split policy's rollout actor, after it took the trainers' weights and synced its engine: the reload check
        of its engine (``engine_old``: its probe log-probs before the weights arrived) against the trainers' probe
        log-probs ``reference`` (:attr:`reference` of their :class:`RankEngine`: previous sync, this one)."""
        old, new = reference
        self.last_reload = reload_check(engine_old, self.engine_logprobs(), old, new, self.drift, exact=self.exact,
                                        version=version, where=f"this rollout actor's {type(self.engine).__name__}")

    def describe(self) -> str:
        """The engine in words, for the reload check's message."""
        if self.samples_rollout:
            return "the HF engine's rollout copy of this rank"
        return f"this rank's {type(self.engine).__name__}"

    def drift_metrics(self) -> dict[str, float]:
        """``drift_mean_abs``, ``drift_max_abs``, ``drift_exceeded`` of the engine's last sample drift check (vLLM) and
        the last reload check's :func:`reload_metrics`; empty when neither ran (the HF engine over the masters, or
        the checks disabled)."""
        out: dict[str, float] = {}
        drift = getattr(self.engine, "last_drift", None)
        if drift is not None:
            out.update({"drift_mean_abs": float(drift.mean_abs), "drift_max_abs": float(drift.max_abs),
                        "drift_exceeded": float(drift.exceeded)})
        if self.last_reload is not None:
            out.update(reload_metrics(self.last_reload))
        return out

    def close(self) -> None:
        """Release the engine's resources."""
        if self.engine is not None:
            self.engine.close()
