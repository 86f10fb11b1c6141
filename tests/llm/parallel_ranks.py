"""Rank programs for the worker-group tests (imported by ``torch.multiprocessing.spawn``'s children): a tiny
Qwen2 model, a synthetic step batch (own, PRP ``thl`` peer and SGT rows of mixed lengths), and one policy
update on a group of k ranks."""

from __future__ import annotations

import faulthandler
import functools
import json
import os
import random
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch.distributed.fsdp import FSDPModule

from mrl_llm.batch import TrainBatch
from mrl_llm.parallel.fsdp import full_state_dict, shard_model
from mrl_llm.parallel.group import GroupSpec, WorkerGroup
from mrl_llm.parallel.share import RankShare
from mrl_llm.precision import Precision, lowp_copy
from mrl_llm.update import run_update
from shared_interfaces.regimes.config import LossConfig
from shared_interfaces.regimes.rows import LearnerRows

VOCAB = 96
LOSS = LossConfig(kl_coef=0.05, max_response_len=12)


def tiny_model(seed: int = 0, vocab: int = VOCAB, arch: str = "qwen2") -> torch.nn.Module:
    """A 2-layer, 64-wide causal LM (fp32), the same weights for the same seed: Qwen2 with untied embeddings, or
    (``arch="gpt2"``) GPT-2 (tied embeddings, learned positions, ``transformer.h`` blocks)."""
    from transformers import AutoModelForCausalLM, GPT2Config, Qwen2Config

    if arch == "gpt2":  # dropout off, as mrl_llm.models.build_model makes it
        cfg = GPT2Config(vocab_size=vocab, n_embd=64, n_layer=2, n_head=4, n_positions=128, bos_token_id=0,
                         eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    else:
        cfg = Qwen2Config(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                          tie_word_embeddings=False)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)


def synthetic_batch(n: int = 9, seed: int = 0) -> TrainBatch:
    """``n`` rows: prompts of 2..6 tokens, responses of 0..12; every third row a ``thl`` peer row, the last
    two SGT targets (not in the policy-gradient term)."""
    rng = random.Random(seed)
    prompts = [[rng.randrange(1, VOCAB) for _ in range(rng.randint(2, 6))] for _ in range(n)]
    responses = [[rng.randrange(1, VOCAB) for _ in range(rng.randint(0, 12))] for _ in range(n)]
    responses[0] = [rng.randrange(1, VOCAB) for _ in range(12)]
    mu = [[-rng.uniform(0.5, 6.0) for _ in r] for r in responses]
    peer = [i % 3 == 2 for i in range(n)]
    sgt = [i >= n - 2 for i in range(n)]
    in_pg = [not s for s in sgt]
    rows = LearnerRows(
        src=torch.arange(n), prompt=torch.zeros(n, dtype=torch.long),
        advantages=torch.tensor([rng.uniform(-1, 1) if p else 0.0 for p in in_pg], dtype=torch.float64),
        pg_mask=torch.tensor(in_pg), sample_weight=torch.ones(n, dtype=torch.float64),
        sgt_mask=torch.tensor(sgt), own_mask=torch.tensor([not p for p in peer]), use_mu=torch.tensor(peer),
        sgt_gate=torch.tensor([True]), sgt_weight=0.3, ratio_cap=2.0, denominator="thl",
    )
    return TrainBatch(rows=rows, prompts=prompts, responses=responses, mu=mu,
                      lengths=torch.tensor([len(r) for r in responses]))


class RecordingAdamW(torch.optim.AdamW):
    """AdamW that keeps the full gradient of every step it takes (gathered: a collective when sharded)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.grads: list[list[torch.Tensor]] = []

    def step(self, closure: Any = None) -> Any:
        self.grads.append([_full(p.grad) for g in self.param_groups for p in g["params"]])
        return super().step(closure)


def _full(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return (t.full_tensor() if isinstance(t, DTensor) else t).detach().cpu().clone()


def update_once(group: WorkerGroup, *, dtype: str = "fp32", steps: int = 1, micro_batch: int = 2,
                grad_accum: int | None = None, grad_clip: float | None = 1.0, eps: float = 1e-6,
                max_tokens: int | None = None, logprob_chunk: int | None = None,
                nan_rank: int | None = None, unit: str = "layer", arch: str = "qwen2",
                sgt_apart: bool = False, grad_sync: str = "micro_batch", checkpointing: bool = False) -> dict[str, Any]:
    """``steps`` updates of :func:`tiny_model` on :func:`synthetic_batch` over ``group``: the full weights after,
    each optimizer step's full gradients, and the metrics (``logprob_chunk``: the LM head in chunks). ``eps``: AdamW's (at the default 1e-8 a first step
    is ``lr * sign(g)`` for a gradient element of ~1e-8, so float noise in such elements moves it by ~lr).
    ``nan_rank``: that rank's forward returns NaN log-probs (a loss that overflowed there only); ``unit``: the
    FSDP2 unit (:func:`shard_model`; ``none``: replicas); ``arch``: :func:`tiny_model`'s; ``sgt_apart``: the norms'
    gains in a param group with ``sgt: False`` (the SGT term back-propagated apart, :func:`mrl_llm.update.backward`);
    ``grad_sync``: :class:`RankShare`'s; ``checkpointing``: HF's gradient checkpointing (non-reentrant, as
    :func:`mrl_llm.models.build_model` turns it on). ``collectives``: FSDP2's all-gathers and reduce-scatters of the run."""
    precision = Precision(dtype)
    model = tiny_model(arch=arch)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    ref = lowp_copy(model, precision.compute_dtype)
    shard_model(model, precision, group, unit=unit)
    shard_model(ref, precision, group, unit=unit)
    params: Any = model.parameters()
    if sgt_apart:
        named = list(model.named_parameters())
        params = [{"params": [p for n, p in named if "norm" in n], "sgt": False},
                  {"params": [p for n, p in named if "norm" not in n]}]
    opt = RecordingAdamW(params, lr=1e-3, weight_decay=0.01, eps=eps)
    metrics = []
    import mrl_llm.update as update_mod

    real = update_mod.forward_logprobs
    if nan_rank == group.rank:
        update_mod.forward_logprobs = lambda *a, **kw: (lambda lp, ent: (lp * float("nan"), ent))(*real(*a, **kw))
    try:
        with count_fsdp_collectives() as collectives:
            for step in range(steps):
                res = run_update(model, opt, synthetic_batch(seed=step), loss_cfg=LOSS, temperature=1.0,
                                 micro_batch=micro_batch, grad_accum=grad_accum, grad_clip=grad_clip, pad_id=0,
                                 ref_model=ref, max_tokens=max_tokens,
                                 share=RankShare(group, replicated=unit == "none", grad_sync=grad_sync),
                                 logprob_chunk=logprob_chunk, autocast=functools.partial(precision.autocast, "cpu"))
                metrics.append(res.metrics)
    finally:
        update_mod.forward_logprobs = real
    from mrl_llm.logprobs import SHARDED_METHOD

    return {"state": full_state_dict(model), "metrics": metrics, "grads": opt.grads, "collectives": collectives,
            "sharded_chunked": hasattr(model, SHARDED_METHOD),
            "units": sum(isinstance(m, FSDPModule) for m in model.modules()),
            "dtypes": sorted({str(p.dtype) for p in model.parameters()}),
            "opt_dtypes": sorted({str(v.dtype) for st in opt.state.values() for v in st.values()
                                  if torch.is_tensor(v) and v.numel() > 1})}


@contextmanager
def count_fsdp_collectives() -> Iterator[dict[str, int]]:
    """Count the all-gathers and reduce-scatters FSDP2 runs in the block. FSDP2 calls them through the
    ``torch.distributed`` module attribute: ``all_gather_single`` / ``reduce_scatter_single`` in torch 2.13,
    ``all_gather_into_tensor`` / ``reduce_scatter_tensor`` in earlier releases (2.11, the GPU image's)."""
    import torch.distributed as dist

    names = {"all_gather": next(n for n in ("all_gather_single", "all_gather_into_tensor") if hasattr(dist, n)),
             "reduce_scatter": next(n for n in ("reduce_scatter_single", "reduce_scatter_tensor") if hasattr(dist, n))}
    counts = dict.fromkeys(names, 0)
    real = {k: getattr(dist, n) for k, n in names.items()}

    def counted(kind: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            counts[kind] += 1
            return real[kind](*args, **kwargs)
        return call

    for kind, name in names.items():
        setattr(dist, name, counted(kind))
    try:
        yield counts
    finally:
        for kind, name in names.items():
            setattr(dist, name, real[kind])


def rank_process() -> None:
    """Set up a spawned rank's process: one torch thread, and a crash (a C++ abort included) prints every
    thread's Python stack to stderr, which the test's report shows.

    A rank leaves its group (``close``, a collective) only after its work succeeded: a rank that raised exits
    with its error, and ``torch.multiprocessing.spawn`` stops the others."""
    faulthandler.enable()
    torch.set_num_threads(1)


def rank_done() -> None:
    """End a spawned rank's process now with exit code 0, once its work is saved and its group closed (in order):
    the interpreter's teardown of the torch.distributed / FSDP2 objects left behind can abort in C++ now and
    then ("terminate called without an active exception"), which ``spawn`` would report as a failed rank."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def rank_main(rank: int, spec: GroupSpec, out: str, variants: list[dict[str, Any]]) -> None:
    """One rank of a spawned group: join, run :func:`update_once` for each of ``variants`` (keyword arguments),
    rank 0 saves the results to ``out``."""
    rank_process()
    group = WorkerGroup.join(spec.for_rank(rank))
    results = [update_once(group, **kw) for kw in variants]
    if rank == 0:
        torch.save(results, Path(out))
    group.close()
    rank_done()


def run_group(k: int, out: Path, variants: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rank 0's results of :func:`rank_main` on a spawned group of ``k`` gloo ranks (one process each)."""
    import torch.multiprocessing as mp

    from mrl_llm.parallel.group import rendezvous

    addr, port = rendezvous("127.0.0.1")
    spec = GroupSpec(rank=0, world_size=k, addr=addr, port=port, backend="gloo", timeout_s=120)
    mp.spawn(rank_main, args=(spec, str(out), variants), nprocs=k, join=True)
    return torch.load(out, weights_only=False)


def register_parity() -> None:
    """Register :class:`tests.llm.test_precision.ParityVerifier` (about half of a random model's samples
    succeed: reward variance from step 0) as verifier ``parity`` in this process."""
    from mrl_llm.rewards import VERIFIERS
    from tests.llm.test_precision import ParityVerifier

    VERIFIERS.setdefault("parity", lambda **_: ParityVerifier())


def policy_worker(group: GroupSpec | None, *, engine: str = "hf", rollout_engine: bool = True) -> Any:
    """A tiny llama policy on the byte tokenizer (verifier ``parity``) as rank ``group`` of its worker group
    (``engine``, ``rollout_engine``: :class:`~mrl_llm.rank.config.WorkerConfig`'s)."""
    from mrl_llm.config import PolicyConfig, SamplingSection, TrainSection
    from mrl_llm.worker import LLMPolicyWorker, WorkerConfig
    from tests.llm.helpers import tiny

    pol = PolicyConfig(name="A", model_config=tiny("llama"), tokenizer_dir="utf8-bytes", group_size=4, device="cpu",
                       engine=engine,
                       sampling=SamplingSection(max_new_tokens=8),
                       train=TrainSection(lr=1e-3, eps=1e-6, micro_batch=3, grad_clip=1.0, weight_decay=0.01))
    return LLMPolicyWorker("A", WorkerConfig(policy=pol, loss=LossConfig(kl_coef=0.05), group=group,
                                             rollout_engine=rollout_engine), seed=0)


def policy_step(w: Any, step: int) -> None:
    """One step of :func:`policy_worker`: generate on 4 prompts, GRPO plans, train."""
    from mrl_llm.distributed.actors import fetch_learner_rows
    from shared_interfaces.exchange import InMemoryExchange
    from shared_interfaces.regimes import parse_regime
    from tests.llm.helpers import problems

    probs = problems(4, verifier="parity", prefix=f"s{step}p")
    ex = InMemoryExchange()
    ex.publish(w.generate(probs, step))
    rows, _ = fetch_learner_rows(ex, "A", parse_regime("grpo"), [p.prompt_id for p in probs], step, present=["A"])
    w.train_step(rows)


def policy_rank_main(rank: int, spec: GroupSpec, out: str, ckpt: str) -> None:
    """One rank of a 2-step policy run: step 0, checkpoint to ``ckpt`` (+ manifest), step 1; rank 0 saves
    the weights after each step and the worker states to ``out``."""
    from mrl_llm.runstate import write_manifest

    rank_process()
    register_parity()
    w = policy_worker(spec.for_rank(rank))
    policy_step(w, 0)
    after0 = {k: v.clone() for k, v in w.rollout_model.state_dict().items()}
    Path(ckpt).mkdir(parents=True, exist_ok=True)
    w.save_checkpoint(ckpt)
    if rank == 0:
        write_manifest(ckpt)
    held = w.policy_model.optimizer_state()  # the checkpoint's gather (a collective): what each rank is left with
    if rank != 0:
        Path(f"{out}.rank{rank}").write_text(json.dumps(None if held is None else sorted(held)))
    policy_step(w, 1)
    if rank == 0:
        torch.save({"after0": after0, "after1": w.rollout_model.state_dict(), "state": w.state(),
                    "sharded": w.group.sharded, "optimizer_rank0": held, "drift": w.drift_metrics()}, Path(out))
    w.close()
    rank_done()


def run_policy_group(k: int, out: Path, ckpt: Path) -> dict[str, Any]:
    """Rank 0's result of :func:`policy_rank_main` on a spawned group of ``k`` gloo ranks."""
    import torch.multiprocessing as mp

    from mrl_llm.parallel.group import rendezvous

    addr, port = rendezvous("127.0.0.1")
    spec = GroupSpec(rank=0, world_size=k, addr=addr, port=port, backend="gloo", timeout_s=120)
    mp.spawn(policy_rank_main, args=(spec, str(out), str(ckpt)), nprocs=k, join=True)
    return torch.load(out, weights_only=False)


def gather_rank_main(rank: int, spec: GroupSpec, out: str, variants: list[dict[str, Any]]) -> None:
    """One rank: for each of ``variants`` (``vocab``, ``bucket_mb``) shard :func:`tiny_model` (seed 0) and gather it
    into an unsharded seed-1 copy with :func:`mrl_llm.parallel.fsdp.gather_into`, counting the all-gathers; rank 0
    saves each copy's weights, the tensor count and the all-gather count to ``out``."""
    import torch.distributed as dist

    from mrl_llm.parallel import fsdp

    rank_process()
    group = WorkerGroup.join(spec.for_rank(rank))
    calls = []
    all_gather = dist.all_gather

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return all_gather(*args, **kwargs)

    fsdp.dist.all_gather = counted
    results = []
    for v in variants:
        model, copy = tiny_model(0, v["vocab"]), tiny_model(1, v["vocab"])
        shard_model(model, Precision("fp32"), group)
        calls.clear()
        n = fsdp.gather_into(model, copy, bucket_mb=v["bucket_mb"])
        results.append({"state": copy.state_dict(), "n": n, "collectives": len(calls)})
    if rank == 0:
        torch.save(results, Path(out))
    group.close()
    rank_done()


def run_gather(k: int, out: Path, variants: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rank 0's results of :func:`gather_rank_main` on a spawned group of ``k`` gloo ranks."""
    import torch.multiprocessing as mp

    from mrl_llm.parallel.group import rendezvous

    addr, port = rendezvous("127.0.0.1")
    spec = GroupSpec(rank=0, world_size=k, addr=addr, port=port, backend="gloo", timeout_s=120)
    mp.spawn(gather_rank_main, args=(spec, str(out), variants), nprocs=k, join=True)
    return torch.load(out, weights_only=False)


def close_rank_main(rank: int, spec: GroupSpec, out: str, delay_s: float) -> None:
    """One rank that joins and leaves; rank 1's teardown is slow (``delay_s`` after destroying its process
    group) and it writes when it was done (``out``.1); rank 0 writes when its ``close`` returned (``out``.0).
    Both close a second time (a no-op)."""
    import time

    import torch.distributed as dist

    rank_process()
    group = WorkerGroup.join(spec.for_rank(rank))
    assert group.sum([1.0]) == [2.0]
    if rank == 1:
        destroy = dist.destroy_process_group

        def slow_destroy() -> None:
            destroy()
            time.sleep(delay_s)
            Path(f"{out}.1").write_text(repr(time.time()))

        dist.destroy_process_group = slow_destroy
    group.close()
    if rank == 0:
        Path(f"{out}.0").write_text(repr(time.time()))
    group.close()
    rank_done()


def run_close(out: Path, delay_s: float) -> list[float]:
    """``[when rank 0's close returned, when rank 1's slow teardown was done]`` (wall clock, one machine) in a
    spawned group of 2 gloo ranks (:func:`close_rank_main`)."""
    import torch.multiprocessing as mp

    from mrl_llm.parallel.group import rendezvous

    addr, port = rendezvous("127.0.0.1")
    spec = GroupSpec(rank=0, world_size=2, addr=addr, port=port, backend="gloo", timeout_s=120)
    mp.spawn(close_rank_main, args=(spec, str(out), delay_s), nprocs=2, join=True)
    return [float(Path(f"{out}.{r}").read_text()) for r in range(2)]


def peer_records() -> list[Any]:
    """7 peer records of two producers (byte tokenizer) and one of the learner ``L`` itself, on prompt ``p0``."""
    from tests.llm.rank.test_alignment import record

    texts = ["The answer is \\boxed{4}.", "4", "It is \\boxed{5}", "", "two plus two: \\boxed{4}", "x" * 40, "\\boxed{3}"]
    return [record("PQ"[i % 2], i, t) for i, t in enumerate(texts)] + [record("L", 0, "own")]


def aligned_view(a: Any, records: list[Any]) -> dict[str, Any]:
    """``{record_id: align(record)}`` of the peer records, and how many of them the cache already held."""
    hits = a.trace_cache.hits
    view = {r.record_id: a.align(r) for r in records if r.policy_id != "L"}
    return {"view": view, "hits": a.trace_cache.hits - hits}


def align_rank_main(rank: int, spec: GroupSpec, out: str, learner_dir: str) -> None:
    """One rank: prefetch :func:`peer_records` over the group, counting the records this rank aligned itself;
    each rank saves :func:`aligned_view` and its count to ``out``.rank."""
    from mrl_llm.rank import alignment as mod
    from tests.llm.rank.test_alignment import alignment

    rank_process()
    group = WorkerGroup.join(spec.for_rank(rank))
    a, own = alignment(learner_dir), []
    align_traces = mod.align_traces

    def counted(src: Any, dst: Any, ids: list[Any], *args: Any, **kwargs: Any) -> Any:
        own.extend(ids)
        return align_traces(src, dst, ids, *args, **kwargs)

    mod.align_traces = counted
    recs = peer_records()
    a.prefetch(recs, group=group)
    torch.save({"aligned": len(own), **aligned_view(a, recs)}, Path(f"{out}.{rank}"))
    group.close()
    rank_done()


def run_align(out: Path, learner_dir: str) -> list[dict[str, Any]]:
    """Each rank's result of :func:`align_rank_main` on a spawned group of 2 gloo ranks."""
    import torch.multiprocessing as mp

    from mrl_llm.parallel.group import rendezvous

    addr, port = rendezvous("127.0.0.1")
    spec = GroupSpec(rank=0, world_size=2, addr=addr, port=port, backend="gloo", timeout_s=120)
    mp.spawn(align_rank_main, args=(spec, str(out), learner_dir), nprocs=2, join=True)
    return [torch.load(f"{out}.{r}", weights_only=False) for r in range(2)]
