"""``experiments/gpu/smoke.sh --ranks k``: one policy of the smoke pair as a worker group of k ranks (FSDP2), the
step time with k ranks against one rank, measured in the same invocation.

Every rank is a process (``torch.multiprocessing``; no Ray: the GPU image has none) running the runtime's own
step logic, :class:`mrl_llm.distributed.actors.PolicyActor` with ``ranks = k`` (``nccl`` on GPUs, one GPU per
rank; ``gloo`` with ``--cpu``): each step every rank renders the step's prompts, samples and scores its share
(``sampling.seeding: sample``: one seed per prompt and sample index, so the records do not depend on k), the
ranks exchange their records (``all_gather_object`` into each rank's in-memory exchange, what the exchange
service does under Ray), then train on all of them — one FSDP2-sharded update, its loss normalised by the
global counts — and each rank's engine gets the gathered weights. The smoke pair's ``qwen2.5-like`` policy
runs GRPO on the arithmetic task; the same steps run first with one rank (the reference), then with k.

Output: ``OUT/smoke_ranks.json`` and a printed line per k: mean step seconds after the first step (the first
includes start-up), generation and training tokens/s, peak memory per rank; then the ratio
``step_s(k) / step_s(1)`` (on a CPU with fewer cores than ranks this is the overhead, not a speed-up), and
whether the two runs' final weights agree.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

POLICY = "qwen2.5-like"


def _peak_gib(cuda: bool) -> float:
    import torch

    if cuda:
        return torch.cuda.max_memory_allocated() / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def rank_main(rank: int, k: int, addr: str, port: int, cfg_map: dict[str, Any], out: str, cuda: bool) -> None:
    """Rank ``rank`` of ``k``: ``cfg_map``'s steps of :data:`POLICY` (module docstring); rank 0 writes ``out``."""
    import torch
    import torch.distributed as dist

    from mrl_llm.config import config_from_mapping
    from mrl_llm.data import DataCursor
    from mrl_llm.distributed.actors import PolicyActor, problem_id
    from mrl_llm.parallel.fsdp import full_state_dict
    from mrl_llm.parallel.group import GroupSpec
    from mrl_llm.trainer import actor_specs, resolve_problems, unique_prompts
    from shared_interfaces.config_io import to_mapping
    from shared_interfaces.exchange import InMemoryExchange

    if cuda:
        torch.cuda.set_device(rank)
        torch.cuda.reset_peak_memory_stats()
    cfg = config_from_mapping(cfg_map)
    spec = next(s for s in actor_specs(cfg, Path(out).parent / f"ckpt-k{k}") if s.name == POLICY)
    group = GroupSpec(rank=rank, world_size=k, addr=addr, port=port, backend="nccl" if cuda else "gloo")
    spec = replace(spec, ranks=k, config={**dict(spec.config), "group": to_mapping(group)}, threads=cfg.threads or 1)
    ex = InMemoryExchange()
    actor = PolicyActor(spec, ex)  # joins the group while it builds its worker
    problems = resolve_problems(cfg, None, None).train
    cursor = DataCursor(problems, cfg.prompts_per_step, seed=cfg.seed)
    steps = []
    for s in range(cfg.steps):
        batch = unique_prompts(cursor.next_batch())
        t0 = time.perf_counter()
        gen = actor.generate(batch, s)
        mine = [r for r in ex.records() if r.step == s]
        every: list[Any] = [None] * k
        if k > 1:
            dist.all_gather_object(every, mine)
            ex.publish([r for i, recs in enumerate(every) if i != rank for r in recs])
        total = sum(len(x) for x in every) if k > 1 else len(mine)
        t1 = time.perf_counter()
        res = actor.train(s, [problem_id(p) for p in batch], peers=[POLICY])  # every rank's records are here
        t2 = time.perf_counter()
        m = res["metrics"]
        steps.append({"step": s, "step_s": t2 - t0, "generate_s": t1 - t0, "train_s": t2 - t1,
                      "gen_tokens": float((gen.get("timings") or {}).get("gen_tokens", 0.0)),
                      "train_tokens": float(m.get("train_tokens", 0.0)), "records": total,
                      "reward_mean": float(m.get("reward_mean", float("nan")))})
    peaks: list[Any] = [None] * k
    if k > 1:
        dist.all_gather_object(peaks, _peak_gib(cuda))
    else:
        peaks = [_peak_gib(cuda)]
    weights = full_state_dict(actor.worker.model)
    if rank == 0:
        torch.save({"steps": steps, "peak_gib": peaks, "weights": weights}, out)
    actor.close()
    # end the rank now: the interpreter's teardown of leftover torch.distributed objects can abort in C++
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_k(k: int, cfg_map: dict[str, Any], out: Path, cuda: bool) -> dict[str, Any]:
    """Spawn :func:`rank_main` on ``k`` ranks; rank 0's result."""
    import torch
    import torch.multiprocessing as mp

    from mrl_llm.parallel.group import rendezvous

    addr, port = rendezvous("127.0.0.1")
    mp.spawn(rank_main, args=(k, addr, port, cfg_map, str(out), cuda), nprocs=k, join=True)
    return torch.load(out, weights_only=False)


def summary(k: int, got: dict[str, Any]) -> dict[str, Any]:
    """Step time (mean after the first step, or the only step), tokens/s and peak memory of one k."""
    rows = got["steps"]
    later = rows[1:] or rows
    gen_s, train_s = sum(r["generate_s"] for r in rows), sum(r["train_s"] for r in rows)
    return {"ranks": k, "steps": len(rows), "step_s_mean": sum(r["step_s"] for r in later) / len(later),
            "generation_tokens_per_s": sum(r["gen_tokens"] for r in rows) / gen_s if gen_s else None,
            "training_tokens_per_s": sum(r["train_tokens"] for r in rows) / train_s if train_s else None,
            "records_per_step": [r["records"] for r in rows], "reward_mean": [r["reward_mean"] for r in rows],
            "peak_gib_per_rank": got["peak_gib"]}


def main(ranks: int, cfg: Any, out: Path, *, cuda: bool, train: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run one rank, then ``ranks`` ranks, of ``cfg`` (the smoke config; its :data:`POLICY` alone, GRPO, per-sample
    seeds; ``train``: keys of its ``train`` section, e.g. ``fsdp_unit``); write and return ``OUT/smoke_ranks.json``."""
    from mrl_llm.config import config_from_mapping
    from shared_interfaces.config_io import to_mapping

    cfg_map = to_mapping(cfg)
    cfg_map["regime"] = {"name": "grpo"}
    cfg_map["policies"] = [p for p in cfg_map["policies"] if p["name"] == POLICY]
    cfg_map["policies"][0]["sampling"] = {**cfg_map["policies"][0]["sampling"], "seeding": "sample"}
    cfg_map["policies"][0]["train"] = {**cfg_map["policies"][0]["train"], **(train or {})}
    cfg_map["threads"] = 1 if not cuda else cfg_map.get("threads")
    config_from_mapping(cfg_map)  # a malformed derived config fails here, in this process
    results, weights = {}, {}
    for k in sorted({1, ranks}):
        got = run_k(k, cfg_map, out / f"ranks{k}.pt", cuda)
        results[k], weights[k] = summary(k, got), got["weights"]
        r = results[k]
        print(f"ranks {k}: {r['step_s_mean']:.2f} s/step (after the first), gen {r['generation_tokens_per_s'] or 0:.1f} tok/s,"
              f" train {r['training_tokens_per_s'] or 0:.1f} tok/s, peak {max(r['peak_gib_per_rank']):.2f} GiB per rank")
    diff = max(float((weights[ranks][n].float() - weights[1][n].float()).abs().max()) for n in weights[1])
    ratio = results[ranks]["step_s_mean"] / results[1]["step_s_mean"]
    doc = {"policy": POLICY, "ranks": ranks, "runs": [results[k] for k in sorted(results)],
           "fsdp_unit": cfg_map["policies"][0]["train"].get("fsdp_unit"),
           "grad_sync": cfg_map["policies"][0]["train"].get("grad_sync"),
           "step_time_ratio": ratio, "final_weights_max_abs_diff": diff}
    (out / "smoke_ranks.json").write_text(json.dumps(doc, indent=1))
    if ranks > 1:
        print(f"step time with {ranks} ranks / 1 rank: {ratio:.2f}x; final weights max |diff| {diff:.2e}")
    print(f"written: {out / 'smoke_ranks.json'}")
    return doc
