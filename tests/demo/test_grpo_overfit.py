"""GRPO must be able to overfit one prompt: from an SFT start that solves it sometimes, the real trainer
(one policy, one prompt, ``grpo``) drives that prompt's sampled success to ~1. The sign, the advantages,
the masks and the optimizer wiring of the whole update path are exercised; a sign error or a loss that
ignores the advantages fails it (see experiments/study/README.md for the measured runs behind it)."""

from __future__ import annotations

import json
from dataclasses import replace

from mrl_llm.demo.setup import POLICIES, DemoConfig, run_config
from mrl_llm.demo.sft import ArchSize
from mrl_llm.rewards.arithmetic import Family

FAMILIES = (Family("add", "+", (0, 9), (0, 9)), Family("sub", "-", (0, 9), (0, 9), b_le_a=True))


def _sampled_success(pdir, problems, k, seed):
    from experiments.study.grpo_probe import sampled_accuracy

    return sampled_accuracy(pdir, problems, k, 12, seed)


def test_grpo_drives_one_prompt_to_success(tmp_path):
    from mrl_llm.config import config_from_mapping
    from mrl_llm.demo.run import sft_job
    from mrl_llm.demo.tokenizers import save_demo_tokenizers
    from mrl_llm.trainer import train

    pol = replace(POLICIES[1], size=ArchSize(hidden=64, layers=2, heads=4, kv_heads=4))
    cfg = DemoConfig(families=FAMILIES, policies=(POLICIES[0], pol), sft_steps=120, sft_batch=32, steps=150,
                     group_size=8, lr=3e-4, regimes=("grpo",))
    toks = save_demo_tokenizers(tmp_path / "tok", cfg.task(), kinds=(pol.tokenizer,))
    sft_dir = tmp_path / "sft"
    sft_job(cfg, pol, 0, str(toks[pol.tokenizer]), str(sft_dir))
    train_probs = cfg.task().problems("train", [pol.family])
    succ = _sampled_success(sft_dir, train_probs, 16, 0)
    mid = [i for i, s in enumerate(succ) if 0.15 <= s <= 0.6]
    assert mid, f"no training prompt with intermediate success after the SFT: {sorted(succ)}"
    prob = train_probs[min(mid, key=lambda i: (abs(succ[i] - 0.35), train_probs[i].prompt_id))]
    start = succ[train_probs.index(prob)]

    mapping = run_config(cfg, "grpo", 0, {p.name: str(sft_dir) for p in cfg.policies})
    mapping["policies"] = [p for p in mapping["policies"] if p["name"] == pol.name]
    mapping.update(prompts_per_step=1, eval={"every": 0, "k": 0, "max_prompts": None, "max_new_tokens": 12})
    run = tmp_path / "run"
    train(config_from_mapping(mapping), run, problems=[prob], eval_problems=[prob])
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    rewards = [r["reward_mean"] for r in rows if r.get("kind") == "train"]
    final = _sampled_success(run / "policies" / pol.name, [prob], 32, 1)[0]
    assert sum(rewards[-10:]) / 10 >= 0.9 and final >= 0.9, (prob.prompt_id, start, rewards, final)
