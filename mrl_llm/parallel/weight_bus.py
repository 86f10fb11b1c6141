"""Weights from a split policy's trainers to its rollout actors by a collective (``runtime.weight_transfer``).

Under ``placement: split`` (:mod:`mrl_llm.distributed.split_group`) the trainers' rank 0 holds the whole updated
model after each update (its rollout copy, gathered from the FSDP2 shards) and every rollout actor needs it
before its next ``generate``. ``weight_transfer: object_store`` hands it over through Ray's object store (a
pickled copy per rollout actor); ``collective`` broadcasts it over a :class:`WeightBus`: its own process group
of ``1 + m`` members — the trainers' rank 0 (bus rank 0, the source) and the ``m`` rollout actors (bus ranks
``1..m``) — ``nccl`` between GPUs, ``gloo`` on CPU, apart from the trainers' FSDP2 group (a process has one
default ``torch.distributed`` group; the bus is built on its own ``TCPStore``, never the default).

One transfer (:meth:`WeightBus.send` on the source, :meth:`WeightBus.recv_into` on every other member, at the same
time): a header ``[version, tensors, elements, extra]`` (int64), then the tensors in model order, packed into flat
buckets of at most ``bucket_mb`` (a tensor larger than that is a bucket alone; a bucket holds one dtype), one
broadcast per bucket. Both sides derive the buckets from the same names, shapes and dtypes (the same policy
config), so no other metadata crosses; ``extra`` float64 values (the trainers' drift-probe log-probs,
:mod:`mrl_llm.rollout.drift`) follow in one more broadcast when the header counts any (:attr:`WeightBus.last_extra`); a receiver whose model differs from the header's raises
:class:`WeightBusError` naming both counts. A receiver copies each bucket into its model as it arrives, so it
never holds a second whole model (on GPU, neither a host copy). Floating-point tensors cross in the rollout
engine's dtype (``send(dtype=...)`` / ``recv_into(dtype=...)``: bf16 for a bf16 vLLM engine, half the bytes of the
fp32 masters), and a vLLM rollout actor hands the received tensors to its engine as they are (``keep``).

Timeout: the rollout actors' receive is queued right behind the trainers' update, so they wait in the header's
broadcast for a whole update; the bus's group (nccl or gloo) and store time out after ``spec.timeout_s``
(``runtime.weight_bus_timeout_s``, default 1800 s), which must exceed one update.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta

import torch
import torch.distributed as dist

from mrl_llm.parallel.fsdp import cut_buckets
from mrl_llm.parallel.group import GroupSpec


class WeightBusError(RuntimeError):
    """The trainers' weights and a rollout actor's model disagree (another model, another config)."""


def wire_dtype(t: torch.Tensor, dtype: torch.dtype | None) -> torch.dtype:
    """The dtype ``t`` crosses the bus in: ``dtype`` for a floating-point tensor (None: its own), else its own."""
    return dtype if dtype is not None and t.is_floating_point() else t.dtype


def buckets(state: Mapping[str, torch.Tensor], bucket_mb: float, dtype: torch.dtype | None = None) -> list[list[str]]:
    """``state``'s names in order, cut into buckets of at most ``bucket_mb`` MiB of one wire dtype each
    (:func:`wire_dtype`; a larger tensor is a bucket alone; :func:`~mrl_llm.parallel.fsdp.cut_buckets`); ``[]`` for
    an empty state."""
    def size(t: torch.Tensor) -> int:
        return t.numel() * torch.empty((), dtype=wire_dtype(t, dtype)).element_size()

    return cut_buckets(((k, wire_dtype(t, dtype), size(t)) for k, t in state.items()), bucket_mb)


class WeightBus:
    """One member of a policy's weight bus (module docstring). ``spec.rank`` 0 is the source."""

    def __init__(self, spec: GroupSpec, store: dist.Store, pg: dist.ProcessGroup) -> None:
        self.spec, self._store, self._pg = spec, store, pg
        #: the extra values of the last transfer received (float64, on the CPU), None when it had none
        self.last_extra: torch.Tensor | None = None

    @classmethod
    def join(cls, spec: GroupSpec) -> WeightBus:
        """Join the bus (blocks until all ``spec.world_size`` members have joined)."""
        if spec.world_size < 2:
            raise ValueError(f"a weight bus needs the source and at least one rollout actor, got world_size "
                             f"{spec.world_size}")
        timeout = timedelta(seconds=spec.timeout_s)
        store = dist.TCPStore(spec.addr, spec.port, spec.world_size, is_master=spec.rank == 0, timeout=timeout,
                              wait_for_workers=False)
        prefixed = dist.PrefixStore("weight-bus", store)
        if spec.backend == "nccl":  # the bus's own timeout, not nccl's default (a rollout actor waits an update)
            opts = dist.ProcessGroupNCCL.Options()
            opts._timeout = timeout
            pg = dist.ProcessGroupNCCL(prefixed, spec.rank, spec.world_size, opts)
        else:
            pg = dist.ProcessGroupGloo(prefixed, spec.rank, spec.world_size, timeout)
        return cls(spec, store, pg)

    @property
    def device(self) -> torch.device:
        """Where the broadcast buffers live: the current CUDA device for nccl, the CPU for gloo."""
        return torch.device("cuda", torch.cuda.current_device()) if self.spec.backend == "nccl" else torch.device("cpu")

    def _broadcast(self, t: torch.Tensor) -> None:
        opts = dist.BroadcastOptions()
        opts.rootRank, opts.rootTensor = 0, 0
        self._pg.broadcast([t], opts).wait()

    def send(self, state: Mapping[str, torch.Tensor], version: int, *, bucket_mb: float = 64.0,
             extra: torch.Tensor | None = None, dtype: torch.dtype | None = None) -> int:
        """Broadcast ``state`` (any device), ``version`` and the ``extra`` values (1-D, sent as float64) to every
        member (the source only), floating-point tensors in ``dtype`` (None: their own; the receivers must name the
        same: the rollout engine's, :func:`mrl_llm.rank.engine.transfer_dtype`); returns the broadcasts made (the
        header's included)."""
        if self.spec.rank != 0:
            raise RuntimeError("WeightBus.send is the source's (bus rank 0); a rollout actor calls recv")
        elements = sum(t.numel() for t in state.values())
        n_extra = 0 if extra is None else int(extra.numel())
        self._broadcast(torch.tensor([int(version), len(state), elements, n_extra], dtype=torch.int64,
                                     device=self.device))
        n = 1
        if n_extra:
            self._broadcast(extra.detach().reshape(-1).to(self.device, torch.float64))
            n += 1
        for names in buckets(state, bucket_mb, dtype):
            flat = torch.cat([state[k].detach().reshape(-1).to(self.device, wire_dtype(state[k], dtype))
                              for k in names])
            self._broadcast(flat)
            n += 1
        return n

    def recv_into(self, target: Mapping[str, torch.Tensor], *, bucket_mb: float = 64.0, dtype: torch.dtype | None = None,
                  keep: dict[str, torch.Tensor] | None = None) -> int:
        """Receive the source's weights into ``target`` (this actor's state dict: its tensors share the model's
        storage, so the model takes them in place, one bucket at a time — never a second whole model) and return
        their version. ``dtype``: the floating-point wire dtype the source sent in (:meth:`send`); ``keep``: a dict
        that also gets every tensor as received (in the wire dtype, on the bus's device) — what a vLLM engine
        loads directly, rather than a copy re-cast from ``target``."""
        if self.spec.rank == 0:
            raise RuntimeError("WeightBus.recv_into is a rollout actor's; the source (bus rank 0) calls send")
        header = torch.zeros(4, dtype=torch.int64, device=self.device)
        self._broadcast(header)
        version, count, elements, n_extra = (int(v) for v in header.tolist())
        self.last_extra = None
        if n_extra:
            extra = torch.empty(n_extra, dtype=torch.float64, device=self.device)
            self._broadcast(extra)
            self.last_extra = extra.cpu()
        mine = sum(t.numel() for t in target.values())
        if (count, elements) != (len(target), mine):
            raise WeightBusError(f"the trainers sent {count} tensors of {elements} elements, this rollout actor's model "
                                 f"has {len(target)} of {mine}: trainers and rollout actors must build the same model")
        with torch.no_grad():
            for names in buckets(target, bucket_mb, dtype):
                flat = torch.empty(sum(target[k].numel() for k in names), dtype=wire_dtype(target[names[0]], dtype),
                                   device=self.device)
                self._broadcast(flat)
                for k, part in zip(names, flat.split([target[k].numel() for k in names]), strict=True):
                    target[k].copy_(part.view(target[k].shape))
                    if keep is not None:
                        keep[k] = part.view(target[k].shape)
        return version

    def close(self) -> None:
        """Leave the bus; a second call does nothing."""
        self._pg, self._store = None, None  # type: ignore[assignment]
