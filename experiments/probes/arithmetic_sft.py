"""Probe: can a tiny model learn one arithmetic family by a short SFT on CPU, and only that family?

Trains a tiny Llama-style model from scratch (character vocabulary) on the training prompts of one
family of :class:`mrl_llm.rewards.ArithmeticTask` (target :func:`reference_response`, loss on the
response tokens), then prints greedy accuracy per family and split, as scored by the arithmetic
checker. It measures the design goal of the task (each warm-started policy solves its own family
and not the other); it is not the trainer.

    python -m experiments.probes.arithmetic_sft --family add --steps 600
"""

from __future__ import annotations

import argparse
import random
import time

import torch

from mrl_llm.rewards import ArithmeticTask, arithmetic_reward, reference_response

CHARS = sorted(set("What is 0123456789+-*?\n\\boxed{}"))
BOS, EOS = 0, 1
STOI = {c: i + 2 for i, c in enumerate(CHARS)}
ITOS = {i: c for c, i in STOI.items()}


def encode(text: str) -> list[int]:
    return [STOI[c] for c in text]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", default="add")
    ap.add_argument("--families", default="add,mul", help="task families (the trained one included)")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=96)
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--eval-n", type=int, default=80, help="problems scored per family and split")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    from transformers import LlamaConfig, LlamaForCausalLM

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    task = ArithmeticTask(families=tuple(args.families.split(",")), seed=args.seed)
    cfg = LlamaConfig(
        vocab_size=len(CHARS) + 2,
        hidden_size=args.hidden,
        intermediate_size=4 * args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=64,
        bos_token_id=BOS,
        eos_token_id=EOS,
        pad_token_id=EOS,
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(cfg)
    n_params = sum(p.numel() for p in model.parameters())
    train = task.problems("train", [args.family])
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 20) * max(0.05, 1 - s / args.steps)
    )
    rng = random.Random(args.seed)
    start = time.perf_counter()
    for _ in range(args.steps):
        pairs = [
            ([BOS] + encode(p.question + "\n"), encode(reference_response(p)) + [EOS])
            for p in rng.choices(train, k=args.batch)
        ]
        width = max(len(a) + len(b) for a, b in pairs)
        ids = torch.full((args.batch, width), EOS)
        labels = torch.full((args.batch, width), -100)
        mask = torch.zeros((args.batch, width), dtype=torch.long)
        for i, (a, b) in enumerate(pairs):
            ids[i, : len(a) + len(b)] = torch.tensor(a + b)
            labels[i, len(a) : len(a) + len(b)] = torch.tensor(b)
            mask[i, : len(a) + len(b)] = 1
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
    train_s = time.perf_counter() - start

    model.eval()
    print(
        f"family={args.family} params={n_params} steps={args.steps} batch={args.batch} "
        f"train_s={train_s:.1f} final_loss={loss.item():.4f}"
    )
    print(f"{'family':<8}{'split':<7}{'n':>4}{'greedy_acc':>12}")
    for fam in task.family_names:
        for split in ("train", "eval"):
            probs = task.problems(split, [fam])
            probs = random.Random(1).sample(probs, min(args.eval_n, len(probs)))
            ok = 0.0
            with torch.no_grad():
                for p in probs:
                    prompt = torch.tensor([[BOS] + encode(p.question + "\n")])
                    out = model.generate(
                        prompt, max_new_tokens=12, do_sample=False, eos_token_id=EOS, pad_token_id=EOS
                    )
                    text = "".join(ITOS.get(t, "") for t in out[0, prompt.shape[1] :].tolist())
                    ok += arithmetic_reward(text, p.gold)
            print(f"{fam:<8}{split:<7}{len(probs):>4}{ok / len(probs):>12.3f}")


if __name__ == "__main__":
    main()
