"""A rank's rollout engine: built from the policy (HF or vLLM), sampling, and the weight sync after an update.

* :func:`make_rollout_engine` — ``engine: hf`` samples from the rank's rollout model itself; ``engine: vllm``
  starts from the policy's ``model_dir`` (a ``model_config`` policy's initial weights, or a policy with its
  own tokenizer directory, are saved to a directory first), seeded by ``derive_seed(run seed, policy,
  "engine")``, with the plan's ``engine_args`` and then the policy's own, ``max_model_len`` capped at the
  model's positions, and the policy's drift check (``policies[].drift``).
* :class:`RankEngine` — :meth:`~RankEngine.sample` runs the engine under the precision's autocast (the HF
  engine samples from the fp32 master model in the compute dtype); :meth:`~RankEngine.sync` gives the engine
  the trained weights after an update: for k > 1 gathered from the shards into the full rollout copy first
  (a collective: every rank calls it), torch's cached CUDA blocks released, then ``engine.sync_weights`` (vLLM
  reloads in place and runs its drift check); :meth:`~RankEngine.drift_metrics` reports that check. A rank without an engine (``engine
  None``: a split policy's trainer, ``WorkerConfig.rollout_engine: false``) still gathers its rollout copy in
  :meth:`~RankEngine.sync` (what :meth:`mrl_llm.worker.LLMPolicyWorker.state` hashes) and refuses to sample.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from mrl_llm.config import PolicyConfig
from mrl_llm.parallel.fsdp import gather_into
from mrl_llm.precision import Precision
from mrl_llm.rank.seeds import derive_seed
from mrl_llm.rollout import HFEngine, Sample, SamplingConfig
from mrl_llm.rollout.base import release_cached_device_memory
from shared_interfaces.config_io import ConfigError


def make_rollout_engine(policy: PolicyConfig, model: torch.nn.Module, tokenizer: Any, *, seed: int,
                        max_positions: int, engine_args: dict[str, Any]) -> Any:
    """The engine of ``policy`` (module docstring) over the rollout ``model``; ``seed``: the run's seed;
    ``engine_args``: the plan's ``vllm.LLM`` settings (the policy's own ``engine_args`` win)."""
    if policy.engine == "hf":
        return HFEngine(model, tokenizer, max_batch_size=policy.sampling.max_batch_size)
    try:
        from mrl_llm.rollout import make_engine  # the vLLM engine, when this install has it
    except ImportError as err:
        raise ConfigError(
            f"policy {policy.name!r}: engine 'vllm' needs mrl_llm.rollout.make_engine and vLLM, which this "
            f"install lacks ({err}); install the vllm extra or set engine: hf"
        ) from err
    from mrl_llm.rollout import DriftConfig

    d = policy.drift
    max_len = min(policy.max_prompt_len + policy.sampling.max_new_tokens, max_positions)
    args = {**engine_args, **policy.engine_args}  # the plan's, then the policy's own
    if "max_model_len" in args:  # the plan's sequence length, within the model's positions
        args["max_model_len"] = min(int(args["max_model_len"]), max_positions)
    options = {"dtype": {"bf16": "bfloat16", "fp32": "float32"}[policy.dtype],
               "seed": derive_seed(seed, policy.name, "engine") % 2**31,
               "max_model_len": max_len,
               "drift": DriftConfig(threshold=d.threshold, n_prompts=d.probe_prompts, max_new_tokens=d.probe_tokens,
                                    temperature=policy.sampling.temperature, enabled=d.enabled,
                                    on_exceed=d.on_exceed or "stop"),
               "engine_args": args}
    if policy.model_dir is not None and policy.tokenizer_path == policy.model_dir and Path(policy.model_dir).is_dir():
        # vLLM loads the initial weights itself; updates arrive by sync_weights
        return make_engine("vllm", model_dir=policy.model_dir, **options)
    # a model_config policy (or one with its own tokenizer_dir): its initial weights and tokenizer are
    # saved to a directory the engine starts from (and removes when closed)
    return make_engine("vllm", model=model, tokenizer=tokenizer, **options)


class RankEngine:
    """A rank's engine and the two models it syncs between (module docstring): ``trained`` (the masters,
    sharded for k > 1) and ``rollout`` (what the engine samples from; ``trained`` itself for k = 1)."""

    def __init__(self, engine: Any | None, *, trained: torch.nn.Module, rollout: torch.nn.Module, precision: Precision,
                 device: torch.device) -> None:
        self.engine, self.trained, self.rollout = engine, trained, rollout
        self.precision, self.device = precision, device

    def sample(self, prompt_ids: Sequence[Sequence[int]], n: int, sp: SamplingConfig) -> tuple[list[list[Sample]], float]:
        """``(n samples per prompt, seconds)``: the engine's ``generate`` under the precision's autocast."""
        if self.engine is None:
            raise RuntimeError("this rank has no rollout engine (a split policy's trainer: its rollout actors "
                               "sample); sampling was asked of it")
        t0 = time.perf_counter()
        with self.precision.autocast(self.device):  # the hf engine samples from the master model
            out = self.engine.generate(prompt_ids, n, sp)
        return out, time.perf_counter() - t0

    def sync(self) -> None:
        """The engine gets the trained weights (the vllm engine runs its drift check); for k > 1 gathered from
        the shards into the full rollout copy first, bucket by bucket (a collective: every rank calls it)."""
        if self.rollout is not self.trained:
            gather_into(self.trained, self.rollout)
        release_cached_device_memory()  # the update's activations and gradients, before the engine needs the room
        if self.engine is None:
            return
        with self.precision.autocast(self.device):
            self.engine.sync_weights(self.rollout)

    def drift_metrics(self) -> dict[str, float]:
        """``drift_mean_abs``, ``drift_max_abs``, ``drift_exceeded`` of the engine's last drift check; empty
        when the engine has run none (the HF engine, or the check disabled)."""
        drift = getattr(self.engine, "last_drift", None)
        if drift is None:
            return {}
        return {"drift_mean_abs": float(drift.mean_abs), "drift_max_abs": float(drift.max_abs),
                "drift_exceeded": float(drift.exceeded)}

    def close(self) -> None:
        """Release the engine's resources."""
        if self.engine is not None:
            self.engine.close()
