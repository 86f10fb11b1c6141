"""Rank programs for the worker-group tests (imported by ``torch.multiprocessing.spawn``'s children): a tiny
Qwen2 model, a synthetic step batch (own, PRP ``thl`` peer and SGT rows of mixed lengths), and one policy
update on a group of k ranks."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import torch

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


def tiny_model(seed: int = 0) -> torch.nn.Module:
    """A 2-layer, 64-wide Qwen2 causal LM (fp32, untied embeddings), the same weights for the same seed."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    cfg = Qwen2Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
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
                max_tokens: int | None = None, logprob_chunk: int | None = None) -> dict[str, Any]:
    """``steps`` updates of :func:`tiny_model` on :func:`synthetic_batch` over ``group``: the full weights after,
    each optimizer step's full gradients, and the metrics (``logprob_chunk``: the LM head in chunks). ``eps``: AdamW's (at the default 1e-8 a first step
    is ``lr * sign(g)`` for a gradient element of ~1e-8, so float noise in such elements moves it by ~lr)."""
    precision = Precision(dtype)
    model = tiny_model()
    ref = lowp_copy(model, precision.compute_dtype)
    shard_model(model, precision, group)
    shard_model(ref, precision, group)
    opt = RecordingAdamW(model.parameters(), lr=1e-3, weight_decay=0.01, eps=eps)
    metrics = []
    for step in range(steps):
        with precision.autocast("cpu"):
            res = run_update(model, opt, synthetic_batch(seed=step), loss_cfg=LOSS, temperature=1.0,
                             micro_batch=micro_batch, grad_accum=grad_accum, grad_clip=grad_clip, pad_id=0,
                             ref_model=ref, max_tokens=max_tokens, share=RankShare(group), logprob_chunk=logprob_chunk)
        metrics.append(res.metrics)
    from mrl_llm.logprobs import SHARDED_METHOD

    return {"state": full_state_dict(model), "metrics": metrics, "grads": opt.grads,
            "sharded_chunked": hasattr(model, SHARDED_METHOD),
            "dtypes": sorted({str(p.dtype) for p in model.parameters()}),
            "opt_dtypes": sorted({str(v.dtype) for st in opt.state.values() for v in st.values()
                                  if torch.is_tensor(v) and v.numel() > 1})}


def rank_main(rank: int, spec: GroupSpec, out: str, variants: list[dict[str, Any]]) -> None:
    """One rank of a spawned group: join, run :func:`update_once` for each of ``variants`` (keyword arguments),
    rank 0 saves the results to ``out``."""
    torch.set_num_threads(1)
    group = WorkerGroup.join(spec.for_rank(rank))
    try:
        results = [update_once(group, **kw) for kw in variants]
        if rank == 0:
            torch.save(results, Path(out))
    finally:
        group.close()


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

    torch.set_num_threads(1)
    register_parity()
    w = policy_worker(spec.for_rank(rank))
    try:
        policy_step(w, 0)
        after0 = {k: v.clone() for k, v in w.rollout_model.state_dict().items()}
        Path(ckpt).mkdir(parents=True, exist_ok=True)
        w.save_checkpoint(ckpt)
        if rank == 0:
            write_manifest(ckpt)
        policy_step(w, 1)
        if rank == 0:
            torch.save({"after0": after0, "after1": w.rollout_model.state_dict(), "state": w.state(),
                        "sharded": w.group.sharded}, Path(out))
    finally:
        w.close()


def run_policy_group(k: int, out: Path, ckpt: Path) -> dict[str, Any]:
    """Rank 0's result of :func:`policy_rank_main` on a spawned group of ``k`` gloo ranks."""
    import torch.multiprocessing as mp

    from mrl_llm.parallel.group import rendezvous

    addr, port = rendezvous("127.0.0.1")
    spec = GroupSpec(rank=0, world_size=k, addr=addr, port=port, backend="gloo", timeout_s=120)
    mp.spawn(policy_rank_main, args=(spec, str(out), str(ckpt)), nprocs=k, join=True)
    return torch.load(out, weights_only=False)


def gather_rank_main(rank: int, spec: GroupSpec, out: str) -> None:
    """One rank: shard :func:`tiny_model` (seed 0), gather it into an unsharded seed-1 copy with
    :func:`mrl_llm.parallel.fsdp.gather_into`; rank 0 saves the copy's weights and the tensor count to ``out``."""
    from mrl_llm.parallel.fsdp import gather_into

    torch.set_num_threads(1)
    group = WorkerGroup.join(spec.for_rank(rank))
    try:
        model, copy = tiny_model(0), tiny_model(1)
        shard_model(model, Precision("fp32"), group)
        n = gather_into(model, copy)
        if rank == 0:
            torch.save({"state": copy.state_dict(), "n": n}, Path(out))
    finally:
        group.close()


def run_gather(k: int, out: Path) -> dict[str, Any]:
    """Rank 0's result of :func:`gather_rank_main` on a spawned group of ``k`` gloo ranks."""
    import torch.multiprocessing as mp

    from mrl_llm.parallel.group import rendezvous

    addr, port = rendezvous("127.0.0.1")
    spec = GroupSpec(rank=0, world_size=k, addr=addr, port=port, backend="gloo", timeout_s=120)
    mp.spawn(gather_rank_main, args=(spec, str(out)), nprocs=k, join=True)
    return torch.load(out, weights_only=False)
