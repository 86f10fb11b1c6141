"""Probe: on which task can SmolLM2-135M-Instruct and Gemma-3-270M learn from each other?

A candidate is (task, prompt format, temperature). For each model and candidate this samples ``k`` responses to
each of ``--prompts`` prompts (the same prompts for both models) with HF ``generate`` and scores them with the
project's arithmetic verifier (the last ``\\boxed{}`` must hold the gold integer; a response ends at its first
newline or EOS, as a trainer stopping there would see it). Rows go to a JSONL file (one per model x candidate, with every
prompt's number of right samples); a candidate already there is not sampled again, so a run can be resumed or
widened. ``--table`` prints the pair table of a file.

The criterion (issue 41, item 2): each model's sampled accuracy in [5 %, 60 %], and each solves (>= 1 of k right)
at least 15 % of the prompts the other solves none of.

Tasks are arithmetic families (:class:`mrl_llm.rewards.arithmetic.Family`: every pair of the operand ranges,
``--prompts`` of them drawn with ``--seed``; 3 more of the same family, not among them, are the few-shot examples):

    add     a + b, a, b in 0..19        sub   a - b, 0 <= b <= a <= 19     mul   a * b, a in 0..9, b in 0..19
    add2    a + b, a, b in 10..99       mul1  a * b, a, b in 2..9 (64: use --prompts <= 61)

Formats: ``plain`` -- "Q: What is 12+7?\\nA: \\boxed{19}" three times, then the question and "A:" (both models);
``chat`` -- the same three pairs as earlier user / assistant turns of the model's chat template (SmolLM2 only;
Gemma-3-270M is a base model without one).

    python -m experiments.real.task_probe --models-dir models --tasks add,sub,mul --formats plain,chat \\
        --temperatures 0.5,1.0 --prompts 50 --out experiments/real/screen.jsonl
    python -m experiments.real.task_probe --table experiments/real/screen.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

from mrl_llm.rewards.arithmetic import Family, arithmetic_reward

TASKS: dict[str, Family] = {
    "add": Family("add", "+", (0, 19), (0, 19)),
    "sub": Family("sub", "-", (0, 19), (0, 19), b_le_a=True),
    "mul": Family("mul", "*", (0, 9), (0, 19)),
    "add2": Family("add2", "+", (10, 99), (10, 99)),
    "mul1": Family("mul1", "*", (2, 9), (2, 9)),
}
MODELS = ("smollm2-135m-instruct", "gemma-3-270m")
SHOTS = 3
ACC_RANGE, EXCLUSIVE_MIN = (0.05, 0.60), 0.15


def prompts_of(task: str, n: int, seed: int) -> tuple[list, list]:
    """``n`` problems of ``task`` and ``SHOTS`` few-shot examples (disjoint), drawn with ``seed``."""
    problems = [TASKS[task].problem(a, b) for a, b in TASKS[task].pairs()]
    if n + SHOTS > len(problems):
        raise SystemExit(f"task {task} has {len(problems)} problems; ask for at most {len(problems) - SHOTS} prompts")
    drawn = random.Random(f"{seed}:{task}").sample(problems, n + SHOTS)
    return drawn[SHOTS:], drawn[:SHOTS]


def render(tok, fmt: str, question: str, shots: list) -> str | None:
    """The prompt text of ``question`` in format ``fmt``; None when the model has no such format."""
    if fmt == "plain":
        return "".join(f"Q: {s.question}\nA: \\boxed{{{s.gold}}}\n\n" for s in shots) + f"Q: {question}\nA:"
    if fmt == "chat":
        if not tok.chat_template:
            return None
        turns = []
        for s in shots:
            turns += [{"role": "user", "content": s.question}, {"role": "assistant", "content": f"\\boxed{{{s.gold}}}"}]
        turns.append({"role": "user", "content": question})
        return tok.apply_chat_template(turns, tokenize=False, add_generation_prompt=True)
    raise SystemExit(f"unknown format {fmt!r} (plain, chat)")


def stop_ids(tok) -> list[int]:
    """Token ids whose text holds a newline, and EOS: a response ends at the first of them."""
    texts = tok.batch_decode([[i] for i in range(len(tok))])
    return sorted({i for i, t in enumerate(texts) if "\n" in t} | {tok.eos_token_id})


def sample(tok, model, texts: list[str], k: int, temperature: float, max_new_tokens: int, batch_prompts: int,
           special_tokens: bool, stops: list[int]) -> list[list[str]]:
    """``k`` sampled continuations of each text (``special_tokens`` False: a chat template put them there).

    Plain ancestral sampling at ``temperature`` (no top-k / top-p), the prompt's prefill computed once and its
    KV cache repeated ``k`` times; a sequence stops at a token of ``stops``, its text at the first newline."""
    import torch

    out: list[list[str]] = []
    stop = torch.tensor(stops)
    for i in range(0, len(texts), batch_prompts):
        chunk = texts[i:i + batch_prompts]
        enc = tok(chunk, return_tensors="pt", padding=True, add_special_tokens=special_tokens)
        attn = enc["attention_mask"]
        with torch.no_grad():
            o = model(input_ids=enc["input_ids"], attention_mask=attn, position_ids=(attn.cumsum(-1) - 1).clamp(min=0),
                      use_cache=True, logits_to_keep=1)
            cache = o.past_key_values
            cache.batch_repeat_interleave(k)
            attn = attn.repeat_interleave(k, 0)
            logits = o.logits[:, -1].repeat_interleave(k, 0)
            done = torch.zeros(len(logits), dtype=torch.bool)
            tokens = []
            for _ in range(max_new_tokens):
                nxt = torch.multinomial(torch.softmax(logits.float() / temperature, -1), 1).squeeze(1)
                nxt = torch.where(done, torch.full_like(nxt, tok.pad_token_id), nxt)
                tokens.append(nxt)
                done = done | torch.isin(nxt, stop)
                if bool(done.all()):
                    break
                attn = torch.cat([attn, torch.ones(len(attn), 1, dtype=attn.dtype)], 1)
                o = model(input_ids=nxt[:, None], attention_mask=attn, past_key_values=cache, use_cache=True,
                          position_ids=attn.sum(-1, keepdim=True) - 1)
                logits = o.logits[:, -1]
        resp = [r.split("\n", 1)[0] for r in tok.batch_decode(torch.stack(tokens, 1), skip_special_tokens=True)]
        out += [resp[j * k:(j + 1) * k] for j in range(len(chunk))]
    return out


def measure(args: argparse.Namespace) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    done = {(r["model"], r["task"], r["format"], r["temperature"], r["prompts"], r["k"], r["seed"])
            for r in read_rows(out)}
    for name in args.models.split(","):
        tok = model = None
        for task in args.tasks.split(","):
            problems, shots = prompts_of(task, args.prompts, args.seed)
            for fmt in args.formats.split(","):
                for temp in (float(t) for t in args.temperatures.split(",")):
                    key = (name, task, fmt, temp, args.prompts, args.k, args.seed)
                    if key in done:
                        continue
                    if tok is None:
                        path = Path(args.models_dir) / name
                        tok = AutoTokenizer.from_pretrained(path, padding_side="left")
                        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
                        stops = stop_ids(tok)
                    texts = [render(tok, fmt, p.question, shots) for p in problems]
                    if texts[0] is None:
                        continue
                    torch.manual_seed(args.seed)
                    t0 = time.perf_counter()
                    responses = sample(tok, model, texts, args.k, temp, args.max_new_tokens, args.batch_prompts,
                                       special_tokens=fmt != "chat", stops=stops)
                    right = [sum(arithmetic_reward(r, p.gold) for r in rs)
                             for p, rs in zip(problems, responses, strict=True)]
                    row = {"model": name, "task": task, "format": fmt, "temperature": temp, "prompts": args.prompts,
                           "k": args.k, "seed": args.seed, "ids": [p.prompt_id for p in problems],
                           "right": [int(x) for x in right], "seconds": round(time.perf_counter() - t0, 1),
                           "threads": args.threads, "example": responses[0][:2]}
                    with out.open("a", encoding="utf-8") as f:
                        f.write(json.dumps(row) + "\n")
                    acc = sum(right) / (args.k * len(right))
                    print(f"{name} {task} {fmt} T={temp}: accuracy {acc:.3f}, solved "
                          f"{sum(x > 0 for x in right)}/{len(right)}, {row['seconds']} s, e.g. {row['example']!r}",
                          flush=True)


def read_rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def pair_table(rows: list[dict]) -> list[dict]:
    """One line per (task, temperature, SmolLM2 format, Gemma format, prompts, k) measured for both models."""
    smol = [r for r in rows if r["model"] == MODELS[0]]
    gemma = [r for r in rows if r["model"] == MODELS[1]]
    table = []
    for s in smol:
        for g in gemma:
            if (s["task"], s["temperature"], s["prompts"], s["k"], s["seed"]) != \
                    (g["task"], g["temperature"], g["prompts"], g["k"], g["seed"]) or s["ids"] != g["ids"]:
                continue
            n, k = len(s["ids"]), s["k"]
            s_zero = [i for i in range(n) if g["right"][i] == 0]  # prompts Gemma solves none of
            g_zero = [i for i in range(n) if s["right"][i] == 0]
            line = {"task": s["task"], "formats": f"{s['format']}/{g['format']}", "T": s["temperature"],
                    "prompts": n, "k": k,
                    "acc_smol": sum(s["right"]) / (n * k), "acc_gemma": sum(g["right"]) / (n * k),
                    "solved_smol": sum(x > 0 for x in s["right"]) / n, "solved_gemma": sum(x > 0 for x in g["right"]) / n,
                    "smol_only": _frac(s["right"], s_zero), "gemma_only": _frac(g["right"], g_zero),
                    "seconds": f"{s['seconds']:.0f}+{g['seconds']:.0f}"}
            line["qualifies"] = (all(ACC_RANGE[0] <= line[a] <= ACC_RANGE[1] for a in ("acc_smol", "acc_gemma"))
                                 and min(line["smol_only"], line["gemma_only"]) >= EXCLUSIVE_MIN)
            table.append(line)
    return table


def _frac(right: list[int], among: list[int]) -> float:
    """The fraction of the prompts ``among`` with at least one right sample (0 when there are none)."""
    return sum(right[i] > 0 for i in among) / len(among) if among else 0.0


def print_table(path: Path) -> None:
    table = pair_table(read_rows(path))
    if not table:
        print(f"{path}: no candidate measured for both models yet")
        return
    print("| task | formats (SmolLM2/Gemma) | T | prompts x k | accuracy SmolLM2 | accuracy Gemma | solved SmolLM2 "
          "| solved Gemma | SmolLM2 solves of Gemma's 0/k | Gemma solves of SmolLM2's 0/k | s (S+G) | qualifies |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for t in table:
        print(f"| {t['task']} | {t['formats']} | {t['T']} | {t['prompts']} x {t['k']} | {t['acc_smol']:.3f} | "
              f"{t['acc_gemma']:.3f} | {t['solved_smol']:.2f} | {t['solved_gemma']:.2f} | {t['smol_only']:.2f} | "
              f"{t['gemma_only']:.2f} | {t['seconds']} | {'yes' if t['qualifies'] else 'no'} |")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models-dir", default="models", help="where `python -m mrl_llm models prepare` wrote them")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--tasks", default="add,sub,mul")
    ap.add_argument("--formats", default="plain,chat")
    ap.add_argument("--temperatures", default="0.5,1.0")
    ap.add_argument("--prompts", type=int, default=50)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-new-tokens", type=int, default=10)
    ap.add_argument("--batch-prompts", type=int, default=25, help="prompts per generate call (x k sequences)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="experiments/real/probe.jsonl")
    ap.add_argument("--table", metavar="JSONL", help="print the pair table of a probe file and exit")
    args = ap.parse_args(argv)
    if args.table:
        print_table(Path(args.table))
        return
    for name in args.models.split(","):
        if not (Path(args.models_dir) / name / "config.json").is_file():
            sys.exit(f"{Path(args.models_dir) / name} is not prepared; run python -m mrl_llm models prepare "
                     f"--out {args.models_dir}")
    measure(args)


if __name__ == "__main__":
    main()
