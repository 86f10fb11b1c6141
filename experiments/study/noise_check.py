"""How precise are the study's acceptance numbers? Two checks, one subcommand each.

``eval``: the evaluation noise of one policy's sampled accuracy, measured directly -- evaluate the same
policy ``--repeats`` times on its family's held-out prompts with ``--k`` samples per prompt and a different
sampling seed each time; print every repeat, their sd, and the binomial s.e. that the study's report
estimates from ONE evaluation's per-prompt rates (:func:`mrl_llm.demo.study_report.sampled_var`), here from
the pooled ``k * repeats`` samples. If the two agree, the report's "eval s.e." is the right number::

    python -m experiments.study.noise_check eval --policy runs/study/seed0/sft/qwen-add --family add --k 8 --repeats 6

``bound``: for a finished study's ``study.json`` (also one written before the report printed its own
evaluation noise), each GRPO start -> final difference's seed sd beside the binomial upper bound
``p (1 - p) / (n k)`` of the evaluation's variance at both ends (``p``: the accuracy, ``n`` prompts, ``k``
samples each; the bound is reached when every prompt has the same success rate)::

    python -m experiments.study.noise_check bound --report experiments/study/acceptance/study.json

``split``: per finished run of a study directory, its wall time beside the time its training steps took
(the rest is evaluation and setup) -- what a larger ``--eval-k`` costs::

    python -m experiments.study.noise_check split --out runs/study

``power``: the probability that an ``n``-seed 95 % t-interval of a paired difference excludes 0 when its true
mean is ``d`` seed-to-seed sds (simulated, normal differences), and the chance that ``m`` such checks all pass
(the GRPO check is 6: two metrics x three policies)::

    python -m experiments.study.noise_check power --seeds 3 --checks 6
"""

from __future__ import annotations

import argparse
import math

import numpy as np


def t_pass_probability(d: float, n: int, *, reps: int = 200_000, seed: int = 0, level: float = 0.95) -> float:
    """P(the ``level`` t-interval over ``n`` normal draws of mean ``d``, sd 1 lies above 0), simulated."""
    from mrl_llm.demo.results import t_quantile

    rng = np.random.default_rng(seed)
    x = rng.normal(d, 1.0, size=(reps, n))
    half = t_quantile(0.5 + level / 2, n - 1) * x.std(axis=1, ddof=1) / math.sqrt(n)
    return float(np.mean(x.mean(axis=1) - half > 0))


def _power(args: argparse.Namespace) -> None:
    from mrl_llm.demo.results import t_quantile

    n = args.seeds
    print(f"{n} seeds: the 95 % t half-width is {t_quantile(0.975, n - 1):.2f} * sd / sqrt({n}) = "
          f"{t_quantile(0.975, n - 1) / math.sqrt(n):.2f} sd; a check passes when mean > that")
    print(f"{'true mean / sd':>15} {'P(one check passes)':>20} {f'P(all {args.checks} pass)':>18}")
    for d in args.effects:
        p = t_pass_probability(d, n)
        print(f"{d:15.1f} {p:20.3f} {p ** args.checks:18.3f}")


def _bound(args: argparse.Namespace) -> None:
    import json
    from pathlib import Path

    from mrl_llm.demo.study import StudyConfig

    doc = json.loads(Path(args.report).read_text())
    k, steps = doc["config"]["eval_k"], doc["steps"]
    cfg = StudyConfig()
    task = cfg.task()
    n_pool = doc["config"]["pool_per_family"]
    for pol in cfg.policies:
        n_held = len(task.problems("eval", [pol.family]))
        for metric, n in (("own_s", n_held), ("reward", n_pool)):
            diffs, evs = [], []
            for key, run in sorted(doc["runs"].items()):
                if not key.startswith("grpo/"):
                    continue
                c = run[pol.name][metric]
                a0, a1 = c[str(steps[0])], c[str(steps[-1])]
                diffs.append(a1 - a0)
                evs.append((a0 * (1 - a0) + a1 * (1 - a1)) / (n * k))
            if len(diffs) < 2:
                raise SystemExit(f"{args.report}: fewer than 2 GRPO seeds")
            sd, se = float(np.std(diffs, ddof=1)), math.sqrt(float(np.mean(evs)))
            print(f"{pol.name:10s} {metric:7s} ({n} prompts x {k}): mean {np.mean(diffs):+.3f}, seed sd {sd:.3f}, "
                  f"binomial bound of the evaluation s.e. {se:.3f} ({se * se / (sd * sd):.0%} of the seed variance)")


def _split(args: argparse.Namespace) -> None:
    import json
    from pathlib import Path

    out = Path(args.out)
    done = sorted(out.glob("seed*/*/done.json"))
    if not done:
        raise SystemExit(f"{out}: no finished study run (seed*/<regime>/done.json)")
    for d in done:
        wall = json.loads(d.read_text())["wall_s"]
        rows = [json.loads(x) for x in (d.parent / "metrics.jsonl").read_text().splitlines() if x.strip()]
        tr = sum(r.get("step_s", 0.0) for r in rows if isinstance(r, dict) and r.get("kind") == "train")
        print(f"{d.parent.relative_to(out)}: wall {wall:.0f} s, training steps {tr:.0f} s, "
              f"rest (evaluation, setup) {wall - tr:.0f} s = {(wall - tr) / wall:.0%}")


def _eval(args: argparse.Namespace) -> None:
    from experiments.study.grpo_probe import sampled_accuracy
    from mrl_llm.demo.run import _quiet
    from mrl_llm.demo.study import StudyConfig
    from mrl_llm.demo.study_report import sampled_var

    _quiet()
    cfg = StudyConfig()
    held = cfg.task().problems("eval", [args.family])
    if not held:
        raise SystemExit(f"no held-out prompts of family {args.family!r} in the study's task")
    per = [sampled_accuracy(args.policy, held, args.k, cfg.max_new_tokens, seed=1000 + r) for r in range(args.repeats)]
    accs = [float(np.mean(x)) for x in per]
    pooled = [{"samples": args.k * args.repeats, "successes": round(sum(x[i] for x in per) * args.k)}
              for i in range(len(held))]
    # the variance of ONE k-sample evaluation: that of the pooled estimate times `repeats`
    var_k = sampled_var(pooled) * args.repeats
    one = [sampled_var([{"samples": args.k, "successes": round(x[i] * args.k)} for i in range(len(held))]) for x in per]
    print(f"{args.policy} on {len(held)} held-out {args.family} prompts, {args.k} samples each, {args.repeats} seeds:")
    print("  accuracies: " + " ".join(f"{a:.4f}" for a in accs))
    print(f"  sd over the repeats {np.std(accs, ddof=1):.4f}; binomial s.e. from the pooled per-prompt rates "
          f"{math.sqrt(var_k):.4f}; from each single evaluation (what the report uses) "
          + " ".join(f"{math.sqrt(v):.4f}" for v in one))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("eval", help="repeat one policy's held-out evaluation with different sampling seeds")
    e.add_argument("--policy", required=True, help="a saved policy directory (an SFT or a run's policies/<name>)")
    e.add_argument("--family", required=True, help="its family: add, sub or mul_small")
    e.add_argument("--k", type=int, default=8)
    e.add_argument("--repeats", type=int, default=6)
    b = sub.add_parser("bound", help="binomial upper bound of a finished study's evaluation noise")
    b.add_argument("--report", required=True, help="a study.json")
    sp = sub.add_parser("split", help="training vs evaluation time of a study directory's runs")
    sp.add_argument("--out", required=True, help="a study directory")
    p = sub.add_parser("power", help="pass probability of n-seed t-interval checks")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--checks", type=int, default=6)
    p.add_argument("--effects", type=float, nargs="+", default=[1.0, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0])
    args = ap.parse_args()
    if args.cmd == "eval" and (args.k < 2 or args.repeats < 2):
        raise SystemExit("eval: --k and --repeats must be >= 2")
    if args.cmd == "power" and args.seeds < 2:
        raise SystemExit("power: --seeds must be >= 2")
    {"eval": _eval, "power": _power, "bound": _bound, "split": _split}[args.cmd](args)


if __name__ == "__main__":
    main()
