"""The HF engine against ``transformers``' ``generate`` on one tiny-width, real-vocabulary model (CPU).

Both sample the same rows (prompts from the Qwen1.5 tokenizer, a 2-layer Qwen2 of ``--hidden`` width with the
full 151,936-entry vocabulary, fp32) at temperature 1 without top-k/top-p, and both return the sampled tokens'
log-probs: the engine records them; ``generate`` returns every step's scores (``output_scores``), from which
the log-probs of the sampled tokens are computed (inside the timing); ``generate-stream`` instead keeps one
step's log-softmax in a ``LogitsProcessor`` and gathers the sampled token's at the next step (no
``[T, B, V]`` scores: a leaner reference than the documented API). EOS is forced on one long-tailed length
schedule (``--long-every``-th row runs to ``--max-new-tokens``, the others end after 2..``--short`` tokens):
a ``LogitsProcessor`` for ``generate``, the engine's ``logits_hook`` for the engine, the same masking
(EOS is -inf before a row's scheduled end, the only choice at it). Each side runs in its own subprocess:
after one warm-up call it resets the kernel's peak-RSS mark (``/proc/self/clear_refs``), and reports the
growth of the peak RSS over the RSS before the first timed call, and the median tokens/s of ``--repeats``
calls (tokens: those kept, up to and including EOS; both keep the same number).

    PYTHONPATH=. python experiments/bench/hf_engine_vs_generate.py [--rows 24 --max-new-tokens 96 ...]

Results: ``experiments/bench/README.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
TEXTS = ["Compute 17 * 23.", "What is the derivative of x^3?", "Solve 2x + 5 = 11.", "Factor x^2 - 9.",
         "How many primes are below 30?", "Simplify 12/18.", "Find the area of a unit circle.", "What is 2^10?"]


def schedule(rows: int, limit: int, short: int, long_every: int, seed: int) -> list[int]:
    """Each row's length (EOS included): ``limit`` for every ``long_every``-th row, else 2..``short``."""
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(2, short + 1, (rows,), generator=g).tolist()
    return [limit if k % long_every == 0 else min(n, limit) for k, n in enumerate(lens)]


def _status_kib(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {key}; this benchmark needs Linux")


def _rss_window(fn):
    """``fn()``'s result and the growth of the peak RSS over the RSS before it (bytes)."""
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
    base = _status_kib("VmRSS")
    out = fn()
    return out, (_status_kib("VmHWM") - base) * 1024


def child(args) -> dict:
    from transformers import AutoTokenizer, GenerationConfig, LogitsProcessor, LogitsProcessorList

    from experiments.bench.engine_throughput import build_model, find_tokenizer
    from mrl_llm.rollout import HFEngine, SamplingConfig

    torch.set_num_threads(args.threads)
    tok = AutoTokenizer.from_pretrained(str(find_tokenizer(args.tokenizer_dir)))
    model = build_model(tok, args.hidden, args.layers, args.seed)
    eos, pad = int(tok.eos_token_id), int(tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id)
    prompts = [tok(TEXTS[k % len(TEXTS)])["input_ids"] for k in range(args.rows)]
    sched = torch.tensor(schedule(args.rows, args.max_new_tokens, args.short, args.long_every, args.seed))

    def force(rows: torch.Tensor, steps: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        logits = logits.clone()
        logits[:, eos] = float("-inf")
        end = steps + 1 == sched[rows]
        logits[end] = float("-inf")
        logits[end, eos] = 0.0
        return logits

    if args.child == "engine":
        eng = HFEngine(model, tok, max_batch_size=args.rows, logits_hook=force)

        def run(k: int) -> tuple[int, float]:
            out = eng.generate(prompts, 1, SamplingConfig(max_new_tokens=args.max_new_tokens, seed=args.seed + k))
            lps = [lp for o in out for lp in o[0].logprobs]
            assert [len(o[0].token_ids) for o in out] == sched.tolist() and all(x <= 0 for x in lps)
            return len(lps), sum(lps)

        warm = lambda: HFEngine(model, tok, max_batch_size=2).generate(  # noqa: E731
            prompts[:2], 1, SamplingConfig(max_new_tokens=2, seed=0))
    else:
        L = max(len(p) for p in prompts)
        ids = torch.tensor([[pad] * (L - len(p)) + p for p in prompts])
        attn = torch.tensor([[0] * (L - len(p)) + [1] * len(p) for p in prompts])

        class ForceEOS(LogitsProcessor):
            def __call__(self, input_ids, scores):
                steps = torch.full((scores.shape[0],), input_ids.shape[1] - L)
                return force(torch.arange(scores.shape[0]), steps, scores)

        class Record(LogitsProcessor):
            """``--generate-logprobs stream``: the previous step's sampled tokens' log-probs, one step kept."""

            def __init__(self) -> None:
                self.prev, self.lps = None, []

            def take(self, tok: torch.Tensor) -> None:
                self.lps.append(self.prev.gather(-1, tok[:, None]).squeeze(-1))

            def __call__(self, input_ids, scores):
                if self.prev is not None:
                    self.take(input_ids[:, -1])
                self.prev = torch.log_softmax(scores.float(), -1)
                return scores

        stream = args.child == "generate-stream"
        def cfg(new: int) -> GenerationConfig:
            return GenerationConfig(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, eos_token_id=eos,
                                    pad_token_id=pad, return_dict_in_generate=True, output_scores=not stream,
                                    max_new_tokens=new)

        def run(k: int, rows: int = args.rows, new: int = args.max_new_tokens) -> tuple[int, float]:
            torch.manual_seed(args.seed + k)
            rec = Record()
            procs = LogitsProcessorList([ForceEOS(), rec] if stream else [ForceEOS()])
            with torch.no_grad():
                out = model.generate(input_ids=ids[:rows], attention_mask=attn[:rows], generation_config=cfg(new),
                                     logits_processor=procs)
                seq = out.sequences[:, L:]
                if stream:
                    rec.take(seq[:, -1])
                    step_lps = rec.lps
                else:
                    step_lps = [torch.log_softmax(sc.float(), -1).gather(-1, seq[:, t : t + 1]).squeeze(-1)
                                for t, sc in enumerate(out.scores)]
                lps, n = 0.0, 0
                for t, lp in enumerate(step_lps):  # the sampled tokens' log-probs, up to each row's EOS
                    live = (seq[:, :t] != eos).all(1) if t else torch.ones(len(seq), dtype=torch.bool)
                    lps += float(lp[live].sum())
                    n += int(live.sum())
            if rows == args.rows:
                got = [int(((seq == eos).int().cumsum(1) == 0).sum(1)[i]) + 1 for i in range(rows)]
                assert got == sched.tolist(), got
            return n, lps

        warm = lambda: run(0, rows=2, new=2)  # noqa: E731
    warm()
    rates, peak, sums = [], 0, []
    for k in range(args.repeats):
        t0 = time.perf_counter()
        (tokens, lp_sum), grew = _rss_window(lambda k=k: run(k))
        rates.append(tokens / (time.perf_counter() - t0))
        peak, sums = max(peak, grew), [*sums, lp_sum]
    return {"side": args.child, "tokens": tokens, "tokens_per_s": statistics.median(rates), "rss_growth": peak,
            "logprob_sums": sums}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokenizer-dir", default=None)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--rows", type=int, default=24)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--short", type=int, default=12, help="short rows end after 2..SHORT tokens")
    ap.add_argument("--long-every", type=int, default=8, help="every LONG_EVERY-th row runs to the limit")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--child", choices=["engine", "generate", "generate-stream"], help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if min(args.rows, args.max_new_tokens, args.repeats, args.threads, args.long_every) < 1 or args.short < 2:
        ap.error("--rows, --max-new-tokens, --repeats, --threads, --long-every must be >= 1 and --short >= 2")
    if args.child:
        print(json.dumps(child(args)))
        return 0
    sched = schedule(args.rows, args.max_new_tokens, args.short, args.long_every, args.seed)
    print(f"model: Qwen2 hidden={args.hidden} layers={args.layers} vocab=151936 fp32; {args.rows} rows, lengths "
          f"{sorted(sched)} (sum {sum(sched)}); {args.threads} thread(s), median of {args.repeats}", flush=True)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": str(args.threads)}
    got = {}
    for side in ("engine", "generate", "generate-stream"):
        cmd = [sys.executable, str(Path(__file__).resolve()), *(argv if argv is not None else sys.argv[1:]),
               "--child", side]
        res = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
        if res.returncode != 0:
            print(res.stdout + res.stderr, file=sys.stderr)
            return res.returncode
        got[side] = json.loads(res.stdout.strip().splitlines()[-1])
        r = got[side]
        print(f"{side:15s}: {r['tokens_per_s']:8.1f} tokens/s ({r['tokens']} tokens), peak RSS growth "
              f"{r['rss_growth'] / 2**20:8.1f} MiB", flush=True)
    a, b = got["generate"]["logprob_sums"], got["generate-stream"]["logprob_sums"]
    if any(abs(x - y) > 1e-3 * max(1.0, abs(x)) for x, y in zip(a, b, strict=True)):
        raise SystemExit(f"generate's two log-prob paths disagree on the same samples: {a} vs {b}")
    e = got["engine"]
    for side in ("generate", "generate-stream"):
        g = got[side]
        print(f"engine / {side}: throughput {e['tokens_per_s'] / g['tokens_per_s']:.2f}x, peak memory "
              f"{e['rss_growth'] / max(1, g['rss_growth']):.2f}x  (target: >= 1.0x at <= 1.0x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
