"""Loading a policy's tokenizer and model, and saving a trained policy as an ordinary HF directory.

* :func:`load_tokenizer` — ``AutoTokenizer.from_pretrained(tokenizer_dir)`` (default ``model_dir``);
  a tokenizer without a pad token pads with its EOS (pads are masked out everywhere). A plain
  ``tokenizer.json`` tokenizer (``tokenizer_class`` TokenizersBackend / PreTrainedTokenizerFast) loads
  as exactly that, also in a model folder whose ``config.json`` would make ``AutoTokenizer`` swap in
  the model type's class (see :func:`_generic_tokenizer_class`).
* :func:`build_model` — ``AutoModelForCausalLM.from_pretrained(model_dir)`` (a directory or a hub id,
  :mod:`mrl_llm.hub`) in the policy's dtype, or
  a fresh ``from_config`` model from ``model_config`` (vocabulary size and special ids default to the
  tokenizer's; initialised from ``seed`` without touching the global RNG).
  Dropout is switched off (:func:`disable_dropout`; GPT-2's config, for one, has 0.1): the update's forward
  must give the log-probs the rollout engine, the snapshot pass and the reference give in eval mode, or the
  importance ratio and the KL are noise from the first step (what TRL's ``disable_dropout`` does).
* :func:`tokenizer_id` — the id records carry: a hash of the vocabulary, so two policies with the same
  vocabulary share it (and THL passes their traces through).
* :func:`save_policy` / :func:`load_policy` — a model + tokenizer directory that
  ``AutoModelForCausalLM.from_pretrained`` loads, plus ``mrl_policy.json`` (template, sampling, name).

Every failure says which policy, which path, and what to pass instead.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch

from mrl_llm.byte_tokenizer import BYTE_TOKENIZER_ID, byte_tokenizer
from mrl_llm.config import POLICY_NAME, PolicyConfig
from mrl_llm.distributed.cluster import MAX_MEMORY_GIB
from mrl_llm.distributed.memory import GiB
from mrl_llm.hub import hub_hint, is_hub_id
from shared_interfaces.config_io import ConfigError

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
POLICY_META = "mrl_policy.json"
log = logging.getLogger(__name__)


class ModelLoadError(ConfigError):
    """A model or tokenizer could not be loaded; the message names the policy and the path. A
    :class:`ConfigError` (the config points at it), so the command line prints it as one line."""


def load_tokenizer(policy: PolicyConfig):
    """The policy's tokenizer (module docstring)."""
    path = policy.tokenizer_path
    if path is None:
        raise ConfigError(
            f"policy {policy.name!r} has a model_config but no tokenizer_dir; add tokenizer_dir: DIR "
            "(a folder AutoTokenizer can load)"
        )
    if path == BYTE_TOKENIZER_ID:
        return byte_tokenizer()
    return load_tokenizer_dir(path, who=f"policy {policy.name!r}")


def load_tokenizer_dir(path: str | Path, *, who: str = "policy"):
    """``AutoTokenizer.from_pretrained(path)``, loaded once per process and folder (a slow-to-fast conversion
    takes seconds; the policies of a run and their peers share the object: treat it as read-only)."""
    if is_hub_id(str(path)):  # from the hub cache (or the hub), see mrl_llm.hub
        try:
            return _load_tokenizer_cached(str(path))
        except ModelLoadError as err:
            raise ModelLoadError(f"{who}: {err}; {hub_hint(str(path))}") from err
    p = Path(path).resolve()
    if not p.is_dir():
        raise ModelLoadError(f"tokenizer directory {p} for {who} not found; set tokenizer_dir (or model_dir)")
    require_tokenizer_files(p, who)
    try:
        return _load_tokenizer_cached(str(p))
    except ModelLoadError as err:
        raise ModelLoadError(f"{who}: {err}") from err


#: The files one of which a tokenizer folder holds (fast, BPE, SentencePiece and WordPiece tokenizers).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model", "spiece.model",
                   "vocab.txt")


def require_tokenizer_files(p: Path, who: str) -> None:
    """A :class:`ModelLoadError` when folder ``p`` holds none of :data:`TOKENIZER_FILES` (transformers would
    answer with advice to install sentencepiece or tiktoken, which does not help)."""
    if not any((p / name).is_file() for name in TOKENIZER_FILES):
        raise ModelLoadError(f"{who}: {p} holds no tokenizer files ({', '.join(TOKENIZER_FILES)}); point it at a "
                             "folder written by a tokenizer's save_pretrained")


#: ``tokenizer_class`` values of a plain ``tokenizer.json`` tokenizer (no model-specific class).
GENERIC_TOKENIZER_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")


def _generic_tokenizer_class(p: Path) -> bool:
    """Whether ``p`` holds a ``tokenizer.json`` whose ``tokenizer_config.json`` names a generic class.

    ``AutoTokenizer`` would replace such a tokenizer by the model type's own class when the folder
    also holds a ``config.json`` of certain model types (transformers 5 forces ``Qwen2Tokenizer`` on
    ``qwen2`` folders, which rebuilds the pre-tokenizer with Qwen's regex): a locally trained
    tokenizer saved beside a Qwen2-style model would then tokenize differently after a round trip."""
    cfg = p / "tokenizer_config.json"
    if not (p / "tokenizer.json").is_file() or not cfg.is_file():
        return False
    try:
        cls = json.loads(cfg.read_text()).get("tokenizer_class")
    except (OSError, ValueError):
        return False
    return cls in GENERIC_TOKENIZER_CLASSES


@lru_cache(maxsize=16)
def _load_tokenizer_cached(path: str):
    from transformers import AutoTokenizer

    p = Path(path)
    try:
        if _generic_tokenizer_class(p):
            from transformers import PreTrainedTokenizerFast

            tok = PreTrainedTokenizerFast.from_pretrained(str(p))
        else:
            tok = AutoTokenizer.from_pretrained(str(p))
    except Exception as err:  # noqa: BLE001 - re-raised with the path and a hint
        msg = " ".join(str(err).split())
        raise ModelLoadError(f"cannot load the tokenizer from {p}: {msg}") from err
    if tok.eos_token_id is None:
        raise ModelLoadError(f"the tokenizer at {p} has no eos_token; set one in its tokenizer_config.json")
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def tokenizer_id(tokenizer) -> str:
    """``vocab<size>-<16 hex of sha256 of the id -> token map>`` (the same vocabulary loaded from any
    folder gets the same id); ``utf8-bytes`` for the byte tokenizer."""
    if getattr(tokenizer, "name_or_path", None) == BYTE_TOKENIZER_ID:
        return BYTE_TOKENIZER_ID
    cached = getattr(tokenizer, "_mrl_tokenizer_id", None)
    if cached is not None:
        return cached
    h = hashlib.sha256()
    vocab = tokenizer.get_vocab()
    for tok, i in sorted(vocab.items(), key=lambda kv: kv[1]):
        h.update(f"{i}\t{tok}\n".encode("utf-8", "surrogatepass"))
    tid = f"vocab{len(vocab)}-{h.hexdigest()[:16]}"
    tokenizer._mrl_tokenizer_id = tid
    return tid


def model_config_keys(model_type: str) -> set[str]:
    """The parameters of ``model_type``'s transformers config class (and their aliases, e.g. GPT-2's
    ``n_embd``). :class:`ConfigError` for an unknown model type."""
    import inspect

    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if model_type not in CONFIG_MAPPING:
        raise ConfigError(f"model_config.model_type {model_type!r} is not a transformers model type "
                          "(e.g. llama, qwen2, mistral)")
    cls = CONFIG_MAPPING[model_type]
    keys = set(inspect.signature(cls.__init__).parameters) - {"self", "args", "kwargs"}
    return keys | set(getattr(cls, "attribute_map", {}) or {})


def fresh_config(policy: PolicyConfig, tokenizer) -> Any:
    """The transformers config of a ``model_config`` policy: vocabulary size and special ids default to
    the tokenizer's. :class:`ConfigError` naming the policy and the key for an unknown model type, a key
    the model type does not have, a ``vocab_size`` smaller than the tokenizer, or a config transformers
    refuses (the cheap checks are :func:`mrl_llm.config.check_model_config`).

    A key the model type does not have is one that is neither a parameter of its config class nor
    consumed by transformers (legacy spellings such as ``rope_theta`` or ``torch_dtype`` are: they are
    converted), i.e. one transformers would keep as an inert attribute that no model code reads."""
    from transformers import AutoConfig

    who = f"policy {policy.name!r}"
    cfg: dict[str, Any] = dict(policy.model_config or {})
    model_type = cfg.pop("model_type")
    try:
        known = model_config_keys(model_type)
    except ConfigError as err:
        raise ConfigError(f"{who}: {err}") from err
    n_tok = len(tokenizer)
    if cfg.get("vocab_size") is not None and cfg["vocab_size"] < n_tok:
        raise ConfigError(f"{who}: model_config.vocab_size {cfg['vocab_size']} is smaller than its tokenizer's "
                          f"({n_tok} tokens); set vocab_size >= {n_tok} or leave it out (default: the tokenizer's)")
    cfg.setdefault("vocab_size", n_tok)
    for key in ("eos_token_id", "bos_token_id", "pad_token_id"):
        val = getattr(tokenizer, key, None)
        if val is not None:
            cfg.setdefault(key, val)
    # before transformers builds per-layer lists of that size; this machine's memory is checked where the model is
    # built (build_model: on a Ray worker's node, not the driver's)
    check_model_size(shape_dict(model_type, cfg), who, MAX_MODEL_BYTES, "any machine holds")
    try:
        built = AutoConfig.for_model(model_type, **cfg)
        plain = set(vars(AutoConfig.for_model(model_type)))
    except Exception as err:  # noqa: BLE001 - any refusal of transformers, re-raised naming the policy
        msg = " ".join(str(err).split())
        raise ConfigError(f"{who}: model_config is not a valid {model_type!r} config: {msg}") from err
    unknown = sorted(k for k in cfg if k not in known and k in vars(built) and k not in plain)
    if unknown:
        raise ConfigError(f"{who}: model_config has key(s) {unknown} that a {model_type!r} config does not have; "
                          f"known keys: {sorted(known)}")
    return built


def shape_dict(model_type: str, cfg: Mapping[str, Any]) -> dict[str, Any]:
    """``model_type``'s default config as a dict, overridden by ``cfg`` (aliases such as GPT-2's
    ``hidden_size`` written under their canonical names, ``n_embd``): the shape a ``model_config`` asks
    for, read without building its config."""
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    aliases = getattr(CONFIG_MAPPING[model_type], "attribute_map", {}) or {}
    return {**AutoConfig.for_model(model_type).to_dict(), **{aliases.get(k, k): v for k, v in cfg.items()}}


def host_memory_bytes() -> int | None:
    """This machine's physical memory, or None where the OS does not say."""
    import os

    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


#: A ``model_config`` whose fp32 weights exceed this is refused before transformers builds its config: more than any
#: machine holds (the planner's largest node).
MAX_MODEL_BYTES = MAX_MEMORY_GIB * GiB


def check_model_size(cfg: Mapping[str, Any], who: str, limit: int | None, memory: str) -> None:
    """A :class:`ConfigError` when a ``model_config`` (``cfg``: its shape, :func:`shape_dict`) describes a model
    whose fp32 weights (``from_config`` builds them in fp32, in host memory) exceed ``limit`` bytes (``memory``
    names it; None: unknown, not checked): building it would run for hours and end out of memory. Shapes the
    planner cannot read (:class:`~mrl_llm.distributed.memory.ModelShape`) are not checked."""
    from mrl_llm.distributed.memory import ModelShape, ShapeError

    try:
        n = ModelShape.from_hf_config(cfg, where=f"{who}: model_config").n_params
    except ShapeError:
        return
    if limit is not None and 4 * n > limit:
        raise ConfigError(f"{who}: model_config describes a model of {n:.3g} parameters ({4 * n / GiB:.3g} GiB in "
                          f"fp32, as from_config builds it), more than {memory} ({limit / GiB:.3g} GiB); lower "
                          "num_hidden_layers / hidden_size / intermediate_size / vocab_size")


def check_fits_host(cfg: Mapping[str, Any], who: str, ram_bytes: int | None = None) -> None:
    """:func:`check_model_size` against this machine's memory (``ram_bytes``, default :func:`host_memory_bytes`)."""
    check_model_size(cfg, who, host_memory_bytes() if ram_bytes is None else ram_bytes, "this machine's memory")


def build_model(policy: PolicyConfig, tokenizer, *, seed: int, dtype: str | None = None) -> torch.nn.Module:
    """The policy's causal LM in its dtype (``dtype`` overrides it: the trainer asks for ``fp32`` master
    weights, :mod:`mrl_llm.precision`), in train mode (module docstring)."""
    from transformers import AutoModelForCausalLM

    dtype = TORCH_DTYPES[dtype or policy.dtype]
    if policy.model_dir is not None and is_hub_id(policy.model_dir):
        try:  # the hub cache first; HF_HUB_OFFLINE=1: the cache only
            model = AutoModelForCausalLM.from_pretrained(policy.model_dir, dtype=dtype)
        except Exception as err:  # noqa: BLE001 - re-raised with the id and a hint
            raise ModelLoadError(f"cannot load the model of policy {policy.name!r} from the hub id "
                                 f"{policy.model_dir!r}: {err}; {hub_hint(policy.model_dir)}") from err
    elif policy.model_dir is not None:
        p = Path(policy.model_dir)
        if not (p / "config.json").is_file():
            raise ModelLoadError(
                f"model directory {p} for policy {policy.name!r} not found (no config.json there); put the "
                "model's Hugging Face files there or set policies[].model_dir"
            )
        try:  # no "Loading weights" bar: a late-joining or restarted policy loads under the run's step bar
            with hf_progress_bars_off():
                model = AutoModelForCausalLM.from_pretrained(str(p), dtype=dtype)
        except Exception as err:  # noqa: BLE001 - re-raised with the path
            msg = " ".join(str(err).split())
            raise ModelLoadError(f"cannot load the model of policy {policy.name!r} from {p}: {msg}") from err
    else:
        cfg = fresh_config(policy, tokenizer)
        check_fits_host(cfg.to_dict(), f"policy {policy.name!r}")
        try:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                model = AutoModelForCausalLM.from_config(cfg)
        except Exception as err:  # noqa: BLE001 - a config transformers accepted but cannot build
            msg = " ".join(str(err).split())
            raise ModelLoadError(f"policy {policy.name!r}: cannot build a model from model_config: {msg}") from err
        model = model.to(dtype)
    n_emb = model.get_input_embeddings().weight.shape[0]
    if n_emb < len(tokenizer):
        raise ModelLoadError(
            f"policy {policy.name!r}: the model's vocabulary ({n_emb}) is smaller than its tokenizer's "
            f"({len(tokenizer)}); pair the model with its own tokenizer"
        )
    if policy.train.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    off = disable_dropout(model)
    if off:
        log.info("policy %s: dropout off in %d modules (RL's ratios and KL compare train-mode and eval-mode "
                 "forwards)", policy.name, off)
    model.train()
    return model


def disable_dropout(model: torch.nn.Module) -> int:
    """Switch every dropout of ``model`` off: ``p = 0`` on its ``torch.nn.Dropout*`` modules (HF's GPT-2 passes its
    attention dropout module's ``p`` to the fused kernel) and on the float dropout rates modules keep as
    attributes (Llama / Qwen2 / Mistral attention: ``attention_dropout``), and the config's rates (saved with
    the policy) zeroed; returns how many modules had a rate > 0."""
    n = 0
    for m in model.modules():
        changed = False
        if isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p > 0:
            m.p, changed = 0.0, True
        for key, value in vars(m).items():
            if "dropout" in key and isinstance(value, float) and value > 0:
                setattr(m, key, 0.0)
                changed = True
        n += changed
    cfg = getattr(model, "config", None)
    for key, value in list(vars(cfg).items()) if cfg is not None else ():
        if ("dropout" in key or key.endswith("_pdrop")) and isinstance(value, float) and value > 0:
            setattr(cfg, key, 0.0)
    return n


def resolve_device(device: str) -> torch.device:
    """``cpu``, ``cuda`` (the first visible GPU; under Ray the actor's own) or ``auto`` (cuda when available)."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device: cuda was asked for but torch sees no GPU; set policies[].device: cpu (or auto)")
    return torch.device(device)


def count_params(model: torch.nn.Module) -> dict[str, int]:
    """``total`` parameters and ``flops`` parameters (total minus the input embedding table, which does
    no multiply-adds; an output head tied to it still counts once)."""
    total = sum(p.numel() for p in model.parameters())
    emb = model.get_input_embeddings().weight
    out = model.get_output_embeddings()
    tied = out is not None and out.weight is emb
    return {"total": total, "flops": total - (0 if tied else emb.numel())}


@contextmanager
def hf_progress_bars_off() -> Iterator[None]:
    """transformers' progress bars off inside the block (restored after): a checkpoint's save or a local load
    must not print its "Writing model shards" / "Loading weights" bar across the run's own step bar. (A hub
    download keeps its bars: it can take minutes.)"""
    from transformers.utils import logging as hf_logging

    was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_on:
            hf_logging.enable_progress_bar()


def save_policy(model: torch.nn.Module, tokenizer, out_dir: str | Path, meta: Mapping[str, Any], *,
                state_dict: Mapping[str, torch.Tensor] | None = None) -> Path:
    """Save an HF model directory (safetensors + tokenizer) with ``mrl_policy.json`` = ``meta``; ``state_dict``:
    the weights to write instead of the model's own (a sharded model's gathered weights)."""
    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    with hf_progress_bars_off():
        model.save_pretrained(str(d), safe_serialization=True,
                              state_dict=None if state_dict is None else dict(state_dict))
    tokenizer.save_pretrained(str(d))
    (d / POLICY_META).write_text(json.dumps(dict(meta), indent=1, sort_keys=True))
    return d


def read_policy_meta(policy_dir: str | Path) -> dict[str, Any]:
    """A saved policy's ``mrl_policy.json``, checked: ``{}`` when the directory has none (any HF model directory);
    else a JSON object whose ``name`` is a string, ``version`` an integer >= 0, ``dtype`` a known dtype
    (:data:`mrl_llm.config.DTYPE_ALIASES`) and ``template`` / ``sampling`` valid sections (unknown keys are errors).
    Other keys are returned unchecked. Every error is a one-line :class:`ConfigError` naming the file."""
    from mrl_llm.config import DTYPE_ALIASES, SamplingSection
    from mrl_llm.templates import TemplateConfig
    from shared_interfaces.config_io import from_mapping

    path = Path(policy_dir) / POLICY_META
    if not path.is_file():
        return {}
    fix = "fix the file, or delete it to load the policy with the default name, dtype, template and sampling"
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as err:  # not JSON, or not UTF-8
        raise ConfigError(f"{path} is not valid JSON ({err}); {fix}") from err
    if not isinstance(meta, dict):
        raise ConfigError(f"{path} must hold a JSON object, got a {type(meta).__name__}; {fix}")
    name, version, dtype = meta.get("name", ""), meta.get("version", 0), meta.get("dtype", "fp32")
    if name is not None and not isinstance(name, str):  # null: the directory's name
        raise ConfigError(f"{path}: name must be a string, got {name!r}; {fix}")
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise ConfigError(f"{path}: version must be an integer >= 0, got {version!r}; {fix}")
    if not isinstance(dtype, str) or dtype not in DTYPE_ALIASES:
        raise ConfigError(f"{path}: dtype {dtype!r} is not one of {sorted(DTYPE_ALIASES)}; {fix}")
    for key, cls in (("template", TemplateConfig), ("sampling", SamplingSection)):
        try:
            from_mapping(cls, {} if meta.get(key) is None else meta[key], where=key)
        except ConfigError as err:
            raise ConfigError(f"{path}: {err}; {fix}") from err
    return meta


def load_policy(policy_dir: str | Path, *, dtype: str = "fp32") -> tuple[torch.nn.Module, Any, dict[str, Any]]:
    """``(model, tokenizer, meta)`` of a directory written by :func:`save_policy` (or any HF model dir
    with a tokenizer; ``meta`` is then empty). ``meta`` is checked (:func:`read_policy_meta`): a bad
    ``mrl_policy.json`` is a :class:`ConfigError` naming it."""
    p = Path(policy_dir)
    meta = read_policy_meta(p)
    name = str(meta.get("name", p.name))
    pol = PolicyConfig(name=name if POLICY_NAME.fullmatch(name) else "policy", model_dir=str(p),
                       dtype=meta.get("dtype", dtype))  # type: ignore[arg-type]
    tok = load_tokenizer(pol)
    return build_model(pol, tok, seed=0).eval(), tok, meta
