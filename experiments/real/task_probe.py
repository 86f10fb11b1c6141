"""Probe: on which task can SmolLM2-135M-Instruct and Gemma-3-270M learn from each other?

A candidate is (task, few-shot examples, prompt format, temperature). For each model and candidate this samples
``k`` responses to each of ``--prompts`` prompts (the same prompts for both models) and scores them with the
project's arithmetic verifier (the last ``\\boxed{}`` must hold the gold integer; a response ends at its first newline
or EOS, as a trainer stopping there would see it). Rows go to a JSONL file (one per model x candidate, with every
prompt's number of right samples); a candidate already there is not sampled again, so a run can be resumed or
widened. ``--table`` prints the pair table of a file.

Samplers (``--sampler``), both plain ancestral sampling from ``softmax(logits / T)`` over the full vocabulary (no
top-k / top-p), stopping at a token that holds a newline or EOS: ``loop`` (the default), a hand-written loop that
prefills each prompt once and repeats its KV cache ``k`` times; ``engine``, the trainer's
:class:`mrl_llm.rollout.hf_engine.HFEngine` (continuous batching, draws on the device), which prefills each of the
``k`` copies of a prompt and so measured about 2x slower here (``--bench``; experiments/real/README.md).

The criterion (issue 41, item 2): each model's sampled accuracy in [5 %, 60 %], and each solves (>= 1 of k right)
at least 15 % of the prompts the other solves none of.

Tasks are arithmetic families (:class:`mrl_llm.rewards.arithmetic.Family`, every pair of the operand ranges) or a
mix of them, ``add+mul``: ``--prompts`` split evenly over the families (the first ones get the remainder), each
family's share drawn with ``random.Random("<seed>:<family>")`` exactly as a single-family task draws it:

    add     a + b, a, b in 0..19 (400)   sub   a - b, 0 <= b <= a <= 19 (210)   mul   a * b, a in 0..9, b in 0..19 (200)
    add2    a + b, a, b in 10..99 (8100) mul1  a * b, a, b in 2..9 (64)

Few-shot examples (``--shots``), 3 per prompt, always of the prompt's own family and never among the prompts:
``fixed`` -- 3 drawn with the prompts, the same for every prompt of the family; ``distinct`` -- per prompt, 3 whose
answers differ from each other and from the prompt's answer (a model that copies an example's answer is then
always wrong), drawn by the trainer's :func:`mrl_llm.data.shots.draw_shots` (``random.Random("<seed>:<prompt
id>")``) from the family's problems that are not prompts.

Formats, rendered by the trainer's :class:`mrl_llm.templates.PromptTemplate` (:data:`FORMATS`): ``plain`` --
"Q: What is 12+7?\\nA: \\boxed{19}" per example, then the question and "A:" (both models); ``chat`` -- the same
pairs as earlier user / assistant turns of the model's chat template (SmolLM2 only; Gemma-3-270M is a base model
without one).

    python -m experiments.real.task_probe --models-dir models --tasks add,add+mul --shots fixed,distinct \\
        --formats plain,chat --temperatures 0.5,1.0 --prompts 50 --out experiments/real/screen.jsonl
    python -m experiments.real.task_probe --table experiments/real/screen.jsonl
    python -m experiments.real.task_probe --models-dir models --bench 20   # engine vs loop, printed
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

from mrl_llm.data.problem import Problem
from mrl_llm.data.shots import FewShotConfig, ShotsError, draw_shots
from mrl_llm.rewards.arithmetic import Family, arithmetic_reward
from mrl_llm.rollout.base import newline_token_ids
from mrl_llm.templates import PromptTemplate, TemplateConfig

TASKS: dict[str, Family] = {
    "add": Family("add", "+", (0, 19), (0, 19)),
    "sub": Family("sub", "-", (0, 19), (0, 19), b_le_a=True),
    "mul": Family("mul", "*", (0, 9), (0, 19)),
    "add2": Family("add2", "+", (10, 99), (10, 99)),
    "mul1": Family("mul1", "*", (2, 9), (2, 9)),
}
MODELS = ("smollm2-135m-instruct", "gemma-3-270m")
SHOTS = 3
SHOT_MODES = ("fixed", "distinct")
ACC_RANGE, EXCLUSIVE_MIN = (0.05, 0.60), 0.15
#: The prompt formats as trainer templates (``experiments/configs/real_cpu.yaml`` uses the same two).
FORMATS = {"plain": TemplateConfig(text="Q: {question}\nA:", chat="never"),
           "chat": TemplateConfig(text="{question}", chat="require")}


@dataclass(frozen=True)
class Prompt:
    """One prompt: its problem and its few-shot examples (problems of the same family, none of them a prompt)."""

    problem: Problem
    shots: tuple[Problem, ...]

    def with_shots(self) -> Problem:
        """The problem carrying its examples, as the trainer's templates render it."""
        return replace(self.problem, shots=self.shots)


def families_of(task: str) -> list[str]:
    """The families of a task name: ``"add"`` -> ``["add"]``, ``"add+mul"`` -> ``["add", "mul"]``."""
    names = task.split("+")
    unknown = [n for n in names if n not in TASKS]
    if unknown or not task:
        raise SystemExit(f"task {task!r}: unknown family {unknown or ['']}; use one of {sorted(TASKS)} or a mix "
                         "such as add+mul")
    if len(set(names)) < len(names):
        raise SystemExit(f"task {task!r} names a family twice; name each once (add+mul)")
    return names


def draw_prompts(task: str, n: int, seed: int, shots: str = "fixed") -> list[Prompt]:
    """``n`` prompts of ``task`` (module docstring: the split over families, the draw, the ``shots`` modes)."""
    if shots not in SHOT_MODES:
        raise SystemExit(f"unknown --shots {shots!r}; use one of {', '.join(SHOT_MODES)}")
    names = families_of(task)
    out: list[Prompt] = []
    for i, name in enumerate(names):
        n_f = n // len(names) + (i < n % len(names))
        problems = [TASKS[name].problem(a, b) for a, b in TASKS[name].pairs()]
        if n_f + SHOTS > len(problems):
            raise SystemExit(f"task {task}: family {name} has {len(problems)} problems, too few for {n_f} prompts "
                             f"and {SHOTS} examples; ask for at most {(len(problems) - SHOTS) * len(names)} prompts")
        drawn = random.Random(f"{seed}:{name}").sample(problems, n_f + SHOTS)
        chosen = drawn[SHOTS:]
        if shots == "fixed":
            out += [Prompt(p, tuple(drawn[:SHOTS])) for p in chosen]
            continue
        taken = {p.prompt_id for p in chosen}
        pool = [p for p in problems if p.prompt_id not in taken]
        out += [Prompt(p, distinct_shots(p, pool, seed)) for p in chosen]
    return out


def distinct_shots(problem: Problem, pool: list[Problem], seed: int) -> tuple[Problem, ...]:
    """``SHOTS`` problems of ``pool`` whose answers differ from each other and from ``problem``'s, drawn as the
    trainer draws them (:func:`mrl_llm.data.shots.draw_shots`, mode ``distinct``, ``seed``); a ``SystemExit``
    when the pool holds too few distinct answers."""
    try:
        return draw_shots(problem, pool, FewShotConfig(shots=SHOTS, mode="distinct", seed=seed))
    except ShotsError as err:
        raise SystemExit(f"{err} (here: ask for fewer prompts or use --shots fixed)") from None


def render(tok, fmt: str, problem: Problem) -> str | None:
    """The prompt text of ``problem`` (with its examples, ``Problem.shots``) in format ``fmt`` (:data:`FORMATS`,
    the trainer's template); None when the model has no such format (``chat`` without a chat template)."""
    if fmt not in FORMATS:
        raise SystemExit(f"unknown format {fmt!r} (plain, chat)")
    if fmt == "chat" and not tok.chat_template:
        return None
    return PromptTemplate(FORMATS[fmt], tok).render(problem)


def stop_ids(tok) -> list[int]:
    """Token ids whose text holds a newline (:func:`mrl_llm.rollout.base.newline_token_ids`, what the trainer's
    ``sampling.stop_at_newline`` stops on), and EOS: a response ends at the first of them."""
    return sorted(set(newline_token_ids(tok)) | {tok.eos_token_id})


def sample_loop(tok, model, texts: list[str], k: int, temperature: float, max_new_tokens: int, batch_prompts: int,
                special_tokens: bool, stops: list[int], seed: int) -> list[list[str]]:
    """``k`` sampled continuations of each text (``special_tokens`` False: a chat template put them there).

    Plain ancestral sampling at
    ``temperature`` (no top-k / top-p, ``torch.multinomial`` on the global RNG seeded ``seed``), the prompt's
    prefill computed once and its KV cache repeated ``k`` times; a sequence stops at a token of ``stops``, its
    text at the first newline."""
    import torch

    torch.manual_seed(seed)
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


def sample_engine(tok, model, texts: list[str], k: int, temperature: float, max_new_tokens: int, batch_rows: int,
                  special_tokens: bool, stops: list[int], seed: int) -> list[list[str]]:
    """``k`` sampled continuations of each text with the trainer's :class:`HFEngine` (continuous batching, draws on
    the model's device, at most ``batch_rows`` sequences in flight).

    The same distribution as :func:`sample_loop`: ``log_softmax(logits / temperature)`` over the full vocabulary
    (``top_p = 1``; the engine has no top-k), one token at a time; the engine stops a sequence at its EOS ids,
    which here are ``stops`` (every token whose text holds a newline, and EOS) as well, and the text is cut at its
    first newline. Sequence ``j`` is seeded from ``(seed, j)`` (``SamplingConfig.seed``)."""
    from mrl_llm.rollout.base import SamplingConfig
    from mrl_llm.rollout.hf_engine import HFEngine

    engine = HFEngine(model, tok, max_batch_size=batch_rows)
    engine.eos_ids = sorted(set(engine.eos_ids) | set(stops))
    ids = [tok(t, add_special_tokens=special_tokens)["input_ids"] for t in texts]
    groups = engine.generate(ids, k, SamplingConfig(temperature=temperature, top_p=1.0, max_new_tokens=max_new_tokens,
                                                    seed=seed))
    return [[s.text.split("\n", 1)[0] for s in g] for g in groups]


def load(models_dir: str, name: str):
    """``name``'s tokenizer (left padding), model (fp32, eval) and stop ids."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(models_dir) / name
    tok = AutoTokenizer.from_pretrained(path, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return tok, model, stop_ids(tok)


def run_sampler(args: argparse.Namespace, sampler: str, tok, model, texts: list[str], temperature: float,
                special_tokens: bool, stops: list[int]) -> list[list[str]]:
    if sampler == "loop":
        return sample_loop(tok, model, texts, args.k, temperature, args.max_new_tokens, args.batch_prompts,
                           special_tokens, stops, args.seed)
    if sampler == "engine":
        return sample_engine(tok, model, texts, args.k, temperature, args.max_new_tokens, args.batch_rows,
                             special_tokens, stops, args.seed)
    raise SystemExit(f"unknown --sampler {sampler!r}; use engine or loop")


def row_key(r: dict) -> tuple:
    """What identifies a measured candidate (rows written before ``shots`` existed used ``fixed``)."""
    return (r["model"], r["task"], r.get("shots", "fixed"), r["format"], r["temperature"], r["prompts"], r["k"],
            r["seed"])


def family_accuracy(ids: list[str], right: list[int], k: int) -> dict[str, float]:
    """Sampled accuracy per family (the part of a prompt id before ``:``); empty for no prompts."""
    fams: dict[str, list[int]] = {}
    for pid, x in zip(ids, right, strict=True):
        fams.setdefault(pid.split(":", 1)[0], []).append(x)
    return {f: round(sum(xs) / (k * len(xs)), 3) for f, xs in fams.items()}


def measure(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    done = {row_key(r) for r in read_rows(out)}
    for name in args.models.split(","):
        tok = model = stops = None
        for task in args.tasks.split(","):
            for shots in args.shots.split(","):
                prompts = draw_prompts(task, args.prompts, args.seed, shots)
                for fmt in args.formats.split(","):
                    for temp in (float(t) for t in args.temperatures.split(",")):
                        row = {"model": name, "task": task, "shots": shots, "format": fmt, "temperature": temp,
                               "prompts": args.prompts, "k": args.k, "seed": args.seed}
                        if row_key(row) in done:
                            continue
                        if tok is None:
                            tok, model, stops = load(args.models_dir, name)
                        texts = [render(tok, fmt, p.with_shots()) for p in prompts]
                        if texts[0] is None:
                            continue
                        t0 = time.perf_counter()
                        responses = run_sampler(args, args.sampler, tok, model, texts, temp, fmt != "chat", stops)
                        right = [sum(arithmetic_reward(r, p.problem.gold) for r in rs)
                                 for p, rs in zip(prompts, responses, strict=True)]
                        ids = [p.problem.prompt_id for p in prompts]
                        row.update(ids=ids, right=[int(x) for x in right],
                                   seconds=round(time.perf_counter() - t0, 1), threads=args.threads,
                                   sampler=args.sampler, example=responses[0][:2])
                        with out.open("a", encoding="utf-8") as f:
                            f.write(json.dumps(row) + "\n")
                        acc = sum(right) / (args.k * len(right))
                        print(f"{name} {task} {shots} {fmt} T={temp}: accuracy {acc:.3f} "
                              f"{family_accuracy(ids, row['right'], args.k)}, solved "
                              f"{sum(x > 0 for x in right)}/{len(right)}, {row['seconds']} s, e.g. {row['example']!r}",
                              flush=True)


def bench(args: argparse.Namespace) -> None:
    """Both samplers on the first candidate of the arguments at ``--bench`` prompts, each model: times, ratio."""
    import torch

    torch.set_num_threads(args.threads)
    task, shots, fmt = args.tasks.split(",")[0], args.shots.split(",")[0], args.formats.split(",")[0]
    temp = float(args.temperatures.split(",")[0])
    prompts = draw_prompts(task, args.bench, args.seed, shots)
    for name in args.models.split(","):
        tok, model, stops = load(args.models_dir, name)
        model_fmt = fmt if render(tok, fmt, prompts[0].with_shots()) is not None else "plain"
        texts = [render(tok, model_fmt, p.with_shots()) for p in prompts]
        seconds, accs = {}, {}
        for sampler in ("loop", "engine"):
            t0 = time.perf_counter()
            responses = run_sampler(args, sampler, tok, model, texts, temp, model_fmt != "chat", stops)
            seconds[sampler] = time.perf_counter() - t0
            accs[sampler] = sum(arithmetic_reward(r, p.problem.gold) for p, rs in zip(prompts, responses, strict=True)
                                for r in rs) / (args.k * len(prompts))
        print(f"{name} {task} {shots} {model_fmt} T={temp} {args.bench} prompts x {args.k}: loop "
              f"{seconds['loop']:.1f} s (accuracy {accs['loop']:.3f}), engine {seconds['engine']:.1f} s (accuracy "
              f"{accs['engine']:.3f}); loop / engine = {seconds['loop'] / seconds['engine']:.2f}", flush=True)


def read_rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def pair_table(rows: list[dict]) -> list[dict]:
    """One line per (task, shots, temperature, SmolLM2 format, Gemma format, prompts, k, seed) measured for both
    models on the same prompts; empty when there is none."""
    smol = [r for r in rows if r["model"] == MODELS[0]]
    gemma = [r for r in rows if r["model"] == MODELS[1]]
    table = []
    for s in smol:
        for g in gemma:
            if _pairing(s) != _pairing(g) or s["ids"] != g["ids"]:
                continue
            n, k = len(s["ids"]), s["k"]
            s_zero = [i for i in range(n) if g["right"][i] == 0]  # prompts Gemma solves none of
            g_zero = [i for i in range(n) if s["right"][i] == 0]
            line = {"task": s["task"], "shots": s.get("shots", "fixed"), "formats": f"{s['format']}/{g['format']}", "T": s["temperature"],
                    "prompts": n, "k": k,
                    "acc_smol": sum(s["right"]) / (n * k), "acc_gemma": sum(g["right"]) / (n * k),
                    "solved_smol": sum(x > 0 for x in s["right"]) / n, "solved_gemma": sum(x > 0 for x in g["right"]) / n,
                    "smol_only": _frac(s["right"], s_zero), "gemma_only": _frac(g["right"], g_zero),
                    "seconds": f"{s['seconds']:.0f}+{g['seconds']:.0f}"}
            line["qualifies"] = (all(ACC_RANGE[0] <= line[a] <= ACC_RANGE[1] for a in ("acc_smol", "acc_gemma"))
                                 and min(line["smol_only"], line["gemma_only"]) >= EXCLUSIVE_MIN)
            table.append(line)
    return table


def _pairing(r: dict) -> tuple:
    """What two models' rows must share to be paired: the candidate less the model and its format."""
    key = row_key(r)
    return key[1:3] + key[4:]


def _frac(right: list[int], among: list[int]) -> float:
    """The fraction of the prompts ``among`` with at least one right sample (0 when there are none)."""
    return sum(right[i] > 0 for i in among) / len(among) if among else 0.0


HEADER = ("| task | shots | formats (SmolLM2/Gemma) | T | prompts x k | accuracy SmolLM2 | accuracy Gemma | solved SmolLM2 "
          "| solved Gemma | SmolLM2 solves of Gemma's 0/k | Gemma solves of SmolLM2's 0/k | s (S+G) | qualifies |")


def table_lines(table: list[dict]) -> list[str]:
    """:func:`pair_table` as Markdown (header and rule first); no lines for an empty table."""
    if not table:
        return []
    lines = [HEADER, "|---" * HEADER.count(" | ") + "|---|"]
    for t in table:
        lines.append(f"| {t['task']} | {t['shots']} | {t['formats']} | {t['T']} | {t['prompts']} x {t['k']} | "
                     f"{t['acc_smol']:.3f} | {t['acc_gemma']:.3f} | {t['solved_smol']:.2f} | {t['solved_gemma']:.2f} | "
                     f"{t['smol_only']:.2f} | {t['gemma_only']:.2f} | {t['seconds']} | "
                     f"{'yes' if t['qualifies'] else 'no'} |")
    return lines


def print_table(path: Path) -> None:
    lines = table_lines(pair_table(read_rows(path)))
    print("\n".join(lines) if lines else f"{path}: no candidate measured for both models yet")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models-dir", default="models", help="where `python -m mrl_llm models prepare` wrote them")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--tasks", default="add,sub,mul")
    ap.add_argument("--shots", default="fixed", help="few-shot examples: fixed, distinct (module docstring)")
    ap.add_argument("--formats", default="plain,chat")
    ap.add_argument("--temperatures", default="0.5,1.0")
    ap.add_argument("--prompts", type=int, default=50)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-new-tokens", type=int, default=10)
    ap.add_argument("--sampler", default="loop", help="loop (prefill once, KV cache x k) or engine (HFEngine)")
    ap.add_argument("--batch-prompts", type=int, default=25, help="loop: prompts per prefill (x k sequences)")
    ap.add_argument("--batch-rows", type=int, default=200, help="engine: the most sequences in flight")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="experiments/real/probe.jsonl")
    ap.add_argument("--table", metavar="JSONL", help="print the pair table of a probe file and exit")
    ap.add_argument("--bench", type=int, metavar="N", help="time both samplers on the first candidate at N prompts "
                    "(nothing written) and exit")
    args = ap.parse_args(argv)
    if args.table:
        print_table(Path(args.table))
        return
    if args.prompts < 1 or args.k < 1 or (args.bench is not None and args.bench < 1):
        sys.exit("--prompts, --k and --bench must be at least 1")
    for name in args.models.split(","):
        if not (Path(args.models_dir) / name / "config.json").is_file():
            sys.exit(f"{Path(args.models_dir) / name} is not prepared; run python -m mrl_llm models prepare "
                     f"--out {args.models_dir}")
    for task in args.tasks.split(","):  # a bad task or shots mode fails here, before a model loads
        for shots in args.shots.split(","):
            draw_prompts(task, args.prompts if args.bench is None else args.bench, args.seed, shots)
    if args.bench is not None:
        bench(args)
    else:
        measure(args)


if __name__ == "__main__":
    main()
