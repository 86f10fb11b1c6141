"""The stages of one policy's RL step at the real pair's shapes, each against its reference in the same process.

For ``--model`` (a prepared directory's ``config.json`` and tokenizer; the weights are NOT loaded: the model is
randomly initialised from the config, so the run needs neither the weights nor their memory, and the response
lengths are forced): the preset's prompts (``--prompts`` ``add`` problems with 3 distinct few-shot examples,
rendered in the model's format by :func:`experiments.real.task_probe.render`), ``--k`` samples each, every
response ``--response-len`` tokens (EOS forced by a logits hook). Timed (wall and process CPU seconds, one
repeat each, after a warm-up call):

* rollouts: the HF engine with every copy prefilled (``share_prompts=False``, the reference) and with each
  distinct prompt prefilled once;
* the no-grad log-prob pass (the reference / snapshot pass) and forward + backward of the update's micro-batches
  (``--micro-batch`` rows; a sum of the response log-probs as the loss), plain (:func:`mrl_llm.logprobs.forward_logprobs`,
  chunked) and with shared prefixes (``share_prefix``), their log-probs and gradients compared;
* one AdamW step (``foreach``, as the trainer's) over the model's parameters.

    OMP_NUM_THREADS=1 python -m experiments.bench.real_step_stages --model models/gemma-3-270m --format plain
"""

from __future__ import annotations

import argparse
import time


def timed(fn):
    w, c = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - w, time.process_time() - c


def prompt_texts(tok, fmt: str, n: int, seed: int) -> list[str]:
    """``n`` few-shot ``add`` prompts (3 examples with distinct answers) rendered in ``fmt`` (``plain`` / ``chat``) by
    :func:`experiments.real.task_probe.render`, the trainer's templates: the benches' prompts."""
    from experiments.real.task_probe import draw_prompts, render

    return [render(tok, fmt, p.with_shots()) for p in draw_prompts("add", n, seed, shots="distinct")]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="a prepared model directory (config.json and tokenizer)")
    ap.add_argument("--format", choices=("chat", "plain"), required=True)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--response-len", type=int, default=8)
    ap.add_argument("--micro-batch", type=int, default=16)
    ap.add_argument("--temperature", type=float, default=0.5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from mrl_llm.logprobs import forward_logprobs, pack
    from mrl_llm.rollout import HFEngine, SamplingConfig

    torch.set_num_threads(args.threads)
    tok = AutoTokenizer.from_pretrained(args.model)
    torch.manual_seed(args.seed)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(args.model))
    texts = prompt_texts(tok, args.format, args.prompts, args.seed)
    prompts = [tok(t, add_special_tokens=args.format == "plain").input_ids for t in texts]
    lens = [len(p) for p in prompts]
    print(f"{args.model}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, random init; "
          f"{args.prompts} prompts of {min(lens)}-{max(lens)} tokens x {args.k} samples x {args.response_len} "
          f"tokens; micro-batches of {args.micro_batch}; {torch.get_num_threads()} thread(s)")
    eos = tok.eos_token_id

    def force(rows, steps, logits):  # every response ends with EOS after response_len tokens, never before
        logits = logits.clone()
        logits[:, eos] = float("-inf")
        end = steps + 1 >= args.response_len
        logits[end] = float("-inf")
        logits[end, eos] = 0.0
        return logits

    sp = SamplingConfig(temperature=args.temperature, max_new_tokens=args.response_len, seed=args.seed)
    rows = []

    def report(label, ref, new, extra=""):
        (_, rw, rc), (_, nw, nc) = ref, new
        rows.append(f"| {label} | {rw:.2f} / {rc:.2f} | {nw:.2f} / {nc:.2f} | x{rc / nc:.2f} |{extra}")

    model.eval()
    outs = {}
    for share in (False, True):
        eng = HFEngine(model, tok, logits_hook=force, share_prompts=share)
        eng.generate(prompts[:1], 2, sp)  # warm-up
        outs[share] = timed(lambda eng=eng: eng.generate(prompts, args.k, sp))
    same = [[s.token_ids for s in o] for o in outs[False][0]] == [[s.token_ids for s in o] for o in outs[True][0]]
    report("rollouts (every copy prefilled / each prompt once)", outs[False], outs[True], f" same tokens: {same} |")
    samples = [s for o in outs[True][0] for s in o]
    P = [prompts[i // args.k] for i in range(len(samples))]
    R = [list(s.token_ids) for s in samples]
    mbs = [range(s, min(len(R), s + args.micro_batch)) for s in range(0, len(R), args.micro_batch)]
    batches = [pack([P[i] for i in g], [R[i] for i in g], tok.pad_token_id or 0) for g in mbs]

    def nograd(share):
        with torch.no_grad():
            return [forward_logprobs(model, b, args.temperature, chunk_size=1024, share_prefix=share)[0] for b in batches]

    nograd(True)  # warm-up
    a, b = timed(lambda: nograd(False)), timed(lambda: nograd(True))
    err = max(float((x - y)[bt.response_mask].abs().max()) for x, y, bt in zip(a[0], b[0], batches, strict=True))
    report("no-grad log-prob pass (reference / snapshot)", a, b, f" largest difference {err:.1e} |")
    model.train()

    def fb(share):
        model.zero_grad(set_to_none=True)
        for bt in batches:
            lp, _ = forward_logprobs(model, bt, args.temperature, with_entropy=True, chunk_size=1024,
                                     share_prefix=share)
            (lp * bt.response_mask).sum().backward()
        return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])

    a, b = timed(lambda: fb(False)), timed(lambda: fb(True))
    gerr = float((a[0] - b[0]).abs().max())
    report("update forward + backward", a, b, f" largest gradient difference {gerr:.1e} (largest entry "
           f"{float(a[0].abs().max()):.1e}) |")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, foreach=True)
    opt.step()  # the state's allocation
    _, ow, oc = timed(opt.step)
    print("| stage | reference wall / CPU s | new wall / CPU s | CPU ratio | |\n|---|---|---|---|---|")
    print("\n".join(rows))
    print(f"| AdamW step (foreach) | | {ow:.2f} / {oc:.2f} | | |")


if __name__ == "__main__":
    main()
