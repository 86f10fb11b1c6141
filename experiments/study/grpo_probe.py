"""Probe: does GRPO improve ONE demo policy on its own family? Controlled, small runs of the real trainer.

Builds the demo's tokenizers and SFTs one demo policy (:mod:`mrl_llm.demo.run`'s own jobs, reused when
done), then trains that policy alone under ``grpo`` with the real trainer on a prompt set of its own
family, and prints the sampled training reward per step (``metrics.jsonl``), the step's mean |advantage|,
grad norm, clip fraction, KL to start, and the greedy + sampled accuracy on held-out prompts of the
family at the start and the end. One knob at a time is changed on the command line::

    python -m experiments.study.grpo_probe --out runs/probe --policy llama-sub --prompts 1 --steps 30
    python -m experiments.study.grpo_probe --out runs/probe --policy qwen-add --lr 1e-4 --optimizer sgd

``--prompts N``: the N *hardest* training prompts of the family (lowest sampled success at the SFT
start, ties by id) -- ``--prompts 1`` is the one-prompt overfit check -- or ``all``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from mrl_llm.demo.run import _quiet, sft_job
from mrl_llm.demo.setup import DemoConfig, rl_pool, run_config
from mrl_llm.demo.study import StudyConfig
from mrl_llm.demo.tokenizers import save_demo_tokenizers


def sampled_accuracy(pdir: Path, problems: list, k: int, max_new_tokens: int, seed: int) -> list[float]:
    """Per problem: the fraction of ``k`` temperature-1 samples the arithmetic checker accepts."""
    import torch

    from mrl_llm.models import load_policy
    from mrl_llm.rewards import arithmetic_reward
    from mrl_llm.rollout import HFEngine, SamplingConfig
    from mrl_llm.templates import PromptTemplate, TemplateConfig

    model, tok, meta = load_policy(pdir)
    tpl = PromptTemplate(TemplateConfig(**meta["template"]), tok)
    prompts = [list(tok(tpl.render(p), add_special_tokens=tpl.add_special_tokens).input_ids) for p in problems]
    torch.manual_seed(seed)
    out = HFEngine(model, tok, max_batch_size=256).generate(prompts, k, SamplingConfig(max_new_tokens=max_new_tokens))
    return [sum(arithmetic_reward(s.text, p.gold, finish_reason=s.finish_reason) for s in ss) / k
            for ss, p in zip(out, problems, strict=True)]


def greedy(pdir: Path, problems: list, max_new_tokens: int) -> float:
    from mrl_llm.demo.sft import greedy_accuracy
    from mrl_llm.models import load_policy
    from mrl_llm.templates import PromptTemplate, TemplateConfig

    model, tok, meta = load_policy(pdir)
    return greedy_accuracy(model, tok, PromptTemplate(TemplateConfig(**meta["template"]), tok), problems,
                           max_new_tokens)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--preset", default="demo", choices=("demo", "study"),
                    help="whose policies, SFT and settings (study: mrl_llm.demo.study.StudyConfig)")
    ap.add_argument("--policy", default="llama-sub", help="a policy name of the preset")
    ap.add_argument("--prompts", default="all", help="N hardest training prompts of the family, all, or pool (the family's prompts of the seed's RL pool)")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--prompts-per-step", type=int, default=16)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--optimizer", default="adamw", choices=("adamw", "adam", "sgd"))
    ap.add_argument("--beta1", type=float, default=0.9)
    ap.add_argument("--beta2", type=float, default=0.999)
    ap.add_argument("--eps", type=float, default=1e-8, help="Adam's eps")
    ap.add_argument("--lr-group", action="append", default=[], metavar="GLOB=LR",
                    help="train.lr_groups entry (repeatable; first match wins; LR 0 freezes)")
    ap.add_argument("--agg", default="token-mean")
    ap.add_argument("--kl-coef", type=float, default=0.0)
    ap.add_argument("--sft-steps", type=int, default=None,
                    help="SFT steps (default: the demo's 400; the study's per-policy steps)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--k", type=int, default=8, help="samples per held-out prompt for the sampled accuracy")
    ap.add_argument("--tag", default=None, help="run directory name (default: from the knobs)")
    args = ap.parse_args()
    _quiet()

    knobs = {"steps": args.steps, "prompts_per_step": args.prompts_per_step, "group_size": args.group_size,
             "lr": args.lr, "kl_coef": args.kl_coef, "first_seed": args.seed, "regimes": ("grpo",)}
    if args.preset == "study":
        if args.sft_steps is not None:
            knobs.update(sft_steps=args.sft_steps, sft_steps_per_policy=())
        cfg = StudyConfig(**knobs)
    else:
        cfg = DemoConfig(**knobs, sft_steps=args.sft_steps or 400)
    pol = next(p for p in cfg.policies if p.name == args.policy)
    out = Path(args.out)
    tok_dirs = save_demo_tokenizers(out / "tokenizers", cfg.task(), kinds=(pol.tokenizer,))
    sft_tag = f"sft-{args.preset}{args.sft_steps or ''}"
    sft_dir = out / f"seed{args.seed}" / sft_tag / pol.name
    rep = sft_job(cfg, pol, args.seed, str(tok_dirs[pol.tokenizer]), str(sft_dir))
    print(f"SFT {pol.name}: {json.dumps(rep['accuracy'])}")

    task = cfg.task()
    train_probs = task.problems("train", [pol.family])
    held = task.problems("eval", [pol.family])
    if args.prompts == "all":
        pool = train_probs
    elif args.prompts == "pool":
        pool = [p for p in rl_pool(task, cfg.pool_per_family, cfg.pool_seed_of(args.seed)) if p.family == pol.family]
    else:
        succ = sampled_accuracy(sft_dir, train_probs, 16, cfg.max_new_tokens, args.seed)
        order = sorted(range(len(train_probs)), key=lambda i: (succ[i], train_probs[i].prompt_id))
        # the hardest prompts the policy can still solve sometimes (a prompt it never solves gives GRPO nothing)
        order = [i for i in order if succ[i] > 0] or order
        pool = [train_probs[i] for i in order[: int(args.prompts)]]
        print("pool (sampled success at start, 16 samples):",
              ", ".join(f"{train_probs[i].prompt_id} {succ[i]:.2f}" for i in order[: int(args.prompts)]))
    mapping = run_config(cfg, "grpo", args.seed, {p.name: str(sft_dir) for p in cfg.policies})
    mapping["policies"] = [p for p in mapping["policies"] if p["name"] == pol.name]
    mapping["prompts_per_step"] = min(args.prompts_per_step, len(pool))
    mapping["loss"]["agg"] = args.agg
    mapping["eval"]["every"] = 0
    mapping["eval"]["k"] = 0
    tr = mapping["policies"][0]["train"]
    tr["optimizer"] = args.optimizer
    if args.optimizer != "sgd":
        tr["betas"] = [args.beta1, args.beta2]
        tr["eps"] = args.eps
    tr["lr_groups"] = [{"match": g.rpartition("=")[0], "lr": float(g.rpartition("=")[2])} for g in args.lr_group]
    tag = args.tag or (f"{pol.name}-p{args.prompts}-lr{args.lr:g}-{args.optimizer}-b1{args.beta1:g}-b2{args.beta2:g}-G{args.group_size}"
                       f"-pps{args.prompts_per_step}-{args.agg}-kl{args.kl_coef:g}-s{args.steps}-eps{args.eps:g}-sft{args.sft_steps}"
                       + "".join(f"-{g.replace('*', '').replace('.', '_')}" for g in args.lr_group))
    run_dir = out / f"seed{args.seed}" / (f"{args.preset}-" + tag)
    if run_dir.exists():
        import shutil

        shutil.rmtree(run_dir)
    from mrl_llm.config import config_from_mapping
    from mrl_llm.trainer import train

    t0 = time.perf_counter()
    train(config_from_mapping(mapping), run_dir, problems=pool, eval_problems=pool[:1])
    wall = time.perf_counter() - t0
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r.get("kind") == "train"]
    keys = ("reward_mean", "grad_norm", "clip_fraction", "entropy", "kl_to_ref")
    print("step " + " ".join(f"{k:>13}" for k in keys))
    for r in rows:
        if r["step"] % max(1, len(rows) // 10) == 0 or r is rows[-1]:
            print(f"{r['step']:4d} " + " ".join(f"{(r.get(k) if r.get(k) is not None else float('nan')):13.4f}"
                                                for k in keys))
    n = max(1, len(rows) // 5)
    first = sum(r["reward_mean"] for r in rows[:n]) / n
    last = sum(r["reward_mean"] for r in rows[-n:]) / n
    final = run_dir / "policies" / pol.name
    res = {"tag": tag, "wall_s": round(wall, 1), "reward_first_fifth": first, "reward_last_fifth": last,
           "pool_sampled_start": sum(sampled_accuracy(sft_dir, pool, args.k, cfg.max_new_tokens, 1)) / len(pool),
           "pool_sampled_final": sum(sampled_accuracy(final, pool, args.k, cfg.max_new_tokens, 1)) / len(pool),
           "heldout_greedy_start": greedy(sft_dir, held, cfg.max_new_tokens),
           "heldout_greedy_final": greedy(final, held, cfg.max_new_tokens),
           "heldout_sampled_start": sum(sampled_accuracy(sft_dir, held, args.k, cfg.max_new_tokens, 1)) / len(held),
           "heldout_sampled_final": sum(sampled_accuracy(final, held, args.k, cfg.max_new_tokens, 1)) / len(held)}
    print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in res.items()}))
    with (out / "probe_results.jsonl").open("a") as f:
        f.write(json.dumps({**res, "args": vars(args)}) + "\n")


if __name__ == "__main__":
    main()

