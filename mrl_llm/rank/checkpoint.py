"""A rank's exports and checkpoints (the files under ``checkpoints/<policy>/step_<s>/``).

* :func:`export_policy` — the policy as an HF model directory (model + tokenizer + ``mrl_policy.json``),
  in the policy's compute dtype, or the fp32 masters with ``master=True``; rank 0 writes from the full rollout
  model (it holds the current weights), the other ranks of a group write nothing.
* :func:`save_checkpoint` — ``model/`` (the fp32 masters), ``optimizer.pt`` (gathered to rank 0 alone, in one
  process's layout: any k resumes it, :mod:`mrl_llm.parallel.checkpoint`), ``rng.pt`` (torch, Python and NumPy global
  RNG states) and ``worker.json`` (``version``, ``nan_streak``, ``counters``, ``tokenizer_id``). Every rank
  calls it (the gathers are collectives); rank 0 writes. The actor writes the manifest of digests over them.
* :func:`load_checkpoint` — the reverse, each rank its shard: ``worker.json`` is checked first (the keys,
  and the tokenizer: a ``ValueError`` asking to resume with the same config), then the weights, the
  optimizer state and the RNG states are restored; it returns ``worker.json``'s mapping.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mrl_llm.config import PolicyConfig
from mrl_llm.models import hf_progress_bars_off, save_policy
from mrl_llm.parallel.checkpoint import load_optimizer_state
from mrl_llm.precision import lowp_copy
from mrl_llm.rank.model import PolicyModel
from mrl_llm.runstate import CheckpointError, read_json
from shared_interfaces.config_io import to_mapping

#: the keys of ``worker.json``
STATE_KEYS = ("version", "nan_streak", "counters", "tokenizer_id")


def export_policy(pm: PolicyModel, tokenizer: Any, out_dir: str | Path, *, policy: PolicyConfig, version: int,
                  tok_id: str, master: bool = False) -> Path:
    """Write policy ``policy`` at ``version`` to ``out_dir`` (module docstring) and return the directory."""
    if pm.group.rank != 0:
        return Path(out_dir)
    model = pm.rollout_model
    if pm.precision.mixed and not master:
        model = lowp_copy(pm.rollout_model, pm.precision.compute_dtype)
    meta = {"name": policy.name, "template": to_mapping(policy.template), "dtype": policy.dtype,
            "weights_dtype": "fp32" if model is pm.rollout_model else policy.dtype,
            "sampling": to_mapping(policy.sampling), "version": version, "tokenizer_id": tok_id}
    return save_policy(model, tokenizer, out_dir, meta)


def save_rng_state(path: Path) -> None:
    """The torch, Python and NumPy global RNG states to ``path``."""
    np_state = np.random.get_state()
    torch.save({"torch": torch.get_rng_state(), "python": random.getstate(),
                "numpy": [np_state[0], np_state[1].tolist(), *np_state[2:]]}, path)


def restore_rng_state(path: Path) -> None:
    """Set the global RNG states written by :func:`save_rng_state`."""
    rng = torch.load(path, weights_only=True)
    torch.set_rng_state(rng["torch"])
    random.setstate(rng["python"])
    np.random.set_state((rng["numpy"][0], np.array(rng["numpy"][1], dtype=np.uint32), *rng["numpy"][2:]))


def save_checkpoint(d: Path, pm: PolicyModel, *, export: Callable[[Path], Any], state: Mapping[str, Any]) -> None:
    """Write the checkpoint of ``d`` (module docstring); ``export(dir)`` writes the fp32 masters to ``dir``,
    ``state``: ``worker.json``'s mapping (its keys in :data:`STATE_KEYS` order)."""
    export(d / "model")
    optim = pm.optimizer_state()
    if pm.group.rank != 0:  # the gathers above are collectives; rank 0 writes
        return
    torch.save(optim, d / "optimizer.pt")
    save_rng_state(d / "rng.pt")
    (d / "worker.json").write_text(json.dumps(dict(state)))


def read_state(d: Path, tok_id: str) -> dict[str, Any]:
    """``d/worker.json`` checked: a :class:`~mrl_llm.runstate.CheckpointError` when it lacks a key of
    :data:`STATE_KEYS`, a ``ValueError`` when it was written with another tokenizer than ``tok_id``."""
    meta = read_json(d / "worker.json", "worker state")
    if not isinstance(meta, dict) or not set(STATE_KEYS) <= meta.keys():
        raise CheckpointError(f"{d / 'worker.json'}: expected the keys {', '.join(STATE_KEYS)}; "
                              "the checkpoint is corrupt")
    if meta["tokenizer_id"] != tok_id:
        raise ValueError(f"checkpoint {d} was written with tokenizer {meta['tokenizer_id']!r}, this policy "
                         f"uses {tok_id!r}; resume with the same config")
    return meta


def load_checkpoint(d: Path, pm: PolicyModel, *, tok_id: str) -> dict[str, Any]:
    """Restore the checkpoint of ``d`` into ``pm`` and the global RNGs; ``worker.json``'s mapping."""
    from transformers import AutoModelForCausalLM

    meta = read_state(d, tok_id)
    with hf_progress_bars_off():  # a rank rejoining mid-run: no "Loading weights" bar under the step bar
        loaded = AutoModelForCausalLM.from_pretrained(str(d / "model"), dtype=torch.float32)
    pm.load_weights(loaded.state_dict())  # k > 1: each rank its shard
    del loaded
    load_optimizer_state(pm.optimizer, torch.load(d / "optimizer.pt", weights_only=True))
    restore_rng_state(d / "rng.pt")
    return meta
