"""Wall time of ``bandit_sim sweep`` on one grid, sequential (``--workers W``) against Ray, alternating.

    PYTHONPATH=. python experiments/bench/sweep_runtimes.py --grid GRID --rounds 2 --out runs/bench_sweep

Each round runs the grid once per runtime, each as a whole command in its own subprocess (start-up and Ray's
cluster start included), in the order sequential, Ray on even rounds and Ray, sequential on odd ones (``--first
ray`` swaps them, to continue an alternation begun with another grid or an earlier round), so that both
runtimes see the same load over the rounds (the machine may be shared: the 1-minute load average is
recorded before and after each command). Every run's ``sweep.csv`` is compared byte for byte with the first
one's. Prints, per round, both wall times and Ray's throughput over the sequential one's (seq wall / Ray
wall), and writes it all to ``OUT/bench.json``.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import subprocess
import sys
import time
from pathlib import Path


def timed_sweep(grid: str, out: Path, runtime: str, workers: int) -> dict:
    """Run one sweep as a subprocess; its wall time and the load average around it."""
    cmd = [sys.executable, "-m", "bandit_sim", "sweep", "--grid", grid, "--out", str(out), "--quiet"]
    cmd += ["--runtime", "ray"] if runtime == "ray" else ["--workers", str(workers)]
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}")
    summary = json.loads((out / "sweep.json").read_text())
    return {"runtime": runtime, "cmd": " ".join(cmd[1:]), "wall_s": round(wall, 2), "load_start": load0,
            "load_end": os.getloadavg()[0], "points": summary["points"], "finished": summary["finished"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--grid", required=True, help="a named grid or a YAML file (as bandit_sim sweep --grid)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--first", choices=("sequential", "ray"), default="sequential", help="runtime run first in round 0")
    ap.add_argument("--workers", type=int, default=2, help="--workers of the sequential runtime")
    ap.add_argument("--out", required=True, help="a new directory: one sweep directory per run, bench.json")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        raise SystemExit("--rounds must be >= 1")
    out = Path(args.out)
    if out.exists():
        raise SystemExit(f"--out {out} exists; pick a new directory")
    out.mkdir(parents=True)
    runs, first_csv = [], None
    for r in range(args.rounds):
        order = ("sequential", "ray") if (r % 2 == 0) == (args.first == "sequential") else ("ray", "sequential")
        for runtime in order:
            d = out / f"round{r}_{runtime}"
            run = {"round": r, **timed_sweep(args.grid, d, runtime, args.workers)}
            first_csv = first_csv or d / "sweep.csv"
            run["csv_equal_to_first"] = filecmp.cmp(first_csv, d / "sweep.csv", shallow=False)
            runs.append(run)
            print(f"round {r} {runtime:10s} {run['wall_s']:8.1f} s  load {run['load_start']:.2f} -> "
                  f"{run['load_end']:.2f}  sweep.csv equal to the first run's: {run['csv_equal_to_first']}",
                  flush=True)
    for r in range(args.rounds):
        w = {x["runtime"]: x["wall_s"] for x in runs if x["round"] == r}
        print(f"round {r}: sequential --workers {args.workers} {w['sequential']:.1f} s, Ray {w['ray']:.1f} s, "
              f"Ray throughput / sequential {w['sequential'] / w['ray']:.2f}x")
    (out / "bench.json").write_text(json.dumps({"grid": args.grid, "workers": args.workers, "first": args.first, "runs": runs}, indent=1)
                                    + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
