"""The MATH verifier on a step's responses: one checker at a time (the reference) vs a pool of workers.

Scores the same batch twice in one process, with ``MathVerifier(n_workers=1)`` and with
``MathVerifier(n_workers=N)`` (``score_many``), each verifier warmed up first (its worker processes
started; start-up is not timed), and prints both wall times and their ratio. The batch is
``--responses`` MATH-500 solutions scored against themselves as the gold, plus,
with ``--runaway``, one response whose parse runs away (``\\boxed{2^{2^{2^{2^{30}}}}}``) placed first:
one at a time every other response waits behind its ``--timeout`` and the fresh worker's start-up;
with the pool it holds one worker while the others score the rest.

    PYTHONPATH=. python experiments/bench/verifier_pool.py [--responses 64] [--workers 2] [--runaway]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from mrl_llm.config import find_shared_dir
from mrl_llm.rewards import ScoreRequest
from mrl_llm.rewards.math_verifier import MathVerifier

RUNAWAY = r"\boxed{2^{2^{2^{2^{30}}}}}"


def batch(path: Path, n: int, runaway: bool) -> list[ScoreRequest]:
    rows = [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()][:n]
    out = [ScoreRequest(r["answer"], r["answer"]) for r in rows]  # a full solution against itself
    return ([ScoreRequest(RUNAWAY, "1")] if runaway else []) + out


def timed(v: MathVerifier, reqs: list[ScoreRequest]) -> tuple[float, list]:
    v.score_many([ScoreRequest(r"\boxed{1}", "1")] * v.n_workers)  # every worker started
    t0 = time.perf_counter()
    out = v.score_many(reqs)
    return time.perf_counter() - t0, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    shared = find_shared_dir() or Path(__file__).resolve().parents[3] / "shared"  # $MRL_SHARED_DIR first
    ap.add_argument("--data", default=str(shared / "data" / "math500.jsonl"))
    ap.add_argument("--responses", type=int, default=64)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=5.0)
    ap.add_argument("--runaway", action="store_true")
    a = ap.parse_args()
    reqs = batch(Path(a.data), a.responses, a.runaway)
    serial, pooled = MathVerifier(n_workers=1, timeout_s=a.timeout), MathVerifier(n_workers=a.workers, timeout_s=a.timeout)
    try:
        t1, out1 = timed(serial, reqs)
        tn, outn = timed(pooled, reqs)
    finally:
        serial.close()
        pooled.close()
    same = [(o.reward, o.reason) for o in out1] == [(o.reward, o.reason) for o in outn]
    reasons = {r: sum(o.reason == r for o in outn) for r in sorted({o.reason for o in outn})}
    print(f"{len(reqs)} responses{' (one runaway parse first)' if a.runaway else ''}, timeout {a.timeout:g} s; "
          f"verdicts {reasons}; same verdicts: {same}")
    print(f"one checker at a time: {t1:.2f} s   pool of {a.workers}: {tn:.2f} s   ratio {t1 / tn:.2f}x")


if __name__ == "__main__":
    main()
