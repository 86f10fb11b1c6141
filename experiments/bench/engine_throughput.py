"""Rollout throughput: the vLLM engine against the HF engine on the same tiny model and prompts.

One run builds a Qwen2-shaped model from config (the Qwen1.5 tokenizer's vocabulary, head_dim 64),
samples ``--prompts x --n`` responses of up to ``--max-new-tokens`` with each engine (same seed and
settings, after one warm-up call each) and prints generated tokens per second for both and their
ratio. The HF engine is measured first, before vLLM is imported, so neither disturbs the other; the
vLLM engine's start-up time is printed separately (it is paid once per run, not per step).

    PYTHONPATH=. python experiments/bench/engine_throughput.py [--hidden 256 --layers 4 ...]
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


def build_model(tok, hidden: int, layers: int, seed: int):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    heads = max(1, hidden // 64)
    cfg = Qwen2Config(vocab_size=151936, hidden_size=hidden, intermediate_size=2 * hidden,
                      num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=max(1, heads // 2),
                      max_position_embeddings=1024, eos_token_id=tok.eos_token_id, bos_token_id=tok.eos_token_id,
                      tie_word_embeddings=False)
    return Qwen2ForCausalLM(cfg).float().eval()


def measure(engine, prompts, n, sp, repeats: int) -> tuple[float, int]:
    """Median tokens/s over ``repeats`` timed calls (after one warm-up call) and tokens per call."""
    from mrl_llm.rollout import SamplingConfig

    engine.generate(prompts[:2], 2, SamplingConfig(max_new_tokens=4, seed=0))
    rates, tokens = [], 0
    for r in range(repeats):
        t0 = time.perf_counter()
        out = engine.generate(prompts, n, SamplingConfig(temperature=sp.temperature, max_new_tokens=sp.max_new_tokens,
                                                         seed=sp.seed + r))
        dt = time.perf_counter() - t0
        tokens = sum(len(s.token_ids) for g in out for s in g)
        rates.append(tokens / dt)
    return statistics.median(rates), tokens


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
    args = ap.parse_args(argv)

    from transformers import AutoTokenizer

    from mrl_llm.rollout import SamplingConfig, make_engine

    tok = AutoTokenizer.from_pretrained(str(find_tokenizer(args.tokenizer_dir)))
    model = build_model(tok, args.hidden, args.layers, args.seed)
    texts = ["Compute 17 * 23.", "What is the derivative of x^3?", "Solve 2x + 5 = 11.", "Factor x^2 - 9.",
             "How many primes are below 30?", "Simplify 12/18.", "Find the area of a unit circle.",
             "What is 2^10?"]
    prompts = [tok(texts[i % len(texts)])["input_ids"] for i in range(args.prompts)]
    sp = SamplingConfig(temperature=1.0, max_new_tokens=args.max_new_tokens, seed=args.seed)
    print(f"model: Qwen2 hidden={args.hidden} layers={args.layers} vocab=151936 "
          f"({sum(p.numel() for p in model.parameters()) / 1e6:.1f}M params, fp32); "
          f"{args.prompts} prompts x {args.n} samples x <= {args.max_new_tokens} tokens; "
          f"torch threads {torch.get_num_threads()}", flush=True)

    hf = make_engine("hf", model=model, tokenizer=tok, max_batch_size=args.prompts * args.n)
    hf_rate, hf_tokens = measure(hf, prompts, args.n, sp, args.repeats)
    print(f"hf   : {hf_rate:9.1f} tokens/s ({hf_tokens} tokens per call)", flush=True)

    with tempfile.TemporaryDirectory(prefix="mrl-bench-") as d:
        model.save_pretrained(d)
        tok.save_pretrained(d)
        t0 = time.perf_counter()
        vl = make_engine("vllm", model_dir=d, dtype="float32", seed=args.seed,
                         max_model_len=max(len(p) for p in prompts) + args.max_new_tokens + 8,
                         engine_args={"max_num_seqs": args.prompts * args.n})
        start = time.perf_counter() - t0
        try:
            vl_rate, vl_tokens = measure(vl, prompts, args.n, sp, args.repeats)
        finally:
            vl.close()
    print(f"vllm : {vl_rate:9.1f} tokens/s ({vl_tokens} tokens per call; engine start {start:.1f} s)")
    faster = "vllm" if vl_rate > hf_rate else "hf"
    print(f"ratio vllm/hf: {vl_rate / hf_rate:.2f}  -> faster on this machine: {faster}")


if __name__ == "__main__":
    sys.exit(main())
