"""The trainer's typed config: one YAML file per experiment, mapped onto frozen dataclasses.

Layout (every key optional unless marked; unknown keys are errors naming the key)::

    name: math-qwen-pair           # free label, copied into summary.json
    seed: 0
    steps: 100                     # training steps (one prompt batch each)
    prompts_per_step: 8            # B: the same B prompts go to every policy each step
    regime: {name: sgt, sgt: {weight: 1.0}, prp: {...}, advantage: {...}}   # shared_interfaces regimes
    loss: {clip_low: 0.2, clip_high: 0.28, agg: token-mean, kl_coef: 0.001}  # shared_interfaces LossConfig
    data: {path: train.jsonl, verifier: math, fields: {question: problem, answer: solution}}  # mrl_llm.data
    eval: {data: {...}, every: 10, k: 4, max_prompts: 64}
    few_shot: {shots: 3, mode: distinct, seed: 0, data: {path: examples.jsonl, verifier: math}}  # mrl_llm.data.shots
    policies:                      # required, at least one
      - name: qwen                 # required, unique; [A-Za-z0-9][A-Za-z0-9._-]{0,63} (it names folders)
        model_dir: models/Qwen2.5-Math-1.5B    # an HF model directory, or a hub id (Qwen/Qwen2.5-Math-1.5B) ...
        model_config: {model_type: llama, hidden_size: 64, ...}  # ... or a config for a fresh tiny model
        tokenizer_dir: ...         # default: model_dir; "utf8-bytes": the built-in byte tokenizer
        template: {text: "{question}\n{instruction}\n", instruction: ..., chat: never,  # mrl_llm.templates
                   shot_text: "Q: {question}\nA: \\boxed{{gold}}\n\n", shot_reply: "\\boxed{{gold}}"}
        dtype: bf16                # fp32 | bf16 (float32 / bfloat16 accepted)
        group_size: 8              # G
        max_prompt_len: 1024       # longer prompts are an error naming the prompt
        engine: hf                 # hf | vllm
        sampling: {temperature: 1.0, top_p: 1.0, max_new_tokens: 1024, stop_at_newline: false}
        train: {optimizer: adamw, lr: 1e-6, micro_batch: 4, grad_accum: null, grad_clip: 1.0,
                gradient_checkpointing: true, max_tokens_per_micro_batch: 16384, logprob_chunk: 1024,
                lr_groups: [{match: "*norm*", lr: 1e-3}],   # optional per-parameter-name rates; lr 0 freezes, sgt: false keeps them out of SGT
                fsdp_unit: layer,          # ranks > 1: FSDP2 units of one decoder layer | model (one unit) | none (replicas: small models)
                grad_sync: micro_batch}    # ranks > 1, FSDP2: reduce-scatter every micro-batch | mini_batch (units kept gathered, once)
    checkpoint_every: 1            # steps between checkpoints (0: only at the end)
    runtime: {backend: local}      # local | ray (see RuntimeConfig)

Per policy also: ``device`` (auto, the default: cuda when torch sees a GPU, else cpu | cpu | cuda), ``drift`` (the vLLM engine's drift check, see
:class:`DriftSection`), ``engine_args`` (keyword arguments for ``vllm.LLM``, e.g.
``{gpu_memory_utilization: 0.3}``; under Ray they win over the MWRA plan's memory settings),
``join_step`` / ``leave_step`` (the steps ``join_step <= s < leave_step`` the policy takes part in; Ray
runtime only).

Seeds (``seed``, ``init_seed``) are integers in ``[0, 2**63)``; every float is finite and every integer
fits 64 bits (:mod:`shared_interfaces.config_io`). A ``model_config``'s sizes (``hidden_size``,
``num_hidden_layers``, ...) are integers >= 1, checked here; its keys against the model type's
config class and its ``vocab_size`` against the tokenizer when the run starts
(:func:`mrl_llm.preflight.check_model_configs`).

Relative paths are relative to the config file's directory; ``${VAR}`` and ``${VAR:-default}`` are
expanded from the environment, and ``${MRL_SHARED_DIR}`` falls back to the ``shared/`` folder found
beside the checkout. Model directories are *not* checked here (the planner reads configs whose
weights are elsewhere); :mod:`mrl_llm.models` checks them when a run starts.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from mrl_llm.byte_tokenizer import BYTE_TOKENIZER_ID
from mrl_llm.data import DataConfig
from mrl_llm.data.shots import FewShotConfig, check_run_section
from mrl_llm.distributed.memory import SIZE_KEYS
from mrl_llm.hub import is_hub_id
from mrl_llm.param_groups import LrGroup
from mrl_llm.templates import TemplateConfig
from shared_interfaces.config_io import ConfigError, from_mapping, load_yaml, to_mapping
from shared_interfaces.regimes.config import LossConfig, RegimeSpec, parse_regime, parse_regime_config

#: What a policy name may be: it names the folders ``checkpoints/<name>`` and ``policies/<name>`` of a run.
POLICY_NAME_RULE = "[A-Za-z0-9][A-Za-z0-9._-]{0,63}"
POLICY_NAME = re.compile(POLICY_NAME_RULE)
#: Seeds go to numpy and torch: ``0 <= seed < 2**63``.
SEED_LIMIT = 2**63
#: ``model_config`` keys that are sizes or counts: integers >= 1 when given (HF names and GPT-2's aliases): the
#: planner's (:data:`mrl_llm.distributed.memory.SIZE_KEYS`) and the context length.
MODEL_SIZE_KEYS = (*SIZE_KEYS, "max_position_embeddings")

DTYPE_ALIASES = {"fp32": "fp32", "float32": "fp32", "bf16": "bf16", "bfloat16": "bf16"}
REPO_ROOT = Path(__file__).resolve().parents[1]


def check_seed(seed: int | None, key: str) -> None:
    """A seed (None: derived) must be an integer in ``[0, 2**63)``; :class:`ConfigError` naming ``key``."""
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < SEED_LIMIT):
        raise ConfigError(f"{key} {seed!r} is out of range; a seed is an integer with 0 <= seed < 2**63")


def _finite_numbers(value: Any, key: str) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{key}: {value!r} is not a finite number")
    if isinstance(value, Mapping):
        for k, v in value.items():
            _finite_numbers(v, f"{key}.{k}")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _finite_numbers(v, f"{key}[{i}]")


def check_model_config(mc: Mapping[str, Any], where: str) -> None:
    """The checks of a ``model_config`` that need no transformers import (module docstring):
    a ``model_type`` string, sizes (:data:`MODEL_SIZE_KEYS`) integers >= 1, every number finite."""
    mt = mc.get("model_type")
    if not isinstance(mt, str) or not mt:
        raise ConfigError(f"{where} needs a model_type (e.g. llama, qwen2), got {mt!r}")
    for key in MODEL_SIZE_KEYS:
        v = mc.get(key)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError(f"{where}.{key} must be an integer >= 1, got {v!r}")
    _finite_numbers(dict(mc), where)


@dataclass(frozen=True)
class SamplingSection:
    """Rollout sampling of one policy. ``max_batch_size``: the most sequences in flight in one engine forward;
    the HF engine sizes its batch from memory (:mod:`mrl_llm.rollout.hf_batch`) and this caps it."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 256
    max_batch_size: int = 64
    # sample (the default): one seed per (prompt, sample index), so a record does not depend on how a worker group
    # splits the step's prompts over its ranks (k ranks equal one); call: one seed per engine call (the samples
    # depend on the call's prompts, so rank 0 samples the whole step while the other ranks wait)
    seeding: Literal["call", "sample"] = "sample"
    # true: a response also ends at its first token whose text holds a newline (kept, like EOS; the engine's stop
    # ids, mrl_llm.rollout.base.newline_token_ids), and it is graded on its text before that newline -- one-line
    # answers after few-shot examples (a base model goes on with the next "Q:" otherwise)
    stop_at_newline: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.stop_at_newline, bool):
            raise ConfigError(f"sampling.stop_at_newline must be true or false, got {self.stop_at_newline!r}")
        if not self.temperature > 0:
            raise ConfigError(f"sampling.temperature must be > 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"sampling.top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1 or self.max_batch_size < 1:
            raise ConfigError("sampling.max_new_tokens and sampling.max_batch_size must be >= 1")


@dataclass(frozen=True)
class TrainSection:
    """One policy's optimisation.

    Each step's rows are cut into micro-batches of ``micro_batch`` rows (one forward/backward each).
    ``grad_accum = None``: the gradients of all micro-batches accumulate into ONE optimizer update per
    step; ``grad_accum = k``: an update every ``k`` micro-batches (PPO-style mini-batches, several
    updates per step). Either way the loss of a mini-batch is normalised over the whole mini-batch
    (:class:`shared_interfaces.losses.LossNorm`), so the accumulated gradient equals the gradient of
    the mini-batch loss. ``grad_clip``: max global grad norm (None: no clipping).

    ``max_tokens_per_micro_batch`` (opt-in; None: ``micro_batch`` rows): micro-batches are instead
    grouped by tokens — within each mini-batch, rows longest first, each micro-batch as many rows as
    keep ``rows x longest (prompt + response)`` (its padded size) within the budget
    (:func:`mrl_llm.micro_batches.token_budget_groups`); the mini-batch stays ``micro_batch *
    grad_accum`` rows. It must be >= ``max_prompt_len + sampling.max_new_tokens``. ``logprob_chunk``:
    positions per checkpointed LM-head + log-softmax chunk (:func:`mrl_llm.logprobs.forward_logprobs`;
    None: all positions at once). ``share_prefix`` (opt-in): the rows of a micro-batch that hold the same prompt
    (a group's samples) run it through the backbone once, their responses after its KV cache
    (:mod:`mrl_llm.prefix_logprobs`: the same values and gradients up to float rounding), in the update, the
    snapshot and the reference passes; ignored with ``gradient_checkpointing``, ``ranks > 1`` (FSDP2) or a model
    whose head is not separable. ``micro_batch`` a multiple of ``group_size`` keeps a group in one micro-batch.

    ``lr_groups`` (opt-in): ``[{match: GLOB, lr: LR}, ...]`` -- parameters whose name matches ``GLOB``
    train at ``LR`` (first match wins; ``lr: 0`` freezes them; the rest at ``lr``), e.g. a larger rate
    for the norms' gains and a frozen embedding (:func:`mrl_llm.param_groups.split_param_groups`);
    ``sgt: false`` on a group: its parameters take no gradient from SGT's term (one rank only).

    ``fsdp_unit`` (``ranks > 1``): ``layer`` shards each decoder layer as its own FSDP2 unit (one layer's full
    weights gathered at a time: what a large model needs); ``model`` makes the whole model one unit (one
    all-gather per forward and per backward instead of one per layer: for a small model, where the per-layer
    collectives are latency; the planner counts the whole gathered model) (:func:`mrl_llm.parallel.fsdp.shard_model`);
    ``none``: no FSDP — every rank holds the whole model, its fp32 masters and optimizer state (data parallel,
    ZeRO-0), and the ranks' gradients are summed in one fp32 all-reduce per mini-batch
    (:meth:`mrl_llm.parallel.share.RankShare.reduce_grads`): no collective in forward or backward and no weight gather
    after the update (the engine samples from the model itself, as with one rank), for a model whose whole training
    state fits one device.

    ``grad_sync`` (``ranks > 1`` with FSDP2 units): ``micro_batch`` gathers each unit's weights in every forward and
    backward and reduce-scatters its gradients after every micro-batch (verl's schedule: the least memory);
    ``mini_batch`` keeps the units gathered from a mini-batch's first forward to its end and accumulates the
    gradients unsharded, in fp32, reduce-scattering them once after its last micro-batch (FSDP2's
    ``set_requires_gradient_sync``: HF Accelerate's gradient accumulation without ``sync_each_batch``) — one
    all-gather and one reduce-scatter per unit a mini-batch instead of three collectives per micro-batch, for the
    memory of the whole model's compute-dtype weights (the reference's too) and its fp32 gradient on every rank,
    which the planner counts. The update is the same either way (float rounding). Nothing changes with replicas
    (their gradients are summed once a mini-batch already) or one rank.
    """

    optimizer: Literal["adamw", "adam", "sgd"] = "adamw"
    lr: float = 1e-6
    weight_decay: float = 0.0
    betas: tuple[float, ...] = (0.9, 0.999)
    eps: float = 1e-8
    grad_clip: float | None = 1.0
    micro_batch: int = 4
    grad_accum: int | None = None
    gradient_checkpointing: bool = False
    max_tokens_per_micro_batch: int | None = None
    logprob_chunk: int | None = 1024
    share_prefix: bool = False
    #: per-parameter-name learning rates (:mod:`mrl_llm.param_groups`): first matching glob wins, lr 0 freezes
    lr_groups: tuple[LrGroup, ...] = ()
    fsdp_unit: Literal["layer", "model", "none"] = "layer"
    grad_sync: Literal["micro_batch", "mini_batch"] = "micro_batch"

    def __post_init__(self) -> None:
        if self.max_tokens_per_micro_batch is not None and self.max_tokens_per_micro_batch < 2:
            raise ConfigError(f"train.max_tokens_per_micro_batch must be >= 2 or null, got "
                              f"{self.max_tokens_per_micro_batch}")
        if self.logprob_chunk is not None and self.logprob_chunk < 1:
            raise ConfigError(f"train.logprob_chunk must be >= 1 or null (unchunked), got {self.logprob_chunk}")
        if not self.lr > 0:
            raise ConfigError(f"train.lr must be > 0, got {self.lr}")
        if self.micro_batch < 1:
            raise ConfigError(f"train.micro_batch must be >= 1, got {self.micro_batch}")
        if self.grad_accum is not None and self.grad_accum < 1:
            raise ConfigError(f"train.grad_accum must be >= 1 or null, got {self.grad_accum}")
        if self.grad_clip is not None and not self.grad_clip > 0:
            raise ConfigError(f"train.grad_clip must be > 0 or null, got {self.grad_clip}")
        if len(self.betas) != 2:
            raise ConfigError(f"train.betas must be two numbers, got {list(self.betas)}")
        if not all(0 <= b < 1 for b in self.betas):
            raise ConfigError(f"train.betas must be in [0, 1) (Adam's moment decays), got {list(self.betas)}")
        if not self.eps > 0:
            raise ConfigError(f"train.eps must be > 0 (Adam's denominator term), got {self.eps}")
        if not self.weight_decay >= 0:
            raise ConfigError(f"train.weight_decay must be >= 0, got {self.weight_decay}")


@dataclass(frozen=True)
class DriftSection:
    """The vLLM engine's drift check after every weight sync (:class:`mrl_llm.rollout.DriftConfig`):
    mean |engine log-prob - trainer log-prob| over ``probe_prompts`` probe responses of ``probe_tokens``
    tokens should stay <= ``threshold`` nats (fp32 engine and trainer: ~1e-6; bf16: ~1e-2). Above it,
    ``on_exceed: stop`` ends the run with an error and ``warn`` logs a warning and goes on (default:
    ``warn`` for a bf16 policy, whose short probe is noisy, ``stop`` for fp32). Logged every sync as
    ``drift_mean_abs`` (and ``drift_exceeded``). The same settings drive the **reload check** of every engine or copy
    that holds weights of its own (a vLLM engine, a k > 1 rank's HF rollout copy, a split policy's rollout
    actors): the engine's log-prob movement over the sync must match the trainer's to within
    ``max(reload_floor, 0.5 x the movement)`` on a fixed probe (:mod:`mrl_llm.rollout.drift`), so a reload that did
    not take effect is caught even when one update moves the log-probs far less than the dtype's noise; logged as
    ``drift_reload_err``, ``drift_reload_move`` (and ``drift_reload_exceeded``)."""

    threshold: float = 0.05
    probe_prompts: int = 2
    probe_tokens: int = 8
    enabled: bool = True
    on_exceed: Literal["warn", "stop"] | None = None
    reload_floor: float = 1e-5

    def __post_init__(self) -> None:
        if not self.threshold > 0 or self.probe_prompts < 1 or self.probe_tokens < 1:
            raise ConfigError("drift: threshold must be > 0, probe_prompts and probe_tokens >= 1")
        if not self.reload_floor > 0:
            raise ConfigError(f"drift.reload_floor must be > 0 nats (default 1e-5), got {self.reload_floor}")


def check_vllm_sampling(temperature: float, top_p: float, where: str) -> None:
    """The vllm engine's refusals of a sampling setting (:func:`mrl_llm.rollout.vllm_engine.check_sampling`:
    log-probs it would record are not the project's) as a :class:`ConfigError` at load, not at the first rollout."""
    from mrl_llm.rollout.base import SamplingConfig
    from mrl_llm.rollout.vllm_engine import check_sampling

    try:
        check_sampling(SamplingConfig(temperature=temperature, top_p=top_p))
    except ValueError as err:
        raise ConfigError(f"{where}: {err}") from err


@dataclass(frozen=True)
class PolicyConfig:
    """One policy: its weights (``model_dir`` or ``model_config``), tokenizer, prompt template
    (:class:`mrl_llm.templates.TemplateConfig`: the text with the answer-format instruction) and training."""

    name: str
    model_dir: str | None = None
    model_config: dict[str, Any] | None = None
    tokenizer_dir: str | None = None
    template: TemplateConfig = field(default_factory=TemplateConfig)
    dtype: Literal["fp32", "bf16", "float32", "bfloat16"] = "fp32"
    group_size: int = 8
    max_prompt_len: int = 1024
    # hf by default on CPU: vLLM samples faster at steady state but its start-up and per-step weight sync
    # cost more than a demo-sized run's rollouts (experiments/bench/engine_throughput.py)
    engine: Literal["hf", "vllm"] = "hf"
    sampling: SamplingSection = field(default_factory=SamplingSection)
    train: TrainSection = field(default_factory=TrainSection)
    init_seed: int | None = None  # seed of a fresh model_config model (default: derived from run seed)
    device: Literal["cpu", "cuda", "auto"] = "auto"  # auto: cuda when torch sees a GPU, else cpu
    drift: DriftSection = field(default_factory=DriftSection)
    engine_args: dict[str, Any] = field(default_factory=dict)  # vllm.LLM kwargs; win over the MWRA plan's
    join_step: int = 0
    leave_step: int | None = None
    ranks: int = 1  # worker-group size on Ray: k actors (FSDP2 ranks), one per planned bundle (mrl_llm.parallel)

    def __post_init__(self) -> None:
        if not POLICY_NAME.fullmatch(self.name):
            raise ConfigError(f"policies[].name {self.name!r} is not a valid policy name: it must match "
                              f"{POLICY_NAME_RULE} (letters, digits, '.', '_', '-'; it names the run's folders)")
        check_seed(self.init_seed, f"policy {self.name!r}: init_seed")
        if (self.model_dir is None) == (self.model_config is None):
            raise ConfigError(
                f"policy {self.name!r}: give exactly one of model_dir (an HF model directory) or "
                "model_config (a config mapping for a fresh model)"
            )
        if self.model_config is not None:
            check_model_config(self.model_config, f"policy {self.name!r}: model_config")
        if self.engine == "vllm":
            check_vllm_sampling(self.sampling.temperature, self.sampling.top_p, f"policy {self.name!r}: sampling")
        if self.engine_args and self.engine != "vllm":
            raise ConfigError(f"policy {self.name!r}: engine_args {sorted(self.engine_args)} are vllm.LLM's and the "
                              f"policy's engine is {self.engine!r}; set engine: vllm or remove engine_args")
        object.__setattr__(self, "dtype", DTYPE_ALIASES[self.dtype])
        if self.drift.on_exceed is None:  # a noisy bf16 probe warns; an fp32 mismatch is a bug: stop
            object.__setattr__(self, "drift", replace(self.drift, on_exceed="warn" if self.dtype == "bf16" else "stop"))
        if self.group_size < 1:
            raise ConfigError(f"policy {self.name!r}: group_size must be >= 1, got {self.group_size}")
        if isinstance(self.ranks, bool) or not isinstance(self.ranks, int) or self.ranks < 1:
            raise ConfigError(f"policy {self.name!r}: ranks must be an integer >= 1 (the policy's worker-group size), "
                              f"got {self.ranks!r}")
        if self.ranks > 1 and self.train.fsdp_unit != "none" and any(not g.sgt for g in self.train.lr_groups):
            raise ConfigError(f"policy {self.name!r}: train.lr_groups with sgt: false needs ranks: 1 or train.fsdp_unit: "
                              f"none (the SGT term is back-propagated apart, which an FSDP2 worker group cannot do); "
                              f"drop sgt: false, run the policy on one rank, or as whole replicas")
        if self.max_prompt_len < 1:
            raise ConfigError(f"policy {self.name!r}: max_prompt_len must be >= 1")
        budget, longest = self.train.max_tokens_per_micro_batch, self.max_prompt_len + self.sampling.max_new_tokens
        if budget is not None and budget < longest:
            raise ConfigError(
                f"policy {self.name!r}: train.max_tokens_per_micro_batch {budget} is below the longest row "
                f"max_prompt_len + sampling.max_new_tokens = {longest}; raise it to at least {longest}"
            )
        if self.join_step < 0 or (self.leave_step is not None and self.leave_step <= self.join_step):
            raise ConfigError(f"policy {self.name!r}: need 0 <= join_step < leave_step, got "
                              f"{self.join_step} and {self.leave_step}")

    @property
    def tokenizer_path(self) -> str | None:
        return self.tokenizer_dir or self.model_dir


@dataclass(frozen=True)
class EvalConfig:
    """The fixed evaluation protocol: on ``data`` (default: the training data's first ``max_prompts``),
    every policy answers each prompt greedily once and samples ``k`` responses (``temperature``,
    ``top_p``) for pass@k. Runs before training (step 0), every ``every`` steps (0: never in between)
    and after the last step. ``max_new_tokens`` defaults to each policy's own."""

    data: DataConfig | None = None
    every: int = 0
    k: int = 4
    temperature: float = 1.0
    top_p: float = 1.0
    max_prompts: int | None = 64
    max_new_tokens: int | None = None
    enabled: bool = True

    def __post_init__(self) -> None:
        if self.every < 0 or self.k < 0:
            raise ConfigError("eval.every and eval.k must be >= 0")
        if self.max_prompts is not None and self.max_prompts < 1:
            raise ConfigError("eval.max_prompts must be >= 1 or null")
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise ConfigError(f"eval.max_new_tokens must be >= 1, or null for each policy's own sampling.max_new_tokens; "
                              f"got {self.max_new_tokens}")
        if not self.temperature > 0 or not 0 < self.top_p <= 1:
            raise ConfigError("eval.temperature must be > 0 and eval.top_p in (0, 1]")


@dataclass(frozen=True)
class RuntimeConfig:
    """Where the steps run; both backends run one schedule (:class:`mrl_llm.distributed.driver.Driver`):
    ``mode: sync`` (a barrier per step) or ``async`` with ``max_staleness`` k (generation runs up to k
    steps ahead of training; k = 0 is the synchronous schedule). ``backend: local`` — the policies' actors
    in one process, one call after the other (the same run as Ray's for the same seed). ``backend: ray`` —
    one Ray actor (or worker group) per policy, the exchange as a Ray actor, placed by the MWRA plan
    (:mod:`mrl_llm.distributed.ray_trainer`). ``address``: an existing Ray cluster (``auto``, ``ray://host:10001``);
    null starts a local one with ``num_cpus`` CPUs (null: all). ``cluster``: a cluster YAML to plan
    for (default: the Ray cluster's resources); ``placement``: the plan's layout (auto, colocated,
    split — trainer and rollout actors on their own bundles, :mod:`mrl_llm.distributed.split_group` —, cpu).
    ``weight_transfer`` (split only): how the trainers' weights reach the rollout actors after each update —
    ``collective`` (a broadcast over the policy's weight bus, :mod:`mrl_llm.parallel.weight_bus`: nccl between
    GPUs, gloo on CPU), ``object_store`` (Ray's object store), ``auto`` (collective on GPUs, the object store
    on CPUs).
    ``collective_timeout_s`` (default 1800): how long a worker group's collectives (and its rendezvous) wait for
    the slowest rank before failing (:class:`mrl_llm.parallel.group.GroupSpec`); a rank that waits for another's
    rollout waits outside any collective (:meth:`mrl_llm.parallel.group.WorkerGroup.wait_for_ranks`), so this
    bounds one update's collectives, not a rollout. ``weight_bus_timeout_s`` (default 1800): the same for a
    split policy's weight bus (:mod:`mrl_llm.parallel.weight_bus`), whose rollout actors wait in the broadcast
    for the whole of the trainers' update: set it above one update's time. ``max_restarts`` (default 3): how
    many times a policy's actor or worker group is restarted from the same checkpoint step without finishing a
    step in between; one more failure stops the run with a line naming the policy, the step and the cause
    (:class:`mrl_llm.distributed.driver.RestartLimit`).
    The workers of an existing cluster must be able to import this package (install it
    there); a local cluster inherits this process's environment."""

    backend: Literal["local", "ray"] = "local"
    mode: Literal["sync", "async"] = "sync"
    max_staleness: int = 0
    address: str | None = None
    num_cpus: int | None = None
    cluster: str | None = None
    placement: Literal["auto", "colocated", "split", "cpu"] = "auto"
    weight_transfer: Literal["auto", "object_store", "collective"] = "auto"
    collective_timeout_s: float = 1800.0
    weight_bus_timeout_s: float = 1800.0
    max_restarts: int = 3

    def __post_init__(self) -> None:
        for key in ("collective_timeout_s", "weight_bus_timeout_s"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                raise ConfigError(f"runtime.{key} must be a number of seconds > 0 (default 1800), got {v!r}")
        if isinstance(self.max_restarts, bool) or not isinstance(self.max_restarts, int) or self.max_restarts < 0:
            raise ConfigError(f"runtime.max_restarts must be an integer >= 0 (0: never restart), "
                              f"got {self.max_restarts!r}")
        if self.max_staleness < 0 or (self.mode == "sync" and self.max_staleness):
            raise ConfigError(f"runtime.max_staleness must be 0 with mode sync and >= 0 with mode async, "
                              f"got {self.max_staleness} with {self.mode}")
        if self.num_cpus is not None and self.num_cpus < 1:
            raise ConfigError("runtime.num_cpus must be >= 1 or null")


@dataclass(frozen=True)
class RunConfig:
    """A whole experiment (module docstring). ``regime`` is a regime section; :attr:`regime_spec` parses it."""

    policies: tuple[PolicyConfig, ...]
    regime: dict[str, Any] = field(default_factory=lambda: {"name": "grpo"})
    loss: LossConfig = field(default_factory=LossConfig)
    data: DataConfig | None = None
    eval: EvalConfig = field(default_factory=EvalConfig)
    few_shot: FewShotConfig = field(default_factory=FewShotConfig)
    name: str = ""
    seed: int = 0
    steps: int = 10
    prompts_per_step: int = 8
    threads: int | None = None
    checkpoint_every: int = 1
    keep_checkpoints: int = 2
    max_nan_steps: int = 3
    track_ref_kl: bool = True
    tensorboard: bool = True
    progress: bool = True
    exchange_fsync: bool = False
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)

    def __post_init__(self) -> None:
        check_seed(self.seed, "config: seed")
        if not self.policies:
            raise ConfigError("config: 'policies' must list at least one policy")
        names = [p.name for p in self.policies]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ConfigError(f"config: policy names must be unique, {dup} repeat")
        if self.steps < 0 or self.prompts_per_step < 1:
            raise ConfigError("config: steps must be >= 0 and prompts_per_step >= 1")
        if self.checkpoint_every < 0 or self.keep_checkpoints < 1 or self.max_nan_steps < 1:
            raise ConfigError("config: checkpoint_every >= 0, keep_checkpoints >= 1, max_nan_steps >= 1")
        if self.threads is not None and self.threads < 1:
            raise ConfigError("config: threads must be >= 1 or null")
        if not isinstance(self.regime, Mapping):
            raise ConfigError("config: regime must be a mapping like {name: sgt}")
        self.regime_spec  # noqa: B018 - validates the section
        try:
            check_run_section(self.few_shot)
        except ValueError as err:
            raise ConfigError(f"config: {err}") from None
        if self.eval.enabled and self.eval.k > 0:  # the sampled half of evaluation runs on each policy's engine
            for p in self.policies:
                if p.engine == "vllm":
                    check_vllm_sampling(self.eval.temperature, self.eval.top_p, f"eval (policy {p.name!r}'s engine)")
        moving = [p.name for p in self.policies if p.join_step or p.leave_step is not None]
        if moving and self.runtime.backend != "ray":
            raise ConfigError(f"config: policies {moving} set join_step/leave_step (or --join / --leave), which only "
                              "the Ray runtime honours; add runtime: {backend: ray} or pass --runtime ray")

    @property
    def regime_spec(self) -> RegimeSpec:
        return parse_regime_config(self.regime)

    @property
    def policy_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.policies)

    def policy(self, name: str) -> PolicyConfig:
        for p in self.policies:
            if p.name == name:
                return p
        raise KeyError(f"no policy {name!r}; policies: {list(self.policy_names)}")

    def with_regime(self, name: str) -> RunConfig:
        """The same config under regime ``name``, keeping the section's settings (``--regime``)."""
        rest = {k: v for k, v in self.regime.items() if k != "name"}
        parse_regime(name, rest)  # validates
        return replace(self, regime={"name": name, **rest})

    def with_seed(self, seed: int) -> RunConfig:
        return replace(self, seed=seed)

    def with_membership(self, name: str, *, join_step: int | None = None, leave_step: int | None = None) -> RunConfig:
        """The same config with policy ``name`` joining / leaving at the given steps (``--join`` / ``--leave``)."""
        pol = self.policy(name)
        pol = replace(pol, join_step=pol.join_step if join_step is None else join_step,
                      leave_step=pol.leave_step if leave_step is None else leave_step)
        return replace(self, policies=tuple(pol if p.name == name else p for p in self.policies))

    def to_dict(self) -> dict[str, Any]:
        return to_mapping(self)


_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def find_shared_dir() -> Path | None:
    """``$MRL_SHARED_DIR``, else ``shared/`` beside or inside the checkout (the one with tokenizers/)."""
    for cand in (os.environ.get("MRL_SHARED_DIR"), REPO_ROOT.parent / "shared", REPO_ROOT / "shared"):
        if cand and (Path(cand) / "tokenizers").is_dir():
            return Path(cand)
    return None


def expand_path(value: str, base: Path) -> str:
    """Expand ``~`` and ``${VAR}`` / ``${VAR:-default}``; a relative result is taken from ``base``."""

    def sub(m: re.Match[str]) -> str:
        var, default = m.group(1), m.group(2)
        got = os.environ.get(var)
        if got:
            return got
        if var == "MRL_SHARED_DIR":
            found = find_shared_dir()
            if found is not None:
                return str(found)
        if default is not None:
            return default
        raise ConfigError(f"path {value!r} uses ${{{var}}}, which is not set; export {var}=...")

    out = Path(os.path.expanduser(_VAR.sub(sub, value)))
    return str(out if out.is_absolute() else (base / out).resolve())


def _resolve_paths(cfg: RunConfig, base: Path) -> RunConfig:
    def data(d: DataConfig | None) -> DataConfig | None:
        return None if d is None else replace(d, path=expand_path(d.path, base))

    def model_path(value: str | None) -> str | None:  # a hub id (mrl_llm.hub) stays as it is
        return value if value in (None, BYTE_TOKENIZER_ID) or is_hub_id(value, base) else expand_path(value, base)

    pols = tuple(
        replace(p, model_dir=model_path(p.model_dir), tokenizer_dir=model_path(p.tokenizer_dir)) for p in cfg.policies
    )
    return replace(cfg, policies=pols, data=data(cfg.data), eval=replace(cfg.eval, data=data(cfg.eval.data)),
                   few_shot=replace(cfg.few_shot, data=data(cfg.few_shot.data)))


def config_from_mapping(data: Mapping[str, Any], *, base_dir: str | Path = ".", where: str = "config") -> RunConfig:
    """A :class:`RunConfig` from a plain mapping (YAML), paths resolved against ``base_dir``."""
    try:
        cfg = from_mapping(RunConfig, data, where=where)
    except ConfigError:
        raise
    except ValueError as err:  # a section's own validation error (e.g. DataError)
        raise ConfigError(f"{where}: {err}") from err
    return _resolve_paths(cfg, Path(base_dir).resolve())


def load_config(path: str | Path) -> RunConfig:
    """Read and validate an experiment YAML (module docstring); errors name the file and the key."""
    p = Path(path)
    data = load_yaml(p)
    if not isinstance(data, Mapping):
        raise ConfigError(f"{p}: the top level must be a mapping of config keys")
    try:
        return config_from_mapping(data, base_dir=p.parent, where=str(p))
    except ConfigError as err:
        msg = str(err)
        raise ConfigError(msg if msg.startswith(str(p)) else f"{p}: {msg}") from err
