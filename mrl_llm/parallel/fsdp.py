"""FSDP2 sharding of a policy's models, keeping :mod:`mrl_llm.precision`'s semantics for every k.

:func:`shard_model` applies ``torch.distributed.fsdp.fully_shard`` to each decoder layer and then to the root
(the embeddings, final norm and LM head, tied or not, stay in the root's unit) — ``unit="layer"``, the default:
one layer's full weights are gathered at a time, and the next layer's all-gather overlaps this one's compute.
``unit="model"`` (``train.fsdp_unit``) makes the whole model one unit: one all-gather per forward and per
backward and one reduce-scatter, instead of one of each per layer — for a small model whose whole weights fit
a device beside its shards, where the per-layer collectives are latency, not bandwidth; any model (no
decoder-layer list needed). ``unit="none"`` shards nothing: every rank keeps the whole model (replicas, whose
gradients :meth:`~mrl_llm.parallel.share.RankShare.reduce_grads` sums). The sharded parameters are
the **fp32 masters** (the optimizer is built over them afterwards, so its moments are fp32 and sharded too).
With ``dtype: bf16`` the units gather their parameters in bf16 for compute
(``MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)``: gradients are reduced in fp32 onto the
fp32 shards), and the caller still runs forward/backward under :meth:`Precision.autocast`, so reductions and
the log-softmax stay in fp32 as in one process. ``dtype: fp32``: no mixed-precision policy at all.

Gradients are **summed** over ranks (divide factor 1): each rank's loss is its rows' share of a loss
normalised by the whole mini-batch's counts (:mod:`mrl_llm.parallel.share`), so the sum is the one-process
gradient. The reference model is sharded the same way and never gets an optimizer.

The root unit, too, reshards after every forward (FSDP2 keeps the root's parameters gathered by default):
measured here, a no-grad forward (the snapshot pass of a step with several mini-batches) followed by training
forwards with the root left gathered gave gradients off by up to 0.06; resharded, they match to 1e-7.

:func:`gathered` keeps the units gathered through a block (a mini-batch's micro-batches, ``train.grad_sync:
mini_batch``) and :func:`sync_grads` turns the reduce-scatter of the next backward off or on (FSDP2's
``set_requires_gradient_sync``: gradient accumulation without communication).

A group of one is not sharded: the models are returned unchanged (the one-process trainer).

:func:`full_state_dict` gathers every parameter and buffer to a full CPU tensor on every rank, tensor by
tensor (each rank must call it; tests and the GPU smoke compare models with it); :func:`load_full_state_dict`
copies a full state dict (HF names, e.g. a checkpoint's ``model/``) into the shards; :func:`gather_into` copies the sharded weights into an unsharded copy (a rank's rollout model, the
source of its engine, of a checkpoint's ``model/`` and of a split policy's rollout actors) bucket by bucket — one all-gather per bucket of shards (``bucket_mb``, in model order:
a layer or a few), not one per tensor — so the gather never holds a second whole model and makes few collectives.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

from mrl_llm.parallel.group import WorkerGroup
from mrl_llm.precision import Precision


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The decoder layers of an HF causal LM, in order: the modules whose class the model names in
    ``_no_split_modules`` (the blocks HF and verl wrap as FSDP units: ``LlamaDecoderLayer``, ``GPT2Block``, ...),
    else ``model.base_model.layers``."""
    blocks = set(getattr(model, "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if type(m).__name__ in blocks]
    if not layers:
        layers = list(getattr(getattr(model, "base_model", model), "layers", None) or ())
    if not layers:
        raise ValueError(f"{type(model).__name__}: no decoder layers (no module of a class in _no_split_modules, "
                         "nothing at base_model.layers); per-layer FSDP units need a Hugging Face decoder-only model "
                         "(llama, qwen2, mistral, gpt2, ...); set train.fsdp_unit: model to shard it as a single unit")
    return layers


def mp_policy(precision: Precision) -> MixedPrecisionPolicy:
    """The FSDP2 mixed-precision policy of ``precision``: compute-dtype parameters, fp32 gradient reduction;
    nothing (all fp32) for ``dtype: fp32``."""
    if not precision.mixed:
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=precision.compute_dtype, reduce_dtype=torch.float32)


FSDP_UNITS = ("layer", "model", "none")

#: The FSDP2 methods the worker groups call, all in torch 2.8 and later (2.6 and 2.7 lack the first three).
FSDP2_METHODS = ("set_gradient_divide_factor", "set_force_sum_reduction_for_comms", "set_reshard_after_forward",
                 "set_reshard_after_backward", "set_requires_gradient_sync", "reshard")


def require_fsdp2() -> None:
    """Refuse, naming the fix, a torch whose FSDP2 lacks a method this module calls on a sharded model
    (torch < 2.8; ``pyproject.toml`` asks for 2.8, but ``experiments/gpu/smoke.sh`` runs on whatever torch is there)."""
    missing = [m for m in FSDP2_METHODS if not hasattr(FSDPModule, m)]
    if missing:
        raise RuntimeError(f"FSDP2 worker groups need torch >= 2.8 (this torch {torch.__version__} has no "
                           f"FSDPModule.{missing[0]}); install torch>=2.8, or train with policies[].ranks: 1 or "
                           "train.fsdp_unit: none (whole replicas)")


def shard_model(model: torch.nn.Module, precision: Precision, group: WorkerGroup, *,
                unit: str = "layer") -> torch.nn.Module:
    """Shard ``model`` over ``group`` in place, in FSDP units of one decoder layer (``unit="layer"``) or of the
    whole model (``"model"``; module docstring), and return it; unchanged for a group of one or ``unit="none"``."""
    if unit not in FSDP_UNITS:
        raise ValueError(f"FSDP unit {unit!r} is not one of {FSDP_UNITS}")
    if not group.sharded or unit == "none":
        return model
    require_fsdp2()
    policy = mp_policy(precision)
    for layer in decoder_layers(model) if unit == "layer" else ():
        fully_shard(layer, mp_policy=policy)
    fully_shard(model, mp_policy=policy, reshard_after_forward=True)
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.set_gradient_divide_factor(1.0)  # sum over ranks: each rank's loss is its share of the global one
            m.set_force_sum_reduction_for_comms(True)  # a plain SUM (gloo has no PREMUL_SUM)
    return model


def is_sharded(model: torch.nn.Module) -> bool:
    return isinstance(model, FSDPModule)


@contextmanager
def gathered(model: torch.nn.Module) -> Iterator[None]:
    """Within the block, each FSDP2 unit of ``model`` keeps its full parameters from its first all-gather on (no
    reshard after a forward or a backward): a mini-batch's micro-batches after the first, and each backward, run
    without gathering again; on leaving, every unit reshards (before the optimizer steps on the shards) and
    resumes resharding after each forward and backward. The memory of the whole model's compute-dtype weights
    on every rank for the block (the planner counts it: ``train.grad_sync: mini_batch``). Nothing for a model
    that is not sharded. When the block raises, that error is the one that propagates (a reshard failing after
    it, mid-backward, is not reported over it)."""
    units = [m for m in model.modules() if isinstance(m, FSDPModule)]
    for m in units:
        m.set_reshard_after_forward(False, recurse=False)
        m.set_reshard_after_backward(False, recurse=False)
    done = False
    try:
        yield
        done = True
    finally:
        for m in units:
            try:
                m.reshard()
            except Exception:
                if done:
                    raise
            m.set_reshard_after_forward(True, recurse=False)
            m.set_reshard_after_backward(True, recurse=False)


def sync_grads(model: torch.nn.Module, sync: bool) -> None:
    """Whether ``model``'s next backward reduce-scatters its gradients (``sync``) or accumulates them unsharded,
    in fp32 (FSDP2 casts the accumulator to the mixed-precision policy's ``reduce_dtype``), for a later one —
    gradient accumulation without communication; nothing for a model that is not sharded."""
    if isinstance(model, FSDPModule):
        model.set_requires_gradient_sync(sync)


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer of ``model`` as a full CPU tensor (a collective when sharded: every rank calls it)."""
    out = {}
    for name, v in model.state_dict().items():
        if isinstance(v, DTensor):
            v = v.full_tensor()
        out[name] = v.detach().cpu().clone()
    return out


def load_full_state_dict(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Copy the full tensors ``state`` (HF names, e.g. a checkpoint's ``model/``) into ``model``'s parameters and
    buffers, each rank its shard; the same keys as ``model.state_dict()`` or a ``KeyError`` naming the difference."""
    own = model.state_dict()
    missing, extra = sorted(set(own) - set(state)), sorted(set(state) - set(own))
    if missing or extra:
        raise KeyError(f"weights do not match the model: missing {missing[:5]}, unexpected {extra[:5]}")
    with torch.no_grad():
        for name, v in own.items():
            full = state[name]
            if tuple(full.shape) != tuple(v.shape):
                raise KeyError(f"weight {name!r} has shape {tuple(full.shape)}, the model's is {tuple(v.shape)}")
            if isinstance(v, DTensor):
                local = distribute_tensor(full.to(v.dtype), v.device_mesh, v.placements, src_data_rank=None)
                v.to_local().copy_(local.to_local())
            else:
                v.copy_(full.to(v.dtype))


def gather_into(sharded: torch.nn.Module, full: torch.nn.Module, *, bucket_mb: float = 64.0) -> int:
    """Copy ``sharded``'s parameters and buffers into ``full`` (the same architecture, unsharded), bucket by bucket:
    consecutive dim-0 shards (FSDP2's ``Shard(0)``) of one dtype, up to ``bucket_mb`` MiB of this rank's shards, are
    all-gathered in one collective, put back together (rank ``r`` holds rows ``torch.chunk(rows, k)[r]``) and
    copied into ``full`` (on any device: a trainer rank's copy may live in host memory); the transient memory
    is one bucket's full tensors, not a whole model. Other tensors (buffers, other placements) are copied one
    by one. A collective when sharded: every rank calls it. Returns the number of tensors copied (0 for
    modules without any); names or shapes that differ are a ``KeyError`` naming them, before anything is copied."""
    src, dst = sharded.state_dict(), full.state_dict()
    missing, extra = sorted(set(dst) - set(src)), sorted(set(src) - set(dst))
    if missing or extra:
        raise KeyError(f"the rollout copy does not match the trained model: missing {missing[:5]}, unexpected {extra[:5]}")
    bad = [n for n, v in src.items() if tuple(v.shape) != tuple(dst[n].shape)]
    if bad:
        raise KeyError(f"weights {bad[:5]} differ in shape between the trained model and its rollout copy")
    sharded = cut_buckets(((n, v.dtype, _nbytes(v.to_local())) for n, v in src.items() if _dim0_sharded(v)),
                          bucket_mb)
    with torch.no_grad():
        for name, v in src.items():
            if not _dim0_sharded(v):
                part = v.full_tensor() if isinstance(v, DTensor) else v
                dst[name].copy_(part.detach().to(dst[name].device, dst[name].dtype))
        for bucket in sharded:
            _gather_bucket(src, dst, bucket)
    return len(src)


def cut_buckets(sizes: Iterable[tuple[str, torch.dtype, int]], bucket_mb: float) -> list[list[str]]:
    """The names of ``sizes`` (``(name, dtype, bytes)``, in order) cut into consecutive buckets of one dtype and at
    most ``bucket_mb`` MiB each (a larger tensor is a bucket alone); ``[]`` for none. One collective per bucket
    (:func:`gather_into`, :mod:`mrl_llm.parallel.weight_bus`)."""
    if not bucket_mb > 0:
        raise ValueError(f"bucket_mb must be > 0, got {bucket_mb}")
    limit = bucket_mb * 2**20
    out: list[list[str]] = []
    size, dtype = 0.0, None
    for name, dt, nbytes in sizes:
        if not out or dt != dtype or size + nbytes > limit:
            out.append([])
            size, dtype = 0.0, dt
        out[-1].append(name)
        size += nbytes
    return out


def _dim0_sharded(v: torch.Tensor) -> bool:
    return isinstance(v, DTensor) and v.device_mesh.ndim == 1 and tuple(v.placements) == (Shard(0),)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def chunk_rows(rows: int, k: int) -> list[int]:
    """Rows of each of ``k`` ranks when ``rows`` are split as ``torch.chunk`` does (FSDP2's dim-0 shards):
    ``ceil(rows / k)`` each, the last ones fewer or none."""
    size = math.ceil(rows / k) if rows else 0
    return [max(0, min(size, rows - r * size)) for r in range(k)]


def _gather_bucket(src: dict[str, torch.Tensor], dst: dict[str, torch.Tensor], names: list[str]) -> None:
    """One all-gather of the dim-0 shards ``names`` (one dtype) over their mesh's group, copied into ``dst``."""
    first = src[names[0]]
    group, k = first.device_mesh.get_group(), first.device_mesh.size()
    rows = {n: chunk_rows(src[n].shape[0], k) for n in names}
    inner = {n: math.prod(src[n].shape[1:]) for n in names}
    per_rank = [sum(rows[n][r] * inner[n] for n in names) for r in range(k)]
    width = max(per_rank)
    local = torch.cat([src[n].to_local().reshape(-1) for n in names])
    send = torch.zeros(width, dtype=local.dtype, device=local.device)
    send[: local.numel()] = local
    got = [torch.empty_like(send) for _ in range(k)]
    dist.all_gather(got, send, group=group)
    offset = [0] * k
    for n in names:
        pieces = []
        for r in range(k):
            size = rows[n][r] * inner[n]
            pieces.append(got[r][offset[r]: offset[r] + size].view(rows[n][r], *src[n].shape[1:]))
            offset[r] += size
        dst[n].copy_(torch.cat(pieces).to(dst[n].device, dst[n].dtype))
