"""One policy's update on k ranks against one process, without Ray: the worker group's training cost alone.

:func:`mrl_llm.update.run_update` (GRPO loss, AdamW, clipping) on a demo-sized Qwen2-style model built from a config
(``--hidden``, ``--layers``, ``--vocab``), over ``--rows`` synthetic rows (prompts of 8-24 tokens, responses of
1-``--max-response``; the same rows and weights everywhere, new rows every step), micro-batches of ``--micro-batch``
rows. The one-process update runs in one spawned process; each ``--layouts`` entry (``fsdp_unit/grad_sync``:
``layer/micro_batch``, ``layer/mini_batch``, ``model/...``, ``none`` for whole replicas) runs on ``--ranks``
spawned gloo processes (:class:`mrl_llm.parallel.share.RankShare`), one torch thread each. Printed: the mean wall
time of an update on rank 0 after ``--warmup`` steps, its ratio to the one-process update, and its ratio to ``k``
processes that each update their own ``rows / k`` rows side by side without a group (the same work split the same
way, no collective: what the machine itself allows; ``1 / k`` of the one process on ``k`` idle cores) — all
measured in the same run. What a layout exceeds the side-by-side processes by is the group's cost: collectives,
waiting for the slower rank, work every rank repeats. Unlike ``ranks_overhead.py`` nothing else runs
(no sampling, exchange, THL, second policy), so fewer things move the numbers; a shared machine still moves
them from run to run: run it several times.

    PYTHONPATH=. python experiments/bench/update_ranks.py [--ranks 2] [--layouts layer/micro_batch,none]
        [--rows 128] [--micro-batch 64] [--max-response 12] [--steps 10] [--warmup 3]

Measured 2026-12-06 on the 2-core machine (nothing else running, but a VM whose neighbours move the numbers: the
one-process update ranged 0.17-0.27 s over six runs of the defaults), ``--ranks 2``: the side-by-side
processes 0.34-0.60x of the one process; 2 ranks, against them: replicas 1.04-2.09x, per-layer units 1.48-2.08x
(``micro_batch``; ``mini_batch`` 1.60-1.94x in two runs), one unit 1.58-2.10x. A profile of both replica ranks:
0.007-0.033 s of a 0.14 s update waiting in the three collectives for the other rank.
With a larger update (``--rows 256 --max-response 32 --vocab 400``, 0.74 s in one process) the layouts were level:
0.63-0.68x of the one process.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

LAYOUTS = ("layer/micro_batch", "layer/mini_batch", "model/micro_batch", "model/mini_batch", "none")


def parse_layouts(arg: str) -> list[tuple[str, str]]:
    """``"layer/mini_batch,none"`` -> ``[("layer", "mini_batch"), ("none", "micro_batch")]``; unknown or empty lists
    are refused naming the choices."""
    from experiments.bench.ranks_overhead import listed

    return [(v.split("/")[0], (v.split("/") + ["micro_batch"])[1]) for v in listed(arg, "--layouts", LAYOUTS)]


def synthetic_batch(rows: int, max_response: int, vocab: int, seed: int) -> Any:
    """``rows`` own GRPO rows of random tokens with advantages in [-1, 1] (a :class:`~mrl_llm.batch.TrainBatch`)."""
    import torch

    from mrl_llm.batch import TrainBatch
    from shared_interfaces.regimes.rows import LearnerRows

    rng = random.Random(seed)
    prompts = [[rng.randrange(1, vocab) for _ in range(rng.randint(8, 24))] for _ in range(rows)]
    responses = [[rng.randrange(1, vocab) for _ in range(rng.randint(1, max_response))] for _ in range(rows)]
    ones = torch.ones(rows, dtype=torch.bool)
    learner_rows = LearnerRows(
        src=torch.arange(rows), prompt=torch.arange(rows) // 8,
        advantages=torch.tensor([rng.uniform(-1, 1) for _ in range(rows)], dtype=torch.float64),
        pg_mask=ones, sample_weight=torch.ones(rows, dtype=torch.float64), sgt_mask=~ones, own_mask=ones,
        use_mu=~ones, sgt_gate=torch.zeros(max(1, rows // 8), dtype=torch.bool), sgt_weight=0.0, ratio_cap=2.0,
        denominator=None)
    mu = [[-rng.uniform(0.5, 6.0) for _ in r] for r in responses]
    return TrainBatch(rows=learner_rows, prompts=prompts, responses=responses, mu=mu,
                      lengths=torch.tensor([len(r) for r in responses]))


def timed_updates(rank: int, k: int, addr: str, port: int, layout: tuple[str, str], args: dict[str, Any],
                  out: str) -> None:
    """One rank (``k = 1``: the one process): build, shard and update ``steps`` times; rank 0 writes the mean
    update time after the warm-up to ``out``. ``layout`` ``("alone", _)``: no group; this process updates its own
    ``rows / k`` rows (the k processes side by side without a collective)."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    from mrl_llm.parallel.fsdp import shard_model
    from mrl_llm.parallel.group import GroupSpec, WorkerGroup
    from mrl_llm.parallel.share import RankShare
    from mrl_llm.precision import Precision
    from mrl_llm.update import run_update
    from shared_interfaces.regimes.config import LossConfig

    torch.set_num_threads(1)
    alone = layout[0] == "alone"
    spec = GroupSpec(rank=rank, world_size=k, addr=addr, port=port, backend="gloo", timeout_s=300) \
        if k > 1 and not alone else GroupSpec(rank=0, world_size=1)
    group = WorkerGroup.join(spec)
    rows = max(1, args["rows"] // k) if alone else args["rows"]
    cfg = Qwen2Config(vocab_size=args["vocab"], hidden_size=args["hidden"], intermediate_size=4 * args["hidden"],
                      num_hidden_layers=args["layers"], num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=256, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    unit, sync = ("layer", "micro_batch") if alone else layout
    shard_model(model, Precision("fp32"), group, unit=unit)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, foreach=True)
    share = RankShare(group, replicated=unit == "none", grad_sync=sync) if group.sharded else None
    times = []
    for step in range(args["steps"]):
        batch = synthetic_batch(rows, args["max_response"], args["vocab"], seed=step)
        t0 = time.perf_counter()
        run_update(model, opt, batch, loss_cfg=LossConfig(max_response_len=args["max_response"]), temperature=1.0,
                   micro_batch=args["micro_batch"], grad_accum=None, grad_clip=1.0, pad_id=0, share=share)
        times.append(time.perf_counter() - t0)
    if rank == 0:
        Path(out).write_text(json.dumps(sum(times[args["warmup"]:]) / len(times[args["warmup"]:])))
    group.close()


def run(k: int, layout: tuple[str, str], args: dict[str, Any], tmp: Path) -> float:
    """Spawn ``k`` processes of :func:`timed_updates` (one for ``k = 1``); rank 0's mean update time."""
    import torch.multiprocessing as mp

    from mrl_llm.parallel.group import rendezvous

    addr, port = rendezvous("127.0.0.1") if k > 1 and layout[0] != "alone" else ("", 0)
    out = tmp / f"k{k}-{'-'.join(layout)}.json"
    mp.spawn(timed_updates, args=(k, addr, port, layout, args, str(out)), nprocs=k, join=True)
    return float(json.loads(out.read_text()))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--layouts", default=",".join(LAYOUTS), help=f"comma-separated, of {', '.join(LAYOUTS)}")
    ap.add_argument("--rows", type=int, default=128)
    ap.add_argument("--micro-batch", type=int, default=64)
    ap.add_argument("--max-response", type=int, default=12)
    ap.add_argument("--hidden", type=int, default=96)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=320)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3, help="first updates left out of the mean")
    args = ap.parse_args(argv)
    layouts = parse_layouts(args.layouts)
    if args.ranks < 2 or args.steps <= args.warmup or args.warmup < 0 or args.vocab < 2 \
            or min(args.rows, args.micro_batch, args.hidden, args.layers, args.max_response) < 1:
        raise SystemExit("--ranks must be >= 2, --steps exceed --warmup (>= 0), --vocab be >= 2 and --rows, "
                         "--micro-batch, --hidden, --layers and --max-response >= 1")
    if args.hidden % 4:
        raise SystemExit(f"--hidden must be a multiple of the 4 attention heads, got {args.hidden}")
    conf = {k: getattr(args, k) for k in ("rows", "micro_batch", "max_response", "hidden", "layers", "vocab",
                                          "steps", "warmup")}
    with tempfile.TemporaryDirectory(prefix="mrl-update-ranks-") as tmp:
        one = run(1, ("layer", "micro_batch"), conf, Path(tmp))
        print(f"1 process: update {one:.4f} s (mean of steps {args.warmup}..{args.steps - 1}; {conf})")
        alone = run(args.ranks, ("alone", ""), conf, Path(tmp))
        print(f"update wall time, {args.ranks} processes side by side without a group, each on rows / {args.ranks} "
              f"/ 1 process = {alone:.4f} / {one:.4f} s = {alone / one:.2f}x (this machine's limit for the ranks)")
        for layout in layouts:
            t = run(args.ranks, layout, conf, Path(tmp))
            name = "none (replicas)" if layout[0] == "none" else "/".join(layout)
            print(f"update wall time, {args.ranks} ranks {name} / 1 process = {t:.4f} / {one:.4f} s = {t / one:.2f}x; "
                  f"/ {args.ranks} processes without a group = {t / alone:.2f}x", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
