"""Measures the trainer's two large-vocabulary hot paths against their plain versions, in one process:

1. the training forward restricted to the response window (``logits_to_keep``) vs the LM head and
   log-softmax over every position (same log-probs, checked);
2. inverse-CDF sampling (:func:`mrl_llm.rollout.hf_engine.sample_from`) vs ``torch.multinomial``.

A tiny 2-layer Qwen2-style model with the Qwen1.5 vocabulary size (151,646) by default.
``python experiments/bench/bench_trainer_hotpaths.py [--vocab N] [--threads N]``; prints the ratios.
"""

from __future__ import annotations

import argparse
import time

import torch


def timed(fn, reps: int) -> float:
    fn()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t) / reps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--vocab", type=int, default=151_646)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from mrl_llm.logprobs import forward_logprobs, pack
    from mrl_llm.rollout.hf_engine import sample_from
    from shared_interfaces.losses import token_logprobs

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=args.vocab, hidden_size=64, intermediate_size=128,
                                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2))
    prompts = [list(range(1, 25 + i)) for i in range(8)]  # ~30-token prompts, 16-token responses
    responses = [list(range(100, 116)) for _ in range(8)]
    batch = pack(prompts, responses, 0)

    def full():
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, :-1]
        lp = token_logprobs(logits, batch.targets)
        lp.sum().backward()
        return lp

    def window():
        lp, _ = forward_logprobs(model, batch)
        lp.sum().backward()
        return lp

    a, b = full().detach(), window().detach()
    m = batch.response_mask
    torch.testing.assert_close(a[m], b[m], atol=1e-5, rtol=0)
    t_full, t_win = timed(full, args.reps), timed(window, args.reps)
    print(f"forward+backward, 8 rows: all positions {t_full * 1e3:.1f} ms, response window {t_win * 1e3:.1f} ms, "
          f"speed-up x{t_full / t_win:.2f}")

    logp = torch.log_softmax(torch.randn(16, args.vocab), -1)
    g = torch.Generator().manual_seed(0)
    t_mult = timed(lambda: torch.multinomial(logp.exp(), 1, generator=g), args.reps * 4)
    t_cdf = timed(lambda: sample_from(logp, g), args.reps * 4)
    print(f"sampling 16 rows: torch.multinomial {t_mult * 1e3:.1f} ms, inverse CDF {t_cdf * 1e3:.1f} ms, "
          f"speed-up x{t_mult / t_cdf:.2f}")


if __name__ == "__main__":
    main()
