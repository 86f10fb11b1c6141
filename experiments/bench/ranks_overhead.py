"""Worker-group overhead under Ray: a step's wall time with every policy on k ranks vs on one rank.

Runs the same config on one local Ray cluster through the trainer's Ray runtime (sync mode, evaluation off,
``sampling.seeding: sample`` for all, so a k-rank run splits each step's rollouts over its ranks): once with
``policies[].ranks: 1``, then with ``ranks: k`` once per FSDP unit. It prints the driver's mean wall time
per step (barrier to barrier, ``runtime.json``; the first ``--warmup`` steps left out) of each and their
ratio. On a 2-core machine k ranks cannot run faster (the ranks share the cores): the ratio is the overhead
of the group — collectives, the full rollout copy's weight gather, the ranks' duplicated planning and THL
(target <= 1.15). The config is ``--config FILE`` or, with ``--demo DIR``, the CPU demo's run config for
seed 0 (:func:`experiments.bench.step_overhead.demo_config`; SFT made in DIR or reused from it).

    PYTHONPATH=. python experiments/bench/ranks_overhead.py --demo DIR [--ranks 2] [--steps 6]
        [--fsdp-units layer,model,none] [--grad-syncs micro_batch,mini_batch] [--repeat N]

Each k-rank run is made once per ``--fsdp-units`` value (``train.fsdp_unit``: ``layer``, FSDP2 units of one
decoder layer; ``model``, the whole model one unit; ``none``, whole replicas whose gradients are all-reduced)
and, for FSDP2 units, once per ``--grad-syncs`` value (``train.grad_sync``: ``micro_batch``, gathered and
reduce-scattered every micro-batch; ``mini_batch``, kept gathered through a mini-batch and reduce-scattered once),
all against the same one-rank run. ``--repeat N`` makes N
rounds of these runs, interleaved, each k-rank run against its own round's one-rank run, and gives the median
ratio: on a shared machine one round's ratio moves by ~0.1 from run to run.

Each run's line gives each policy's own step (rank 0's generation, scoring, exchange + THL, update and sync,
without the wait at the step's barrier). Where at k = 1 the slowest policy's own step is more than 1.5x the
fastest's, the bench says so: that policy's one rank holds one core while the other cores idle at the barrier,
and k ranks of it can use them, so the ratio mixes the group's overhead with that gain. The default config
(``tiny_cpu.yaml``) is such a pair (a 151 k-vocabulary Qwen head against a 32 k Llama one: own steps ~6:1); the
demo's policies are even (1.1-1.3:1).

2026-12-06 (eighth session; a one-rank step 0.249-0.282 s). ``--demo DIR --fsdp-units none,model --grad-syncs
mini_batch --steps 11 --num-cpus 2 --repeat 3``: replicas 1.22x, 1.23x, 1.24x (median 1.23x: 0.305 / 0.331 / 0.350
vs 0.249 / 0.269 / 0.282 s); one unit with mini_batch 1.54x, 1.39x, 1.38x (median 1.39x). Own steps at k = 1:
llama-sub 0.232-0.269 s, qwen-add 0.210-0.216 s; replicas 0.280-0.319 / 0.248-0.278 s. The default config, ``--steps
8 --num-cpus 2 --repeat 2`` (one-rank step 3.54 / 3.74 s, its checkpoints every 2 steps included): replicas 0.86x,
0.78x (median 0.82x); one unit 1.22x, 1.19x (micro_batch), 1.12x, 1.04x (mini_batch); per layer 1.19x, 1.17x
(micro_batch), 1.17x, 1.12x (mini_batch). Once more with ``--fsdp-units none``: 0.77x (2.464 vs 3.187 s), own steps
at k = 1 qwen-tiny 2.632 s, llama-tiny 0.425 s (6.2:1), at k = 2 1.935 / 0.559 s: below 1 because the qwen ranks take
the core the llama rank leaves idle at k = 1.

2026-12-06 (seventh session; a one-rank step 0.319-0.463 s). ``--fsdp-units none,model --grad-syncs mini_batch
--steps 11 --repeat 3``: replicas 1.30x, 1.00x, 1.42x (median 1.30x: 0.511 / 0.465 / 0.454 vs 0.391 / 0.463 / 0.319
s); one unit with mini_batch 1.58x, 1.02x, 1.51x (median 1.51x). The one-rank step moved by 0.14 s between rounds.

2026-12-06 (sixth session; a one-rank step 0.222-0.247 s). ``--steps 11 --num-cpus 2``: replicas 1.25x (0.277 vs
0.222 s), one unit with mini_batch 1.31x (0.291 s); ``--steps 21 --repeat 2``: replicas 1.18x, 1.36x (median 1.27x;
0.292 / 0.310 vs 0.247 / 0.227 s). Where the extra time goes, measured with per-actor CPU timers (not kept): the
k = 2 ranks together use 20-39 % more CPU a step than the one rank (training +19-40 %, generation +22 %); the
driver, GCS and raylet use next to none. The same generation work done by 4 processes of 8 prompts instead of 2 of
16: +24 % CPU, +18 % wall; one process samples 16 prompts in 0.041-0.046 s and 8 in 0.023 s, so ~12 % of a call is fixed
cost. About half the extra is that per-call fixed work done by each rank, half is 4 processes contending for 2 cores
(a k = 2 rank's update waits ~22 ms a step in its 4 all-reduces). Neither is a code path to remove: on a machine
with a core or GPU per rank the ranks' fixed work runs side by side instead of in turn.

2026-12-06 (fifth session; a faster machine: a one-rank step 0.256-0.358 s). ``train.grad_sync: mini_batch``: FSDP2
units kept gathered through a mini-batch, the gradients accumulated unsharded in fp32 and reduce-scattered once (the
parity tests count the collectives: 6 all-gathers and 3 reduce-scatters for a mini-batch of ``m`` micro-batches
instead of ``9 m`` and ``3 m``). ``--steps 11 --repeat 2``, all five layouts (micro_batch / mini_batch): per layer
1.59x, 1.74x / 1.35x, 1.99x; one unit 1.42x, 2.09x / 1.40x, 1.68x; replicas 1.06x, 1.65x. ``--steps 11 --repeat 3
--fsdp-units layer,none``: per layer 1.49x, 1.46x, 1.50x (median 1.49x) / 1.26x, 1.54x, 1.64x (median 1.54x); replicas
0.94x, 1.33x, 1.10x (median 1.10x: 0.337 / 0.392 / 0.362 vs 0.358 / 0.295 / 0.330 s). The default five layouts,
``--steps 11 --repeat 3`` (micro_batch / mini_batch): per layer 1.50x, 1.51x, 1.47x (median 1.50x) / 1.51x, 1.33x,
1.40x (median 1.40x); one unit 1.35x, 1.49x, 1.39x (median 1.39x) / 1.17x, 1.43x, 1.38x (median 1.38x); replicas
1.18x, 1.06x, 1.22x (median 1.18x: 0.393 / 0.320 / 0.427 vs 0.332 / 0.301 / 0.351 s; update 0.171-0.220 vs
0.161-0.174 s, exchange + THL 0.023-0.028 vs 0.016-0.018 s). Longer runs, ``--steps 31 --repeat 3`` (one-rank step
0.342-0.447 s): per layer 1.67x, 1.55x, 1.28x (median 1.55x) / 1.45x, 1.48x, 1.19x (median 1.45x); one unit 1.27x,
1.40x, 1.10x (median 1.27x) / 1.46x, 1.32x, 1.14x (median 1.32x); replicas 1.19x, 1.23x, 0.98x (median 1.19x). Over
the three sets' 9 rounds, per layer, mini_batch was the faster of the two in 6, level in 1 and slower in 2; with one
unit, faster in 4 of 6 rounds. With shorter steps a step's
fixed costs weigh more (the same code measured 1.32x per layer and 1.11x replicas the session before, at 0.59 s
one-rank steps), and one layout's ratio moved by up to 0.4x between rounds: mini_batch's saving (the backward's
re-gathers, and the forward's after the first micro-batch; the demo's ranks run one or two micro-batches a step) is
below that noise here. One policy's update alone (its 2 ranks alone on the 2 cores, a demo-sized Qwen2 of 2 layers,
256 rows, micro-batch 64; a throwaway script): one rank 0.171 s; 2 ranks: replicas 0.117 s, per layer 0.151 s
(micro_batch) and 0.138 s (mini_batch), one unit with mini_batch 0.114 s.

2026-12-06 (fourth session, the same machine: a one-rank step 0.57-0.61 s). Two changes. (1) The ranks of a group
all-gather the step's own records after sampling, so each plans with them in hand as one rank does: the exchange
is asked only for the peers' records and only those are re-checked (before, every rank fetched and re-checked its
siblings' records too, and waited for the slowest one's publish). ``--steps 11 --repeat 2`` with it: exchange +
THL at k = 2 0.031-0.033 vs 0.022-0.025 s (0.052-0.057 s the session before); per layer 1.33x, 1.20x (median
1.27x), one unit 1.21x, 1.22x (0.685 / 0.722 vs 0.565 / 0.589 s). (2) ``train.fsdp_unit: none``, whole replicas
whose gradients are summed in one fp32 all-reduce per mini-batch (no FSDP2 collectives, no weight gather).
``--steps 11 --repeat 3`` (the default three layouts, nothing else running): replicas 1.11x, 1.04x, 1.17x (median
1.11x: 0.656 / 0.641 / 0.682 vs 0.588 / 0.614 / 0.585 s; update 0.370-0.374 vs 0.325-0.348 s), one unit 1.24x,
1.18x, 1.21x (median 1.21x; update 0.409-0.418 s), per layer 1.30x, 1.38x, 1.32x (median 1.32x; update
0.452-0.498 s). A round run beside a test suite gave 0.80x / 0.84x (its one-rank run slowed to 0.850 s): the
rounds must run alone.

2026-12-05 (third session, the slower machine: a one-rank step 0.56-0.65 s). A profile of one policy's update
(its 2 ranks alone on the 2 cores, throwaway script): with no FSDP (each rank its share, no gradient
collective) a rank's CPU time a step was 0.38 s in one run and 0.45 s in another, with FSDP2 0.43-0.46 s (the
one-process update 0.69-0.76 s): FSDP2's own work (all-gathers, reduce-scatter, DTensor dispatch) is 0-0.08 s
a rank, within that noise. Taken out: the optimizer's per-parameter loop over DTensor shards (AdamW step 0.044 -> 0.009 s, now
multi-tensor), torch's clip over DTensor gradients (~0.006 s and an all-reduce; the norm now rides on the loss
totals' all-reduce) and THL's gather when no rank has a peer record. Before them, single rounds: ``--steps 6``
1.42x per layer, 1.26x one unit (0.789 / 0.701 vs 0.556 s), ``--steps 11 --fsdp-units model`` 1.15x (0.734 vs
0.640 s); after: ``--steps 11`` 1.38x / 1.17x (0.867 / 0.736 vs 0.627 s), and ``--steps 11 --repeat 2``: per
layer 1.41x, 1.28x (median 1.35x), one unit 1.20x, 1.20x (0.881 / 0.831 and 0.748 / 0.777 vs 0.625 / 0.649 s;
update 0.49-0.52 / 0.43-0.45 vs 0.35-0.38 s, exchange + THL 0.052-0.057 vs 0.022-0.025 s, weight gather
0.014 s). The change is below one round's noise (~0.1x). Four rank processes on 2 cores wait for each other at
every collective (``vmstat``: the cores ~4 % idle at k = 2, ~10 % at k = 1, so the k = 2 step does ~20 % more
CPU work); the per-layer units' extra collectives cost 0.05-0.13 s a step.

2026-12-05 (second session; a slower machine: a one-rank step 0.58-0.93 s, the earlier 0.16 s), ``--steps 6``: the
driver's per-call combining of a group's answers ran as a zero-CPU Ray task, and Ray keeps no idle worker process on
a node whose CPUs the ranks hold: each call started one (0.8-1.0 s a call measured on this machine with 4 busy
actors, against ~0 on an actor: ``rank_group.Combiner``). Before: 6.16x per layer, 6.15x one unit (5.720 / 5.711 vs
0.928 s); with the long-lived combiner actor: 1.46x per layer, 1.43x one unit (0.851 / 0.831 vs 0.582 s; update
0.519 / 0.480 vs 0.338 s, exchange + THL 0.066 / 0.064 vs 0.022 s). The runs below (the first session) paid that
start too, less of it on the faster machine.

2026-12-05, idle machine (load average ~1): ``--steps 6``: one unit 1.59x (0.253 vs 0.159 s), per layer 1.74x
(0.276 s); ``--steps 11 --fsdp-units model,layer``: 1.55x (0.245 vs 0.158 s), 1.63x (0.258 s); ``--steps 6
--fsdp-units model`` once more: 1.72x (0.268 vs 0.156 s). The update at k = 2 is 0.142 / 0.137 / 0.152 s with one
unit, 0.161 / 0.151 s per layer, 0.088-0.093 s at k = 1: one unit removes some of the per-layer collectives'
latency, less than run-to-run noise of ~0.15x. The rest is 4 rank processes on 2 cores waiting on each other:
exchange + THL is 0.022-0.028 s at k = 2 against 0.007-0.008 s, of which fetching the records (waiting for the
slowest rank's samples) is 0.014 vs 0.003 s and THL (the ranks' split alignment, gathered) 0.008 vs 0.000 s.

Measured on the idle 2-core machine (2026-12-03, load average < 1.1; `--demo` with the demo's SFT'd policies,
``--num-cpus 2``), after the rollout copy's gather went bucketed and peer alignment was split over the ranks:
``--steps 6``: 1.57x (ranks 2: 0.417 s, ranks 1: 0.266 s a step; on rank 0: update 0.248 vs 0.141 s, exchange +
THL 0.038 vs 0.011 s, weight gather 0.006 vs 0 s, generation 0.082 vs 0.074 s); ``--steps 11``: 1.59x (0.454 vs
0.285 s; update 0.264 vs 0.155 s). The demo's step is too short for the group's fixed costs: FSDP2's per-layer
all-gathers and reduce-scatters on a 300 K-parameter model are latency, not work. Both miss the 1.15 target.
Earlier, on the same machine while other jobs ran: 1.40x (1.163 vs 0.833 s; the gather then 0.104 s) and 7.57x.
Again on the idle machine (2026-12-04, a faster day: k = 1 steps 0.15 s): ``--steps 6``: 1.66x (0.252 vs 0.152 s;
update 0.145 vs 0.087 s, exchange + THL 0.023 vs 0.008 s); ``--steps 11``, alternating the code before and after the
update's explicit collectives were merged (3 + one per micro-batch -> 2 a mini-batch): 1.69x, 1.63x before, 1.76x,
1.73x after (k = 2 update 0.162 / 0.153 vs 0.157 / 0.156 s): no measurable change; the FSDP2 collectives remain.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PARTS = ("generation_s", "scoring_s", "exchange_thl_s", "update_s", "sync_s")
EXCHANGE_PARTS = ("publish_s", "fetch_s", "peer_check_s", "plan_s", "thl_s")  # exchange_thl_s in detail
FSDP_UNITS = ("layer", "model", "none")  # train.fsdp_unit (mrl_llm.parallel.fsdp.FSDP_UNITS)
GRAD_SYNCS = ("micro_batch", "mini_batch")  # train.grad_sync (mrl_llm.parallel.share.GRAD_SYNCS)
UNEVEN = 1.5  # policies' own steps further apart than this at k = 1: the ratio is not the overhead alone


def with_ranks(cfg, k: int, unit: str = "layer", sync: str = "micro_batch"):
    """``cfg`` with every policy on ``k`` ranks (``train.fsdp_unit: unit``, ``train.grad_sync: sync``) and per-sample
    seeding."""
    pols = tuple(replace(p, ranks=k, sampling=replace(p.sampling, seeding="sample"),
                         train=replace(p.train, fsdp_unit=unit, grad_sync=sync)) for p in cfg.policies)
    return replace(cfg, policies=pols)


def own_steps(rows: list[dict]) -> dict[str, float]:
    """Each policy's mean own step (rank 0's ``step_s``: its generation, scoring, exchange + THL, update and sync,
    without the wait for the other policies at the step's barrier) over ``rows`` (train metric rows); ``{}`` for
    none."""
    by: dict[str, list[float]] = {}
    for r in rows:
        by.setdefault(r["policy"], []).append(r["step_s"])
    return {name: statistics.mean(v) for name, v in sorted(by.items())}


def imbalance(steps: dict[str, float]) -> float:
    """The slowest policy's own step over the fastest's (1.0 for fewer than two policies)."""
    return max(steps.values()) / min(steps.values()) if len(steps) > 1 and min(steps.values()) > 0 else 1.0


def layouts(units: list[str], syncs: list[str]) -> list[tuple[str, str]]:
    """The k-rank runs' ``(fsdp_unit, grad_sync)``: each unit with each sync, replicas (``none``) once (their
    gradients are summed once a mini-batch whatever the sync)."""
    return [(u, s) for u in units for s in (syncs if u != "none" else syncs[:1])]


def listed(arg: str, flag: str, allowed: tuple[str, ...]) -> list[str]:
    """The comma-separated values of ``arg``, each one of ``allowed``; empty or unknown: an error naming ``flag``."""
    got = [v.strip() for v in arg.split(",") if v.strip()]
    if not got or any(v not in allowed for v in got):
        raise SystemExit(f"{flag} must list some of {', '.join(allowed)}, got {arg!r}")
    return got


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--config", default=str(REPO / "experiments" / "configs" / "tiny_cpu.yaml"))
    src.add_argument("--demo", metavar="DIR", help="the CPU demo's config, seed 0 (SFT made or reused in DIR)")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--fsdp-units", default="layer,model,none",
                    help="comma-separated train.fsdp_unit values, one k-rank run each (default: layer,model,none)")
    ap.add_argument("--grad-syncs", default="micro_batch,mini_batch",
                    help="comma-separated train.grad_sync values, one k-rank run each per FSDP2 unit "
                         "(default: micro_batch,mini_batch)")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=1, help="first steps left out of the means")
    ap.add_argument("--num-cpus", type=int, default=None, help="local Ray cluster size (default: all cores)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="rounds of all the runs, interleaved (one-rank run first in each); ratios per round and median")
    args = ap.parse_args(argv)
    if args.steps <= args.warmup or args.ranks < 2 or args.repeat < 1:
        raise SystemExit("--steps must exceed --warmup, --ranks be at least 2 and --repeat at least 1")
    runs = [(1, "layer", "micro_batch")] + [(args.ranks, u, sync) for u, sync in layouts(
        listed(args.fsdp_units, "--fsdp-units", FSDP_UNITS), listed(args.grad_syncs, "--grad-syncs", GRAD_SYNCS))]

    import ray

    from experiments.bench.step_overhead import bench_config
    from mrl_llm.distributed.ray_trainer import train_on_ray
    from mrl_llm.metrics import read_metrics

    cfg, problems = bench_config(args)
    cfg = replace(cfg, steps=args.steps, tensorboard=False, progress=False, eval=replace(cfg.eval, enabled=False),
                  runtime=replace(cfg.runtime, backend="ray", mode="sync", max_staleness=0))
    ray.init(address="local", num_cpus=args.num_cpus, include_dashboard=False, log_to_driver=False)
    rounds: list[dict[str, float]] = []
    one_rank_imbalance: list[float] = []  # per round: the slowest policy's own step / the fastest's, at k = 1
    try:
        with tempfile.TemporaryDirectory(prefix="mrl-ranks-overhead-") as tmp:
            for rnd, (k, unit, sync) in ((r, run) for r in range(args.repeat) for run in runs):
                if k == 1:
                    rounds.append({})
                    if args.repeat > 1:
                        print(f"-- round {rnd + 1} of {args.repeat}")
                per_step = rounds[-1]
                label = f"ranks {k}" + (f", fsdp_unit {unit}" if k > 1 else "") + (
                    f", grad_sync {sync}" if k > 1 and unit != "none" else "")
                out = Path(tmp) / f"r{rnd}-k{k}-{unit}-{sync}"
                t0 = time.perf_counter()
                train_on_ray(with_ranks(cfg, k, unit, sync), out, problems=problems)
                walls = json.loads((out / "runtime.json").read_text())["step_wall_s"]
                per_step[label] = statistics.mean(v for s, v in walls.items() if int(s) >= args.warmup)
                rows = [r for r in read_metrics(out / "metrics.jsonl") if r["kind"] == "train" and r["step"] >= args.warmup]
                parts = ", ".join(f"{p[:-2]} {statistics.mean(r[p] for r in rows):.3f}" for p in PARTS)
                parts += " (" + ", ".join(f"{p[:-2]} {statistics.mean(r.get(p) or 0.0 for r in rows):.3f}"
                                          for p in EXCHANGE_PARTS) + ")"
                own = own_steps(rows)
                if k == 1:
                    one_rank_imbalance.append(imbalance(own))
                print(f"{label}: mean step {per_step[label]:.3f} s over steps {args.warmup}..{args.steps - 1} "
                      f"(rank 0, mean over policies, s: {parts}; each policy's own step: "
                      + ", ".join(f"{n} {v:.3f}" for n, v in own.items()) + "); whole run incl. start-up "
                      f"{time.perf_counter() - t0:.1f} s; {(out / 'plan.txt').read_text().splitlines()[0]}")
    finally:
        ray.shutdown()
    print(f"\nconfig: {args.config}")
    for label in rounds[0]:
        if label == "ranks 1":
            continue
        ratios = [r[label] / r["ranks 1"] for r in rounds]
        for n, r in enumerate(rounds):
            print(f"step wall time, {label} / ranks 1 = {r[label]:.3f} / {r['ranks 1']:.3f} s = {ratios[n]:.2f}x"
                  + (f" (round {n + 1})" if len(rounds) > 1 else ""))
        ratio = statistics.median(ratios)
        verdict = "meets" if ratio <= 1.15 else "MISSES"
        print(f"  {label}: {'median ' if len(rounds) > 1 else ''}{ratio:.2f}x -> {verdict} the 1.15 target")
    skew = statistics.median(one_rank_imbalance)
    if skew > UNEVEN:
        print(f"\nat k = 1 the slowest policy's own step is {skew:.1f}x the fastest's: its one rank runs on one core "
              f"while the faster policies' cores idle at the step's barrier; k ranks of it can use those cores, so "
              f"these ratios mix the group's overhead with that gain (the CPU demo's policies are even: --demo DIR)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
