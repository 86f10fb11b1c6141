"""How the demo's defaults were chosen: GRPO and SGT under candidate settings, on seeds the acceptance does not read.

    python -m experiments.demo.tune --out runs/tune --seeds 5 6 7 --jobs 2 \\
        --variant l01:sgt_weight=0.1 --variant lr1e-4:lr=1e-4,sgt_weight=0.1

Each ``--variant NAME:KEY=VALUE,...`` overrides fields of :class:`~mrl_llm.demo.setup.DemoConfig` (numbers, ``none``,
``true`` / ``false``). Per seed the two policies are SFT'd once (the demo's own :func:`~mrl_llm.demo.run.sft_job`,
shared by every variant), and each variant runs ``sgt`` and ``grpo`` with the demo's :func:`~mrl_llm.demo.run.run_job`;
variants that differ only in SGT's knobs (``sgt_weight``, ``sgt_successes``, ``final_norm_sgt``, ``norm_sgt``) share one GRPO run.
Printed per variant (mean ± 95 % t-interval over the seeds, the policies averaged first, as the demo's tables):
GRPO's change from the SFT start of the own-family held-out sampled accuracy and of the pool's sampled accuracy,
SGT − GRPO on the peer-exclusive (greedy) and own-family held-out sampled accuracy, and each run's CPU seconds.
"""

from __future__ import annotations

import argparse
import json
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

from mrl_llm.demo.results import fmt, mean_ci, run_result
from mrl_llm.demo.run import _pool, run_job, sft_job
from mrl_llm.demo.setup import DemoConfig, heldout_set

SGT_ONLY = ("sgt_weight", "sgt_successes", "final_norm_sgt", "norm_sgt")


def parse_variant(text: str) -> tuple[str, dict]:
    """``NAME:KEY=VALUE,...`` -> ``(NAME, overrides)``; ValueError naming the malformed part."""
    name, _, body = text.partition(":")
    over: dict = {}
    for item in filter(None, body.split(",")):
        key, sep, val = item.partition("=")
        if not sep or key not in DemoConfig.__dataclass_fields__:
            raise ValueError(f"--variant {text!r}: {item!r} is not KEY=VALUE with KEY a DemoConfig field")
        low = val.strip().lower()
        over[key] = None if low == "none" else (low == "true") if low in ("true", "false") else (
            int(val) if val.strip().lstrip("-").isdigit() else float(val))
    if not name:
        raise ValueError(f"--variant {text!r}: give it a name, NAME:KEY=VALUE,...")
    return name, over


def grpo_key(over: dict) -> str:
    """The directory name of a variant's GRPO run: its non-SGT overrides."""
    rest = sorted((k, v) for k, v in over.items() if k not in SGT_ONLY)
    return "grpo_" + ("_".join(f"{k}{v}" for k, v in rest) or "default")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--seeds", type=int, nargs="+", required=True)
    ap.add_argument("--variant", action="append", required=True, help="NAME:KEY=VALUE,... (DemoConfig fields)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--regimes", default="grpo,sgt", help="which runs to start (the table needs both, run or reused)")
    args = ap.parse_args(argv)
    out = Path(args.out)
    variants = dict(parse_variant(v) for v in args.variant)
    base = DemoConfig()
    cfgs = {n: replace(base, **o) for n, o in variants.items()}
    from mrl_llm.demo.tokenizers import save_demo_tokenizers

    tok = save_demo_tokenizers(out / "tokenizers", base.task(), kinds=tuple(p.tokenizer for p in base.policies))
    ex: ProcessPoolExecutor = _pool(args.jobs)
    dirs = {s: {p.name: str(out / f"seed{s}" / "sft" / p.name) for p in base.policies} for s in args.seeds}
    for f in [ex.submit(sft_job, base, p, s, str(tok[p.tokenizer]), dirs[s][p.name])
              for s in args.seeds for p in base.policies]:
        f.result()
    jobs, where = {}, {}
    for n, o in variants.items():
        for s in args.seeds:
            for reg, sub in (("grpo", grpo_key(o)), ("sgt", n)):
                d = out / sub / f"seed{s}" / reg
                where[(n, reg, s)] = d
                if d not in jobs and reg in args.regimes.split(","):
                    jobs[d] = ex.submit(run_job, cfgs[n], reg, s, dirs[s], str(d))
    for d, f in jobs.items():
        print(d, f.result(), flush=True)
    ex.shutdown()

    missing = [str(d) for d in where.values() if not (d / "done.json").is_file()]
    if missing:
        print(f"not done yet, no table: {missing}")
        return
    fams = {p.name: p.family for p in base.policies}
    held = {str(p.prompt_id) for p in heldout_set(base.task(), None)}
    rows, doc = [], {}
    for n in variants:
        per = {k: [] for k in ("grpo_own", "grpo_pool", "sgt_own", "excl", "own")}
        cpu = []
        for s in args.seeds:
            g, t = (run_result(where[(n, r, s)], fams, held)["policies"] for r in ("grpo", "sgt"))

            def m(pols, key):
                return sum(d[key] for d in pols.values()) / len(pols)
            per["grpo_own"].append(m(g, "heldout_own_sampled") - m(g, "heldout_own_sampled_start"))
            per["grpo_pool"].append(m(g, "pool_sampled") - m(g, "pool_sampled_start"))
            per["sgt_own"].append(m(t, "heldout_own_sampled") - m(t, "heldout_own_sampled_start"))
            per["excl"].append(m(t, "peer_exclusive_accuracy") - m(g, "peer_exclusive_accuracy"))
            per["own"].append(m(t, "heldout_own_sampled") - m(g, "heldout_own_sampled"))
            cpu += [json.loads((where[(n, r, s)] / "done.json").read_text()).get("cpu_s", float("nan"))
                    for r in ("grpo", "sgt")]
        doc[n] = {"overrides": variants[n], "seeds": args.seeds, "per_seed": per, "cpu_s": cpu}
        rows.append(f"| {n} | {variants[n]} | " + " | ".join(fmt(mean_ci(per[k])) for k in per)
                    + f" | {min(cpu):.0f}-{max(cpu):.0f} |")
    (out / "tune.json").write_text(json.dumps(doc, indent=1))
    print(f"\nseeds {args.seeds}; per-seed values in {out / 'tune.json'}\n")
    print("| variant | overrides | GRPO Δ held-out own sampled | GRPO Δ pool sampled | SGT Δ held-out own sampled "
          "| SGT − GRPO peer-excl. | SGT − GRPO held-out own sampled | CPU-s per run |")
    print("|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
