"""A worker group's checkpoint: the same files as one process's, so a run resumes with any k.

* ``model/``: the **full fp32 master weights** in the HF layout: rank 0's rollout copy, which took the
  gathered shards after the last update (:func:`~mrl_llm.parallel.fsdp.gather_into`), written by rank 0;
* ``optimizer.pt``: the optimizer state gathered to full tensors, in ``torch.optim.Optimizer.state_dict()``'s
  layout of one process (state keyed by parameter index in ``model.parameters()`` order, which sharding
  keeps), written by rank 0. :func:`load_optimizer_state` shards each full moment like its parameter, so a
  k = 2 checkpoint loads on k = 1 or 3 and the other way round.

Gathering is a collective: every rank calls :func:`gathered_optimizer_state`, one tensor at a time (a full moment
is on the device only while it is gathered), and only rank 0 keeps the host copy and writes it: the other ranks hold
nothing (1.5B parameters: 12 GB of host RAM on rank 0, not on every rank of the node), as
``torch.distributed.checkpoint.state_dict`` does with ``StateDictOptions(full_state_dict=True, cpu_offload=True)``
(whose layout, keyed by parameter name, this module does not use: the checkpoint keeps one process's layout). The caller then writes the manifest (:func:`mrl_llm.runstate.write_manifest`) over every file.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, distribute_tensor


def gathered_optimizer_state(optimizer: torch.optim.Optimizer, *, rank: int | None = None) -> dict[str, Any] | None:
    """On rank 0, ``optimizer.state_dict()`` with every sharded tensor gathered to its full CPU tensor; None on
    every other rank (``rank``: this process's, default ``torch.distributed``'s, or 0 outside a process group). A
    collective: every rank calls it, and each gathers one tensor at a time."""
    if rank is None:
        rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    sd = optimizer.state_dict()
    state: dict[int, dict[str, Any]] = {}
    for i, st in sd["state"].items():
        out = {}
        for k, v in st.items():
            if torch.is_tensor(v):
                full = v.full_tensor() if isinstance(v, DTensor) else v  # the all-gather: every rank takes part
                v = full.detach().cpu().clone() if rank == 0 else None
                del full
            out[k] = v
        state[i] = out
    return {"state": state, "param_groups": sd["param_groups"]} if rank == 0 else None


def load_optimizer_state(optimizer: torch.optim.Optimizer, full: dict[str, Any]) -> None:
    """Load a gathered (one-process layout) state into ``optimizer``, each moment sharded like its parameter;
    a ``ValueError`` naming the parameter when a moment's shape is not its parameter's."""
    params = [p for g in optimizer.param_groups for p in g["params"]]
    state: dict[int, dict[str, Any]] = {}
    for i, st in full.get("state", {}).items():
        i = int(i)
        if not 0 <= i < len(params):
            raise ValueError(f"optimizer state for parameter {i}, but the model has {len(params)}; the checkpoint is "
                             "of another model")
        p = params[i]
        out = {}
        for k, v in st.items():
            if torch.is_tensor(v) and v.dim() > 0:
                if tuple(v.shape) != tuple(p.shape):
                    raise ValueError(f"optimizer state {k!r} of parameter {i} has shape {tuple(v.shape)}, the "
                                     f"parameter {tuple(p.shape)}; the checkpoint is of another model")
                if isinstance(p, DTensor):
                    v = distribute_tensor(v.to(p.dtype), p.device_mesh, p.placements, src_data_rank=None)
            out[k] = v
        state[i] = out
    optimizer.load_state_dict({"state": state, "param_groups": full["param_groups"]})
