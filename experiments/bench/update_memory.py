"""Peak memory and real tokens/s of one policy update: fixed-row micro-batches against token budget + chunking.

One update (:func:`mrl_llm.update.run_update`, GRPO loss with a k3 KL to a reference model, AdamW) on a
tiny-width Qwen2-style model (2 layers, hidden 64) with the **real Qwen vocabulary** (the size of
``../shared/tokenizers/qwen1.5``, 151,646 tokens), on a batch of rows with long-tailed response lengths
(log-normal, clipped to [16, --max-response], the longest exactly --max-response; default 1536) and prompts of 32-128
tokens. Two variants, each in its **own subprocess** (so one's allocations cannot hide the other's):

* ``rows``   — today's path: micro-batches of ``--micro-batch`` rows in batch order, each padded to its
  longest row, full-vocabulary logits for the whole micro-batch (``logprob_chunk = None``);
* ``budget`` — ``max_tokens_per_micro_batch = --budget`` (:mod:`mrl_llm.micro_batches`, longest first)
  and log-probs in checkpointed chunks of ``--chunk`` positions (:mod:`mrl_llm.logprobs`).

Peak memory is the child's peak RSS during the update minus its RSS just before it (``ru_maxrss`` after
the update - ``/proc/self/statm`` before; tracemalloc does not see torch's allocations). Throughput is
real (unpadded) prompt + response tokens per second of update wall time. The same rows, weights and
seed in both; the gradient is the same (tests/llm/test_micro_batches.py). Prints both beside each
other and the ratios budget / rows (target: peak <= 0.5x at >= 0.9x tokens/s).

Measured (2 cores shared with other jobs, so the times are long and noisy; the ratios come from one run):
``--rows 16 --max-response 1536 --micro-batch 1`` (responses 16-1536 tokens, median 155): rows path peak
5402 MiB, 27 real tok/s; budget 4096 + chunk 256 peak 995 MiB, 36 real tok/s (padded/real 1.57) —
**0.18x peak memory at 1.37x tokens/s**, same loss to 6 digits. With ``--rows 8 --max-response 512
--micro-batch 2``: 0.22x at 1.29x. ``--rows 16 --max-response 2048 --micro-batch 1`` (the issue's 2k
responses; idle machine, 2 threads): rows path peak 7188 MiB, 112 real tok/s; budget 4096 + chunk 256 peak
876 MiB, 143 real tok/s — **0.12x peak memory at 1.28x tokens/s**, same loss. 2048 is not the default
because today's path alone then needs about 7 GiB (five fp32 ``[positions, 151646]`` tensors alive at once,
1.2 GB each for one 2k row): that is the memory this module removes.

    PYTHONPATH=. python experiments/bench/update_memory.py [--rows 16] [--max-response 1536] [--micro-batch 1]
        [--budget 4096] [--chunk 256] [--repeats 1] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
QWEN_TOKENIZER = "tokenizers/qwen1.5"


def lengths(rows: int, max_response: int, seed: int) -> tuple[list[int], list[int]]:
    """``(prompt lengths, response lengths)``: long-tailed responses, the longest exactly ``max_response``."""
    import numpy as np

    rng = np.random.default_rng(seed)
    resp = np.clip(np.round(np.exp(rng.normal(5.0, 1.0, rows))), 16, max_response).astype(int)
    resp[int(rng.integers(rows))] = max_response
    prompts = rng.integers(32, 129, rows)
    return prompts.tolist(), resp.tolist()


def rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def child(args: argparse.Namespace) -> dict:
    """One variant's update, measured in this process (module docstring)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from mrl_llm.batch import TrainBatch
    from mrl_llm.precision import lowp_copy
    from mrl_llm.update import run_update
    from shared_interfaces.regimes.config import LossConfig
    from shared_interfaces.regimes.rows import LearnerRows

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cfg = AutoConfig.for_model("qwen2", vocab_size=args.vocab, hidden_size=64, intermediate_size=128,
                               num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                               max_position_embeddings=4096, tie_word_embeddings=True)
    model = AutoModelForCausalLM.from_config(cfg).float().train()
    ref = lowp_copy(model, torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    p_lens, r_lens = lengths(args.rows, args.max_response, args.seed)
    g = torch.Generator().manual_seed(args.seed)
    prompts = [torch.randint(1, args.vocab, (n,), generator=g).tolist() for n in p_lens]
    responses = [torch.randint(1, args.vocab, (n,), generator=g).tolist() for n in r_lens]
    mu = [torch.empty(n).uniform_(-8.0, -0.1, generator=g).tolist() for n in r_lens]
    n = args.rows
    yes, no = torch.ones(n, dtype=torch.bool), torch.zeros(n, dtype=torch.bool)
    rows = LearnerRows(src=torch.arange(n), prompt=torch.arange(n), pg_mask=yes, sgt_mask=no, own_mask=yes, use_mu=no,
                       advantages=torch.randn(n, generator=g, dtype=torch.float64),
                       sample_weight=torch.ones(n, dtype=torch.float64), sgt_gate=no, sgt_weight=0.0, ratio_cap=2.0,
                       denominator=None)
    batch = TrainBatch(rows=rows, prompts=prompts, responses=responses, mu=mu,
                       lengths=torch.tensor([len(r) for r in responses]))
    kw = ({"micro_batch": args.micro_batch} if args.variant == "rows" else
          {"micro_batch": args.micro_batch, "max_tokens": args.budget, "logprob_chunk": args.chunk})
    times, peaks = [], []
    for _ in range(args.repeats):
        before = rss_bytes()
        t0 = time.perf_counter()
        res = run_update(model, opt, batch, loss_cfg=LossConfig(kl_coef=0.001), temperature=1.0, grad_accum=None,
                         grad_clip=1.0, pad_id=0, ref_model=ref, **kw)
        times.append(time.perf_counter() - t0)
        peaks.append(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before)
    return {"variant": args.variant, "update_s": min(times), "peak_delta_bytes": max(peaks),
            "real_tokens": res.seq_tokens, "padded_tokens": res.padded_tokens,
            "tokens_per_s": res.seq_tokens / min(times), "padding_waste": res.metrics["padding_waste"],
            "loss": res.metrics["loss"], "kw": {k: v for k, v in kw.items()}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--max-response", type=int, default=1536)
    ap.add_argument("--micro-batch", type=int, default=1, help="rows per micro-batch on today's path")
    ap.add_argument("--budget", type=int, default=4096, help="padded tokens per micro-batch (budget variant)")
    ap.add_argument("--chunk", type=int, default=256, help="positions per log-prob chunk (budget variant)")
    ap.add_argument("--repeats", type=int, default=1, help="updates per variant (best time, largest peak)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--vocab", type=int, default=None, help="vocabulary size (default: the Qwen1.5 tokenizer's)")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--variant", choices=["rows", "budget"], help=argparse.SUPPRESS)  # the child's
    args = ap.parse_args(argv)
    if args.variant:
        print(json.dumps(child(args)))
        return 0
    if args.vocab is None:
        from mrl_llm.config import find_shared_dir
        from mrl_llm.models import load_tokenizer_dir

        shared = find_shared_dir()
        if shared is None:
            print("update_memory: ../shared/tokenizers not found; set MRL_SHARED_DIR or pass --vocab", file=sys.stderr)
            return 2
        args.vocab = len(load_tokenizer_dir(shared / QWEN_TOKENIZER))
    if args.budget < 128 + args.max_response:
        print(f"update_memory: --budget {args.budget} is below the longest row (128 + {args.max_response})",
              file=sys.stderr)
        return 2
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS=str(args.threads))
    out = {}
    for variant in ("rows", "budget"):
        cmd = [sys.executable, __file__, "--variant", variant, "--vocab", str(args.vocab)] + [
            f"--{k.replace('_', '-')}={getattr(args, k)}" for k in
            ("rows", "max_response", "micro_batch", "budget", "chunk", "repeats", "threads", "seed")]
        res = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        if res.returncode != 0:
            print(res.stderr[-3000:], file=sys.stderr)
            return 1
        out[variant] = json.loads(res.stdout.strip().splitlines()[-1])
    p_lens, r_lens = lengths(args.rows, args.max_response, args.seed)
    print(f"one update, {args.rows} rows, vocabulary {args.vocab}, responses {min(r_lens)}-{max(r_lens)} tokens "
          f"(median {sorted(r_lens)[len(r_lens) // 2]}), prompts {min(p_lens)}-{max(p_lens)}, {args.threads} thread(s)")
    print(f"{'variant':<44}{'peak MiB':>10}{'update s':>10}{'real tok/s':>12}{'padded/real':>13}")
    labels = {"rows": f"rows: micro_batch {args.micro_batch}, unchunked",
              "budget": f"budget: {args.budget} tokens, chunk {args.chunk}"}
    for v, r in out.items():
        print(f"{labels[v]:<44}{r['peak_delta_bytes'] / 2**20:10.0f}{r['update_s']:10.2f}{r['tokens_per_s']:12.0f}"
              f"{r['padding_waste']:13.2f}")
    mem = out["budget"]["peak_delta_bytes"] / out["rows"]["peak_delta_bytes"]
    tps = out["budget"]["tokens_per_s"] / out["rows"]["tokens_per_s"]
    print(f"budget / rows: peak memory {mem:.2f}x (target <= 0.5x), real tokens/s {tps:.2f}x (target >= 0.9x); "
          f"loss {out['rows']['loss']:.6f} vs {out['budget']['loss']:.6f}")
    out["ratios"] = {"peak_memory": mem, "tokens_per_s": tps}
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
