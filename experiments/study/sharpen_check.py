"""How much sampled accuracy a policy leaves on the table at temperature 1: scale its final norm's gain by c
(logits x c, i.e. sampling at temperature 1/c for a norm-then-head model) and measure held-out sampled
accuracy. A large gain from this one direction (as many parameters as the hidden width) is reward GRPO
could collect by sharpening alone.

    python -m experiments.study.sharpen_check --policy DIR/seed0/sft400/llama-sub --family sub
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch

from experiments.study.grpo_probe import sampled_accuracy
from mrl_llm.models import load_policy, save_policy
from mrl_llm.rewards import ArithmeticTask


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy", required=True)
    ap.add_argument("--family", required=True)
    ap.add_argument("--families", default="add,sub", help="the task the policy was trained in")
    ap.add_argument("--k", type=int, default=8)
    args = ap.parse_args()
    torch.set_num_threads(1)
    held = ArithmeticTask(families=tuple(args.families.split(","))).problems("eval", [args.family])
    with tempfile.TemporaryDirectory() as tmp:
        for c in (1.0, 1.5, 2.0, 3.0):
            model, tok, meta = load_policy(args.policy)
            norm = getattr(getattr(model, "model", None), "norm", None)
            if norm is None:
                raise SystemExit(f"{args.policy}: no model.norm (final RMSNorm) to scale; a Llama/Qwen2-style policy")
            with torch.no_grad():
                norm.weight.mul_(c)
            d = Path(tmp) / f"x{c}"
            save_policy(model, tok, d, meta)
            acc = sampled_accuracy(d, held, args.k, 12, 1)
            print(f"final-norm gain x{c}: held-out sampled accuracy {sum(acc) / len(acc):.3f} ({len(held)} prompts, "
                  f"{args.k} samples each)")


if __name__ == "__main__":
    main()
