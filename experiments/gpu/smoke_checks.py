"""The checks ``experiments/gpu/smoke.sh`` runs on one policy (random weights, a real vocabulary width): memory
measured against the planner, bf16 against fp32 on one batch, and the weights each mini-batch sees under bf16.

* :func:`run_phase` — one phase (``sample``: one HF ``generate`` call over ``rows`` prompts; ``update``: one
  ``PolicyModel.update`` on ``rows`` random rows; ``step``: an update, then a sample and an update as in a run) of a
  policy built here, in a fresh interpreter (:func:`measure_in_subprocess`, :func:`rss_growth`), and the planner's
  bytes for it (:func:`planned`). On CUDA the peak is ``torch.cuda.max_memory_reserved`` of the whole process; on the
  CPU the growth of peak RSS over the resident size when the phase begins (:func:`reset_peak_rss`).
* :func:`planned` — the planner's terms (:mod:`mrl_llm.distributed.memory`): ``static`` (what a phase begins
  with: the masters), ``sample`` (:func:`~mrl_llm.distributed.memory.rollout_bytes` of the HF engine with ``rows`` in
  flight, plus the compute-dtype casts autocast keeps while it samples) and ``update`` (the rest of
  :func:`~mrl_llm.distributed.memory.training_bytes`: gradients, AdamW's moments, activations and casts or its step).
* :func:`parity` — bf16 (fp32 masters under autocast) against fp32 on the same batch and weights: the update's loss
  and the mean response NLL (relative difference) and the cosine of the two gradients.
* :func:`stale_check` — ``train.grad_accum: 1`` (one optimizer step per micro-batch, several a step): the mean
  ``approx_kl_old`` under bf16 over fp32's, from the same weights and batch; near 1 when every mini-batch after the
  first sees the updated weights, near 0 when autocast served the start-of-step casts (issue 38, item 1).

``python -m experiments.gpu.smoke_checks measure PHASE JSON_SIZE`` prints one :func:`run_phase` as JSON (what
:func:`rss_growth` and :func:`measure_in_subprocess` run).
"""

from __future__ import annotations

import json
import os
import random
import resource
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]

#: Qwen2.5-1.5B's config.json widths (28 layers, the real vocabulary).
QWEN25_15B = {"model_type": "qwen2", "hidden_size": 1536, "intermediate_size": 8960, "num_attention_heads": 12,
              "num_key_value_heads": 2, "num_hidden_layers": 28, "vocab_size": 151936, "max_position_embeddings": 4096,
              "rope_theta": 10000.0, "tie_word_embeddings": True}
#: The same architecture at a tiny width with the real vocabulary (what the CPU checks run).
QWEN2_TINY = {"model_type": "qwen2", "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
              "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 151936, "max_position_embeddings": 1024,
              "tie_word_embeddings": True}


@dataclass(frozen=True)
class ProbeSize:
    """One policy and one step's sizes: ``rows`` prompts of ``prompt_len`` random tokens with responses of
    ``response_len``; training in micro-batches of ``micro_batch`` rows, the LM head in chunks of ``logprob_chunk``
    positions (0: unchunked); ``grad_accum`` as ``train.grad_accum``."""

    model_config: dict[str, Any] = field(default_factory=lambda: dict(QWEN2_TINY))
    dtype: str = "fp32"
    device: str = "cpu"
    rows: int = 8
    prompt_len: int = 4
    response_len: int = 16
    micro_batch: int = 8
    logprob_chunk: int = 0
    grad_accum: int | None = None
    lr: float = 1e-6
    seed: int = 0

    def __post_init__(self) -> None:
        for f in ("rows", "prompt_len", "response_len", "micro_batch"):
            if getattr(self, f) < 1:
                raise ValueError(f"probe size: {f} must be >= 1, got {getattr(self, f)}")
        if self.dtype not in ("fp32", "bf16"):
            raise ValueError(f"probe size: dtype must be fp32 or bf16, got {self.dtype!r}")


def policy_config(size: ProbeSize, dtype: str | None = None) -> Any:
    """The :class:`mrl_llm.config.PolicyConfig` of ``size`` (the ``utf8-bytes`` tokenizer: its 259 ids fit any
    vocabulary; the ids below are drawn over the whole vocabulary)."""
    from mrl_llm.config import PolicyConfig, SamplingSection, TrainSection

    return PolicyConfig(
        name="probe", model_config=dict(size.model_config), tokenizer_dir="utf8-bytes", dtype=dtype or size.dtype,
        device=size.device, max_prompt_len=size.prompt_len,
        sampling=SamplingSection(max_new_tokens=size.response_len, max_batch_size=size.rows),
        train=TrainSection(optimizer="adamw", lr=size.lr, micro_batch=size.micro_batch, grad_accum=size.grad_accum,
                           grad_clip=None, weight_decay=0.0, logprob_chunk=size.logprob_chunk or None))


def footprint(size: ProbeSize) -> Any:
    """The planner's view (:class:`~mrl_llm.distributed.memory.PolicyFootprint`) of ``size``."""
    from mrl_llm.distributed.memory import ModelShape, PolicyFootprint

    return PolicyFootprint(
        name="probe", shape=ModelShape.from_hf_config(size.model_config), dtype=size.dtype,  # type: ignore[arg-type]
        rollouts_per_step=size.rows, prompt_len=size.prompt_len, max_response_len=size.response_len,
        micro_batch=size.micro_batch, logprob_chunk=size.logprob_chunk, engine="hf", max_num_seqs=size.rows)


def planned(size: ProbeSize) -> dict[str, float]:
    """The planner's bytes for ``size`` by phase (module docstring) and ``total``, what it plans for the device
    (every term plus the process overhead)."""
    from mrl_llm.distributed.memory import (
        GiB,
        MemoryModel,
        autocast_cache_bytes,
        rollout_bytes,
        training_bytes,
    )

    fp = footprint(size)
    train = training_bytes(fp)
    static = fp.n_params * 4.0  # the fp32 masters (a phase begins with them; AdamW's moments come at its first step)
    roll = rollout_bytes(fp, size.rows, own_weights=False)
    cast = autocast_cache_bytes(fp)
    return {"static": static, "update": train.total - static, "sample": roll.total + cast,
            "total": train.total + roll.total + MemoryModel().process_overhead_gib * GiB}


def random_batch(size: ProbeSize, vocab: int) -> Any:
    """``rows`` own rows of random prompt and response ids (full length), random advantages, no peers."""
    import torch

    from mrl_llm.batch import TrainBatch
    from shared_interfaces.regimes.rows import LearnerRows

    rng = random.Random(size.seed)
    n = size.rows
    prompts = [[rng.randrange(vocab) for _ in range(size.prompt_len)] for _ in range(n)]
    responses = [[rng.randrange(vocab) for _ in range(size.response_len)] for _ in range(n)]
    rows = LearnerRows(
        src=torch.arange(n), prompt=torch.arange(n),
        advantages=torch.tensor([rng.uniform(-1, 1) for _ in range(n)], dtype=torch.float64),
        pg_mask=torch.ones(n, dtype=torch.bool), sample_weight=torch.ones(n, dtype=torch.float64),
        sgt_mask=torch.zeros(n, dtype=torch.bool), own_mask=torch.ones(n, dtype=torch.bool),
        use_mu=torch.zeros(n, dtype=torch.bool), sgt_gate=torch.tensor([False]), sgt_weight=0.0, ratio_cap=2.0,
        denominator="thl")
    mu = [[-rng.uniform(5.0, 15.0) for _ in r] for r in responses]
    return TrainBatch(rows=rows, prompts=prompts, responses=responses, mu=mu,
                      lengths=torch.tensor([len(r) for r in responses]))


def build(size: ProbeSize, dtype: str | None = None) -> tuple[Any, Any]:
    """``(PolicyModel, PolicyConfig)``: fp32 masters on ``size.device`` seeded by ``size.seed``, one process."""
    import torch

    from mrl_llm.byte_tokenizer import byte_tokenizer
    from mrl_llm.parallel.group import GroupSpec, WorkerGroup
    from mrl_llm.precision import Precision
    from mrl_llm.rank.model import PolicyModel

    pol = policy_config(size, dtype)
    pm = PolicyModel(pol, byte_tokenizer(), precision=Precision(pol.dtype), group=WorkerGroup.join(GroupSpec(0, 1)),
                     device=torch.device(size.device), init_seed=size.seed, with_ref=False)
    return pm, pol


def loss_config(size: ProbeSize) -> Any:
    from shared_interfaces.regimes.config import LossConfig

    return LossConfig(kl_coef=0.0, max_response_len=size.response_len)


PHASES = ("baseline", "sample", "update", "step")


def run_phase(phase: str, size: ProbeSize) -> dict[str, Any]:
    """Build the policy and the batch (and for ``step`` run a first update, so that AdamW's moments exist as in a
    run), then run ``phase`` (``baseline``: nothing; ``sample``; ``update``; ``step``:
    sample, update) and return its token rates and this process's peak memory:
    ``peak_bytes`` (CUDA: ``max_memory_reserved`` since the process began, the model's build included; CPU:
    ``ru_maxrss``) and on the CPU ``growth_bytes`` (:func:`reset_peak_rss`)."""
    import torch

    if phase not in PHASES:
        raise ValueError(f"phase must be one of {', '.join(PHASES)}, got {phase!r}")
    torch.manual_seed(size.seed)
    pm, pol = build(size)
    batch = random_batch(size, int(size.model_config["vocab_size"]))
    cuda = size.device.startswith("cuda")
    out: dict[str, Any] = {"phase": phase, "device": size.device}
    update = lambda: pm.update(batch, pol, loss_cfg=loss_config(size), pad_id=0).tokens  # noqa: E731
    if phase == "step":  # a step of a run: AdamW's moments exist through the update's forward and backward
        update()
    if phase == "sample" and not cuda:  # one row's token first: what the first call loads (code, kernels) is no growth
        _sample(pm, batch, replace(size, rows=1, response_len=1))
    base = reset_peak_rss() if not cuda else None
    if phase in ("sample", "step"):
        out["sample_tokens"], out["sample_s"] = _timed(cuda, lambda: _sample(pm, batch, size))
        out["decode_tokens_per_s"] = out["sample_tokens"] / out["sample_s"]
    if phase in ("update", "step"):
        out["train_tokens"], out["update_s"] = _timed(cuda, update)
        out["train_tokens_per_s"] = out["train_tokens"] / out["update_s"]
    out["peak_bytes"] = (torch.cuda.max_memory_reserved() if cuda
                         else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    if cuda:
        out["peak_allocated_bytes"] = torch.cuda.max_memory_allocated()
    if base is not None:  # the peak RSS of the phase alone, over what was resident when it began
        out["growth_bytes"] = proc_status_bytes("VmHWM") - base
    return out


def _timed(cuda: bool, fn: Any) -> tuple[Any, float]:
    import torch

    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    got = fn()
    if cuda:
        torch.cuda.synchronize()
    return got, time.perf_counter() - t0


def _sample(pm: Any, batch: Any, size: ProbeSize) -> int:
    """One HF ``generate`` call over the batch's prompts, one sample each (the rank's engine part, under the
    precision's autocast as in a run); the sampled tokens."""
    from mrl_llm.byte_tokenizer import byte_tokenizer
    from mrl_llm.rank.engine import RankEngine
    from mrl_llm.rollout import HFEngine, SamplingConfig

    engine = RankEngine(HFEngine(pm.rollout_model, byte_tokenizer(), max_batch_size=size.rows), trained=pm.model,
                        rollout=pm.rollout_model, precision=pm.precision, device=pm.device)
    sp = SamplingConfig(temperature=1.0, max_new_tokens=size.response_len, seed=size.seed)
    samples, _ = engine.sample(batch.prompts, 1, sp)
    return sum(len(s[0].token_ids) for s in samples)


def proc_status_bytes(key: str) -> int:
    """``/proc/self/status``'s ``key`` (``VmRSS``: resident now; ``VmHWM``: its peak) in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def reset_peak_rss() -> int | None:
    """Reset this process's peak RSS to its resident size (Linux: ``/proc/self/clear_refs`` 5) after a garbage
    collection and return that size; None where the kernel does not allow it (:func:`rss_growth` then subtracts a
    baseline process's peak instead)."""
    import gc

    gc.collect()
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return proc_status_bytes("VmRSS")
    except (OSError, KeyError):
        return None


def rss_growth(phase: str, size: ProbeSize, *, timeout: float = 600) -> dict[str, Any]:
    """The CPU measurement of ``phase`` in a fresh interpreter: ``growth_bytes``, its peak RSS over what was
    resident when it began (:func:`reset_peak_rss`), or where that cannot be reset the process's peak RSS less that
    of one running ``baseline`` (same imports, model and batch)."""
    # glibc returns a freed block to the system at once only above its mmap threshold, which it raises after each
    # large free: fixed at 128 KiB, RSS follows the live tensors (the peak is theirs, not the allocator's cache)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
               MALLOC_MMAP_THRESHOLD_="131072", OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    got: dict[str, dict[str, Any]] = {}
    for p in (phase, "baseline"):
        if p == "baseline" and "growth_bytes" in got[phase]:
            return got[phase]
        res = subprocess.run([sys.executable, "-m", "experiments.gpu.smoke_checks", "measure", p,
                              json.dumps(asdict(size))], cwd=REPO, env=env, capture_output=True, text=True,
                             timeout=timeout)
        if res.returncode != 0:
            raise RuntimeError(f"smoke_checks measure {p} failed: {res.stderr[-2000:]}")
        got[p] = json.loads(res.stdout.strip().splitlines()[-1])
    return {**got[phase], "growth_bytes": got[phase]["peak_bytes"] - got["baseline"]["peak_bytes"]}


def release(size: ProbeSize) -> None:
    """Free what a finished model left (reference cycles, the CUDA allocator's cache) before the next is built."""
    import gc

    import torch

    gc.collect()
    if size.device.startswith("cuda"):
        torch.cuda.empty_cache()


def parity(size: ProbeSize) -> dict[str, float]:
    """bf16 against fp32 from the same fp32 weights on the same batch (module docstring): ``loss_rel``,
    ``nll_rel`` (relative differences) and ``grad_cos``."""
    import torch

    from mrl_llm.logprobs import forward_logprobs, pack

    class Capture(torch.optim.Optimizer):  # records the accumulated gradient; the weights do not move
        def __init__(self, params: Any) -> None:
            super().__init__(list(params), {})
            self.grad: torch.Tensor | None = None

        def step(self, closure: Any = None) -> None:
            self.grad = torch.cat([p.grad.flatten().float() for g in self.param_groups for p in g["params"]])

    got = {}
    batch = random_batch(size, int(size.model_config["vocab_size"]))
    for dtype in ("fp32", "bf16"):
        pm, pol = build(size, dtype)
        pm.optimizer = Capture(p for p in pm.model.parameters() if p.requires_grad)
        res = pm.update(batch, pol, loss_cfg=loss_config(size), pad_id=0)
        packed = pack(batch.prompts, batch.responses, 0)
        with torch.no_grad(), pm.precision.autocast(pm.device):
            logp, _ = forward_logprobs(pm.model, packed, chunk_size=size.logprob_chunk or None)
        mask = packed.response_mask.to(logp.device)
        nll = float(-(logp.float() * mask).sum() / mask.sum())
        got[dtype] = (res.metrics["loss"], nll, pm.optimizer.grad)
        del pm, logp
        release(size)
    (l32, n32, g32), (l16, n16, g16) = got["fp32"], got["bf16"]
    return {"loss_fp32": l32, "loss_bf16": l16, "loss_rel": abs(l16 - l32) / max(abs(l32), 1e-12),
            "nll_fp32": n32, "nll_bf16": n16, "nll_rel": abs(n16 - n32) / max(abs(n32), 1e-12),
            "grad_cos": float(torch.nn.functional.cosine_similarity(g16, g32.to(g16.device), dim=0))}


def stale_check(size: ProbeSize) -> dict[str, float]:
    """The mean ``approx_kl_old`` of one step with ``grad_accum`` set, under bf16 and fp32 from the same weights
    and batch (module docstring), and their ``ratio``."""
    if not size.grad_accum or size.rows <= size.micro_batch * size.grad_accum:
        raise ValueError("stale_check needs several mini-batches: grad_accum set and rows > micro_batch * grad_accum")
    batch = random_batch(size, int(size.model_config["vocab_size"]))
    kl = {}
    for dtype in ("fp32", "bf16"):
        pm, pol = build(size, dtype)
        res = pm.update(batch, pol, loss_cfg=loss_config(size), pad_id=0)
        kl[dtype] = float(res.metrics["approx_kl_old"])
        del pm
        release(size)
    return {"kl_fp32": kl["fp32"], "kl_bf16": kl["bf16"], "ratio": kl["bf16"] / kl["fp32"] if kl["fp32"] else 0.0}


#: The GPU checks' sizes (issue 38): Qwen2.5-1.5B's shape, 64 rows of 512 response tokens, bf16.
GPU_CHECK = ProbeSize(model_config=dict(QWEN25_15B), dtype="bf16", device="cuda", rows=64, prompt_len=64,
                      response_len=512, micro_batch=8, logprob_chunk=1024)
#: The CPU mode's: the same architecture at a tiny width with the real vocabulary (one-token prompts: see
#: tests/distributed/test_memory_measured.py).
CPU_CHECK = ProbeSize(model_config=dict(QWEN2_TINY), dtype="bf16", device="cpu", rows=8, prompt_len=1,
                      response_len=16, micro_batch=8, logprob_chunk=32)
#: The bounds: CUDA planned / reserved peak; CPU RSS growth / planned (the planner test's band); parity; stale ratio.
GPU_PLAN_BAND, CPU_RSS_BAND = (1.0, 1.3), (0.8, 1.5)
PARITY_REL, PARITY_COS, STALE_BAND, STALE_MIN_KL = 1e-2, 0.99, (0.5, 2.0), 1e-4


def measure_in_subprocess(phase: str, size: ProbeSize, *, timeout: float = 600) -> dict[str, Any]:
    """:func:`run_phase` in a fresh interpreter (on CUDA: its reserved peak is the phase's alone)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    res = subprocess.run([sys.executable, "-m", "experiments.gpu.smoke_checks", "measure", phase,
                          json.dumps(asdict(size))], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    if res.returncode != 0:
        raise RuntimeError(f"smoke_checks measure {phase} failed: {res.stderr[-2000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def run_checks(*, cpu: bool, stale_lr: float | None = None) -> tuple[dict[str, Any], list[str]]:
    """The smoke's checks (module docstring) at the GPU or CPU sizes: ``(results, failures)``, one line per failed
    check. On CUDA the planner's total for the policy's one GPU must be within :data:`GPU_PLAN_BAND` of the step's
    reserved peak; on the CPU, which has no reserved peak, each phase's RSS growth within :data:`CPU_RSS_BAND` of
    the planner's terms for it."""
    size = CPU_CHECK if cpu else GPU_CHECK
    fails: list[str] = []
    out: dict[str, Any] = {"size": asdict(size)}
    want = planned(size)
    if cpu:
        step: dict[str, Any] = {}
        for phase in ("update", "sample"):
            got = rss_growth(phase, size)
            step.update(got)
            ratio = got["growth_bytes"] / want[phase]
            out[f"memory_{phase}"] = {"growth_gib": got["growth_bytes"] / 2**30, "planned_gib": want[phase] / 2**30,
                                      "measured_over_planned": ratio}
            if not CPU_RSS_BAND[0] <= ratio <= CPU_RSS_BAND[1]:
                fails.append(f"memory ({phase}): RSS growth / planned = {ratio:.2f}, outside {CPU_RSS_BAND}")
    else:
        step = measure_in_subprocess("step", size)
        ratio = want["total"] / step["peak_bytes"]
        out["memory_step"] = {"reserved_peak_gib": step["peak_bytes"] / 2**30,
                              "allocated_peak_gib": step["peak_allocated_bytes"] / 2**30,
                              "planned_gib": want["total"] / 2**30, "planned_over_reserved": ratio}
        if not GPU_PLAN_BAND[0] <= ratio <= GPU_PLAN_BAND[1]:
            fails.append(f"memory: planned {want['total'] / 2**30:.2f} GiB / reserved peak "
                         f"{step['peak_bytes'] / 2**30:.2f} GiB = {ratio:.2f}, outside {GPU_PLAN_BAND}")
    out["decode_tokens_per_s"], out["train_tokens_per_s"] = step["decode_tokens_per_s"], step["train_tokens_per_s"]
    par = parity(replace(size, rows=min(size.rows, 16)))
    out["parity"] = par
    for key in ("loss_rel", "nll_rel"):
        if not par[key] <= PARITY_REL:
            fails.append(f"bf16 vs fp32: {key} = {par[key]:.2e} > {PARITY_REL:g}")
    if not par["grad_cos"] >= PARITY_COS:
        fails.append(f"bf16 vs fp32: gradient cosine {par['grad_cos']:.4f} < {PARITY_COS}")
    stale = stale_check(replace(size, rows=4 * min(size.micro_batch, 8), micro_batch=min(size.micro_batch, 8),
                                grad_accum=1, lr=stale_lr if stale_lr is not None else (1e-2 if cpu else 1e-4)))
    out["stale"] = stale
    if not stale["kl_fp32"] >= STALE_MIN_KL:
        fails.append(f"stale weights: fp32 approx_kl_old {stale['kl_fp32']:.2e} < {STALE_MIN_KL:g}, too small to "
                     "compare; raise --stale-lr")
    elif not STALE_BAND[0] <= stale["ratio"] <= STALE_BAND[1]:
        fails.append(f"stale weights: bf16 / fp32 approx_kl_old = {stale['ratio']:.2f} (bf16 {stale['kl_bf16']:.2e}, "
                     f"fp32 {stale['kl_fp32']:.2e}), outside {STALE_BAND}: mini-batches after the first ran on "
                     "start-of-step weights")
    return out, fails


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[0] != "measure":
        print(f"usage: python -m experiments.gpu.smoke_checks measure {'|'.join(PHASES)} JSON_SIZE", file=sys.stderr)
        return 2
    size = ProbeSize(**json.loads(argv[2]))
    print(json.dumps(run_phase(argv[1], size)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
