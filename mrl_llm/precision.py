"""Mixed precision: fp32 master weights, compute in the policy's dtype.

A policy's ``dtype`` is its *compute* dtype. What runs with ``dtype: bf16``:

* the trainable model holds **fp32 master weights**, and AdamW keeps fp32 moments over them, so an
  update ``w <- w - lr * m / (sqrt(v) + eps)`` of size ~1e-6 is not rounded away (bf16 has 8 bits of
  mantissa: an update below ``|w| * 2^-9`` leaves a bf16 weight unchanged);
* each micro-batch's forward and loss run under ``torch.autocast(device_type, torch.bfloat16)``
  (:meth:`Precision.autocast`; the backward follows the forward's dtypes): matmuls in bf16, reductions and the
  log-softmax in fp32, gradients land in fp32 on the master weights. A region never spans an optimizer step:
  autocast caches its bf16 casts of the masters until the region exits (:func:`mrl_llm.update.run_update`);
* the HF engine samples from the master model under the same autocast; the vLLM engine and the frozen
  reference model hold **bf16 copies** (:func:`lowp_copy`);
* a checkpoint's ``model/`` holds the fp32 master weights (resume is exact); the exported policy
  (``DIR/policies/NAME``) is written in the compute dtype.

``dtype: fp32``: no autocast, no copies in another dtype — the trainer of before this module.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from dataclasses import dataclass

import torch

COMPUTE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class Precision:
    """A policy's precision: ``dtype`` (``fp32`` | ``bf16``) is the compute dtype; master weights and
    optimizer state are always fp32."""

    dtype: str = "fp32"

    def __post_init__(self) -> None:
        if self.dtype not in COMPUTE_DTYPES:
            raise ValueError(f"precision: dtype {self.dtype!r} is not one of {sorted(COMPUTE_DTYPES)}")

    @property
    def compute_dtype(self) -> torch.dtype:
        return COMPUTE_DTYPES[self.dtype]

    @property
    def mixed(self) -> bool:
        """Whether compute runs in a lower precision than the (fp32) master weights."""
        return self.compute_dtype != torch.float32

    @contextlib.contextmanager
    def autocast(self, device: torch.device | str) -> Iterator[None]:
        """``torch.autocast`` in the compute dtype on ``device``'s type (CPU or CUDA); nothing for fp32."""
        if not self.mixed:
            yield
            return
        dev = torch.device(device).type
        with torch.autocast(device_type=dev, dtype=self.compute_dtype):
            yield


def lowp_copy(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """A frozen copy of ``model`` with its floating-point weights in ``dtype`` (eval mode, no grads).
    Used for the reference model; the copy never aliases the master weights."""
    out = copy.deepcopy(model).to(dtype)
    out.eval()
    out.requires_grad_(False)
    return out


def master_check(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> list[str]:
    """Names of trainable parameters (and optimizer state tensors) that are *not* fp32 — empty when the
    master-weight contract holds."""
    bad = [n for n, p in model.named_parameters() if p.requires_grad and p.dtype != torch.float32]
    if optimizer is not None:
        for i, st in enumerate(optimizer.state.values()):
            bad += [f"optimizer state {i}.{k}" for k, v in st.items()
                    if torch.is_tensor(v) and v.is_floating_point() and v.numel() > 1 and v.dtype != torch.float32]
    return bad
