"""What a rank is built from: :class:`WorkerConfig` (plain data, so that a Ray actor receives it as a
mapping, :func:`shared_interfaces.config_io.from_mapping`) and the learner's loss settings (:func:`learner_loss`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from mrl_llm.config import PolicyConfig
from mrl_llm.parallel.group import GroupSpec
from shared_interfaces.regimes.config import LossConfig


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
    rollout_engine: bool = True  # False: a split policy's trainer, which samples nothing (its rollout actors do)


def learner_loss(loss: LossConfig, policy: PolicyConfig) -> LossConfig:
    """The loss settings of learner ``policy``: Dr.GRPO's divisor ``max_response_len`` is the policy's
    generation budget ``sampling.max_new_tokens`` unless the config gives one (the core's 1 would make the
    policy-gradient and KL terms ``max_new_tokens`` times too large against SGT's mean)."""
    if loss.max_response_len is not None:
        return loss
    return replace(loss, max_response_len=policy.sampling.max_new_tokens)
