"""The checks a run makes once its tokenizers are loaded and before any model is: cheap, and each
failure is one :class:`~shared_interfaces.config_io.ConfigError` (or :class:`~mrl_llm.data.DataError`)
naming the policy and the key, prompt or file, instead of a traceback minutes into the run.

* :func:`check_model_configs` — every policy's tokenizer loads, a ``model_dir`` holds a ``config.json`` (a hub
  id: the hub cache holds its ``config.json`` or, online, the hub gives it),
  a ``model_config`` suits its model type and tokenizer (:func:`mrl_llm.models.fresh_config`), a vLLM
  policy on the CPU has a head size vLLM's CPU attention supports.
* :func:`fit_prompts` — every prompt, rendered with each policy's template and counted with that
  policy's tokenizer exactly as the worker will (:meth:`mrl_llm.worker.LLMPolicyWorker.set_prompt`),
  has ``1 <= tokens <= max_prompt_len`` and leaves the model's context (:func:`context_lengths`) room for
  one generated token: a prompt of the whole context has no response to train on. A prompt that does not is an error naming the policy, the
  prompt and the dataset, or — with the dataset's ``on_malformed: skip`` — dropped for every policy
  and counted (one warning, like the dataset's other bad rows).

Both runtimes call them through :func:`mrl_llm.run_setup.resolve_problems`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mrl_llm.config import PolicyConfig, RunConfig
from mrl_llm.data import DataError, Problem
from mrl_llm.hub import cached_file, download_file, hub_hint, is_hub_id, offline
from mrl_llm.models import ModelLoadError, fresh_config, load_tokenizer, resolve_device
from mrl_llm.templates import PromptTemplate
from shared_interfaces.config_io import ConfigError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LongPrompt:
    """A prompt that does not fit a policy: the policy, the prompt id and its token count (0: empty)."""

    policy: str
    prompt_id: str
    n_tokens: int


def check_model_configs(config: RunConfig) -> dict[str, Any]:
    """Load every policy's tokenizer and check its model source (module docstring); returns the
    tokenizers by policy name."""
    tokenizers = {}
    for pol in config.policies:
        if pol.model_dir is not None and is_hub_id(pol.model_dir):
            if cached_file(pol.model_dir) is None and (offline() or download_file(pol.model_dir) is None):
                where = "is not in the hub cache" if offline() else "is not in the hub cache and the hub did not give it"
                raise ModelLoadError(f"model {pol.model_dir!r} of policy {pol.name!r} {where}: {hub_hint(pol.model_dir)}")
        elif pol.model_dir is not None and not (Path(pol.model_dir) / "config.json").is_file():
            raise ModelLoadError(f"model directory {pol.model_dir} for policy {pol.name!r} not found (no config.json "
                                 "there); put the model's Hugging Face files there or set policies[].model_dir")
        tok = load_tokenizer(pol)
        if pol.model_config is not None:
            fresh_config(pol, tok)
        check_vllm_cpu_head_size(pol)
        tokenizers[pol.name] = tok
    return tokenizers


#: Where transformers configs keep the context length (``n_positions``: GPT-2's family).
_CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length")


def hf_config_of(pol: PolicyConfig) -> dict[str, Any]:
    """The transformers config a policy's model will have, as a plain dict, without building the model: its
    ``model_config`` over its model type's defaults, or its ``model_dir``'s ``config.json`` (a multimodal
    config's ``text_config``), a hub id's cached one (:func:`mrl_llm.hub.cached_file`); ``{}`` where unknown (a
    hub id not in the cache, an unreadable file: the model load names it)."""
    from transformers import AutoConfig

    if pol.model_config is not None:
        mc = dict(pol.model_config)
        try:  # built with the keys given: derived ones (head_dim from hidden_size) follow them
            hf = vars(AutoConfig.for_model(mc.pop("model_type"), **mc))
        except Exception:  # noqa: BLE001 - an unknown model type or key: check_model_configs names it
            hf = mc
    elif pol.model_dir is not None and (path := _config_json(pol.model_dir)) is not None:
        try:
            hf = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            hf = {}
    else:
        hf = {}
    hf = hf if isinstance(hf, dict) else {}
    return hf["text_config"] if isinstance(hf.get("text_config"), dict) else hf


def _config_json(model_dir: str) -> Path | None:
    """``model_dir``'s ``config.json``: in the directory, or a hub id's in the hub cache; None if neither."""
    if is_hub_id(model_dir):
        return cached_file(model_dir)
    path = Path(model_dir) / "config.json"
    return path if path.is_file() else None


def context_lengths(config: RunConfig) -> dict[str, int | None]:
    """Each policy's context length in tokens (:func:`hf_config_of`; None where unknown: an uncached hub id, a config
    without one of :data:`_CONTEXT_KEYS`)."""
    out: dict[str, int | None] = {}
    for pol in config.policies:
        hf = hf_config_of(pol)
        out[pol.name] = next((hf[k] for k in _CONTEXT_KEYS if isinstance(hf.get(k), int) and hf[k] > 0), None)
    return out


def check_vllm_cpu_head_size(pol: PolicyConfig) -> None:
    """A vLLM policy on the CPU needs a head size vLLM's CPU attention has a kernel for (32, 64, 80, ...): any
    other fails inside the engine's worker process, named only in its log. A :class:`ConfigError` naming the
    policy and the sizes; nothing to check for the hf engine, on a GPU, or without vLLM installed."""
    if pol.engine != "vllm" or resolve_device(pol.device).type != "cpu":
        return
    try:
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend
    except ImportError:  # no vLLM (the engine says how to install it) or another layout of it
        return
    hf = hf_config_of(pol)
    heads, hidden = hf.get("num_attention_heads"), hf.get("hidden_size")
    head = hf.get("head_dim") or (hidden // heads if isinstance(hidden, int) and isinstance(heads, int) and heads
                                  else None)
    sizes = CPUAttentionBackend.get_supported_head_sizes()
    if isinstance(head, int) and head not in sizes:
        raise ConfigError(f"policy {pol.name!r}: vLLM's CPU attention supports head sizes {sizes}, this model's is "
                          f"{head} (hidden_size / num_attention_heads); change model_config (e.g. hidden_size = "
                          f"{heads} x 64) or set engine: hf")


def prompt_lengths(template: PromptTemplate, tokenizer: Any, problems: Sequence[Problem]) -> list[int]:
    """The token count of each problem's prompt, as the worker encodes it."""
    if not problems:
        return []
    texts = [template.render(p) for p in problems]
    ids = tokenizer(texts, add_special_tokens=template.add_special_tokens).input_ids
    return [len(x) for x in ids]


def fit_prompts(config: RunConfig, problems: Sequence[Problem], *, on_malformed: str, source: str,
                tokenizers: dict[str, Any] | None = None) -> tuple[list[Problem], list[LongPrompt]]:
    """``problems`` that fit every policy's ``max_prompt_len`` (in order) and the misfits (module
    docstring). ``source`` names the dataset in messages; ``on_malformed``: ``error`` or ``skip``."""
    problems = list(problems)
    if not problems:
        return [], []
    tokenizers = tokenizers if tokenizers is not None else {p.name: load_tokenizer(p) for p in config.policies}
    contexts = context_lengths(config)
    bad: dict[str, LongPrompt] = {}
    for pol in config.policies:
        template = PromptTemplate(pol.template, tokenizers[pol.name], policy=f"policy {pol.name!r}")
        ctx = contexts[pol.name]
        limit = pol.max_prompt_len if ctx is None else min(pol.max_prompt_len, ctx - 1)
        todo = [p for p in problems if str(p.prompt_id) not in bad]
        for prob, n in zip(todo, prompt_lengths(template, tokenizers[pol.name], todo), strict=True):
            if 1 <= n <= limit:
                continue
            miss = LongPrompt(pol.name, str(prob.prompt_id), n)
            if on_malformed != "skip":
                if n == 0:
                    what = "encodes to no tokens; check the template"
                elif n <= pol.max_prompt_len:
                    what = (f"has {n} tokens, leaving no room to generate in the model's context of {ctx} tokens "
                            "(template applied); shorten the question, use a model with a longer context")
                else:
                    what = (f"has {n} tokens > max_prompt_len {pol.max_prompt_len} (template applied); raise "
                            "policies[].max_prompt_len, shorten the question")
                raise DataError(f"{source}: policy {pol.name!r}: prompt {miss.prompt_id!r} {what}, or set the "
                                "dataset's on_malformed: skip to skip such prompts (counted)")
            bad[miss.prompt_id] = miss
    kept = [p for p in problems if str(p.prompt_id) not in bad]
    skipped = list(bad.values())
    if skipped:
        first = skipped[0]
        log.warning("%s: skipped %d of %d prompts that do not fit a policy's max_prompt_len (first: %r, %d tokens "
                    "for policy %r)", source, len(skipped), len(problems), first.prompt_id, first.n_tokens,
                    first.policy)
    if not kept:
        raise DataError(f"no prompt of {source} fits every policy's max_prompt_len (all {len(problems)} skipped); "
                        "raise policies[].max_prompt_len")
    return kept, skipped
