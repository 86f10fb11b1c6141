"""``python -m mrl_llm plan --config FILE [--cluster FILE] [--mode M] [--async]``: print the MWRA plan.

The experiment config is the trainer's YAML. When :mod:`mrl_llm.config` is importable it validates the
file first (unknown keys are errors there). The planner then reads, per entry of ``policies:``, the
few numbers it needs (first match, searching the policy's nested sections, then the top level):

=====================  ========================================================================
name                   ``name``
shape                  ``model_dir`` / ``model`` / ``path``: a directory with ``config.json``, a hub id
                       whose ``config.json`` is in the hub cache, or a known architecture name (:data:`memory.KNOWN_SHAPES`); or ``model_config``
                       (a Hugging Face config mapping, for tiny ``from_config`` models)
dtype                  ``dtype`` (fp32 / bf16 / fp16; float32 / bfloat16 / float16 accepted)
rollouts per step      ``rollouts_per_step``, else ``prompts_per_step`` x ``group_size``
lengths                ``max_prompt_len`` / ``prompt_len``; ``max_new_tokens`` / ``max_response_len``
training               ``micro_batch`` / ``micro_batch_size``; ``gradient_checkpointing``; ``kl_coef``;
                       ``optimizer`` (adamw / adam: fp32 moments; sgd: none);
                       ``max_tokens_per_micro_batch``; ``logprob_chunk`` (default
                       :data:`DEFAULT_LOGPROB_CHUNK`, the trainer's; null: unchunked)
engine                 ``engine`` (hf / vllm)
=====================  ========================================================================

Exit status: 0 with the plan printed, 2 when the config does not fit (the message says what and by
how much) or cannot be read.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mrl_llm.distributed.cluster import detect_local_cluster, load_cluster
from mrl_llm.distributed.memory import ModelShape, PolicyFootprint, ShapeError, known_shape
from mrl_llm.distributed.planner import plan_placement
from shared_interfaces.config_io import ConfigError, load_yaml
from shared_interfaces.mwra import AllocationError

_MISSING = object()
DEFAULT_LOGPROB_CHUNK = 1024  # = mrl_llm.config.TrainSection.logprob_chunk (a test pins the two equal)
OPTIMIZERS = {"adamw": "adamw", "adam": "adamw", "sgd": "sgd"}  # adam's state is adamw's: two fp32 moments
DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "fp32": "fp32", "bf16": "bf16", "fp16": "fp16"}


def _find(d: Any, *keys: str) -> Any:
    """The first of ``keys`` in mapping ``d`` or its nested mappings (breadth-first)."""
    queue = [d]
    while queue:
        cur = queue.pop(0)
        if not isinstance(cur, Mapping):
            continue
        for k in keys:
            if k in cur and (k == "model_config" or not isinstance(cur[k], Mapping | list)):
                return cur[k]
        queue.extend(v for v in cur.values() if isinstance(v, Mapping))
    return _MISSING


def _get(pol: Mapping, top: Mapping, *keys: str, default: Any = _MISSING) -> Any:
    v = _find(pol, *keys)
    if v is _MISSING:
        v = _find({k: v for k, v in top.items() if k != "policies"}, *keys)
    return default if v is _MISSING else v


def _shape(pol: Mapping, where: str, base: Path) -> ModelShape:
    cfg = _find(pol, "model_config")
    if isinstance(cfg, Mapping):
        return ModelShape.from_hf_config(cfg, where=f"{where}.model_config")
    ref = _find(pol, "model_dir", "model", "path", "model_path")
    if ref is _MISSING:
        raise ConfigError(f"{where}: no model_dir/model/model_config to size the policy from")
    p = Path(str(ref)) if Path(str(ref)).is_absolute() else base / str(ref)
    if (p / "config.json").is_file():
        return ModelShape.from_model_dir(p)
    cached = _hub_cached_config(str(ref))
    if cached is not None:
        return ModelShape.from_model_dir(cached)
    shape = known_shape(str(ref))
    if shape is None:
        raise ShapeError(f"{where}: model {ref!r} has no config.json at {p} and is not a known architecture; "
                         "build the model directory first or add model_config")
    return shape


def _hub_cached_config(ref: str) -> Path | None:
    """The snapshot folder of hub id ``ref`` in the local hub cache when its ``config.json`` is there
    (nothing is downloaded to plan)."""
    from mrl_llm.hub import is_hub_id

    if not is_hub_id(ref):
        return None
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    got = try_to_load_from_cache(ref, "config.json")
    return Path(got).parent if isinstance(got, str) else None


def footprints_from_config(data: Mapping[str, Any], base: Path = Path(".")) -> list[PolicyFootprint]:
    """The planner's view of an experiment config mapping (module docstring)."""
    pols = data.get("policies")
    if not isinstance(pols, list) or not pols:
        raise ConfigError("config: 'policies' must list at least one policy")
    out = []
    for i, pol in enumerate(pols):
        where = f"policies[{i}]"
        name = str(_get(pol, {}, "name", default=f"policy{i}"))
        dtype = DTYPES.get(str(_get(pol, data, "dtype", default="bf16")))
        if dtype is None:
            raise ConfigError(f"{where}.dtype must be one of {sorted(DTYPES)}")
        optimizer = OPTIMIZERS.get(str(_get(pol, data, "optimizer", default="adamw")))
        if optimizer is None:
            raise ConfigError(f"{where}.train.optimizer must be one of {sorted(OPTIMIZERS)}")
        rollouts = _get(pol, data, "rollouts_per_step", default=None)
        if rollouts is None:
            rollouts = int(_get(pol, data, "prompts_per_step", "batch_prompts", default=1)) * int(
                _get(pol, data, "group_size", default=8))
        out.append(PolicyFootprint(
            name=name, shape=_shape(pol, where, base), dtype=dtype,  # type: ignore[arg-type]
            rollouts_per_step=int(rollouts),
            prompt_len=int(_get(pol, data, "max_prompt_len", "prompt_len", default=256)),
            max_response_len=int(_get(pol, data, "max_new_tokens", "max_response_len", default=256)),
            micro_batch=int(_get(pol, data, "micro_batch", "micro_batch_size", default=1)),
            grad_checkpointing=bool(_get(pol, data, "gradient_checkpointing", "grad_checkpointing", default=False)),
            kl_coef=float(_get(pol, data, "kl_coef", default=0.0)), optimizer=optimizer,  # type: ignore[arg-type]
            logprob_chunk=int(_get(pol, data, "logprob_chunk", default=DEFAULT_LOGPROB_CHUNK) or 0),
            max_tokens_per_micro_batch=int(_get(pol, data, "max_tokens_per_micro_batch", default=0) or 0),
            engine=str(_get(pol, data, "engine", default="hf")),  # type: ignore[arg-type]
            ranks=int(_get(pol, {}, "ranks", default=1)),
            fsdp_unit=str(_get(pol, data, "fsdp_unit", default="layer")),  # type: ignore[arg-type]
            grad_sync=str(_get(pol, data, "grad_sync", default="micro_batch")),  # type: ignore[arg-type]
        ))
    return out


def _validate_with_trainer(path: Path) -> None:
    try:
        from mrl_llm import config as trainer_config  # the trainer's typed config, when present
    except ImportError:
        return
    loader = getattr(trainer_config, "load_config", None)
    if callable(loader):
        loader(path)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="mrl_llm plan", description="Print the MWRA placement plan of a config.")
    ap.add_argument("--config", required=True, help="experiment YAML (experiments/configs/*.yaml)")
    ap.add_argument("--cluster", help="cluster YAML (experiments/configs/clusters/*.yaml); default: this machine")
    ap.add_argument("--mode", default="auto", choices=["auto", "colocated", "split", "cpu"])
    ap.add_argument("--async", dest="asynchronous", action="store_true",
                    help="plan for asynchronous training (prefer split pools)")
    args = ap.parse_args(argv)
    try:
        path = Path(args.config)
        _validate_with_trainer(path)
        fps = footprints_from_config(load_yaml(path), base=path.parent)
        cluster = load_cluster(args.cluster) if args.cluster else detect_local_cluster()
        plan = plan_placement(fps, cluster, mode=args.mode, prefer_split=args.asynchronous)
    except (AllocationError, ConfigError, ShapeError, ValueError) as err:
        print(f"mrl_llm plan: {err}", file=sys.stderr)
        return 2
    print(plan.render())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
