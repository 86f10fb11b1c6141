"""GPU smoke run: a reduced paper-like pair trained for a few steps on one GPU; tokens/s and peak memory.

``experiments/gpu/smoke.sh`` runs this from the source tree (``PYTHONPATH``) on a machine that has only
Python, torch and transformers (with their own dependencies: tokenizers, safetensors, numpy, pyyaml,
tqdm) and no package registry: nothing is installed or downloaded, and nothing on this path imports
Ray, vLLM (unless it is installed), math-verify or gymnasium
(``tests/llm/test_gpu_smoke.py`` checks that with those modules made unimportable).

The pair mirrors the paper's Qwen2.5-Math-1.5B + Qwen3-1.7B-Base: a ``qwen2`` model with
Qwen2.5-1.5B's widths and a ``qwen3`` model with Qwen3-1.7B's widths, each cut to a few layers and
randomly initialised (no weights can be downloaded), G = 8, regime ``prp_thl+sgt``, on the
arithmetic task of ``experiments/data/arithmetic`` (its verifier needs nothing outside the tree). On the
GPU it runs what the paper presets run: ``dtype: bf16`` with fp32 master weights (:mod:`mrl_llm.precision`;
the smoke checks that the final checkpoint holds fp32 weights and the exported policies bf16),
``device: auto``, token-budget micro-batches (``train.max_tokens_per_micro_batch``) and log-probs in
checkpointed chunks (``train.logprob_chunk``); ``--cpu`` keeps fp32 but uses the budget and the chunks too.
The two policies get two different tokenizers made here (``../shared`` does not travel): a byte-level
BPE trained on the task's text and the built-in UTF-8 byte tokenizer, so THL does real work.

Then the checks of :mod:`experiments.gpu.smoke_checks` on one Qwen2.5-1.5B-shaped policy (random weights, 28
layers, the real vocabulary of 151,936, 64 rows of 512 response tokens, bf16 with fp32 masters); the script exits 1
unless each holds, naming what failed:

(a) memory: the planner's estimate for that policy on its GPU (:mod:`mrl_llm.distributed.memory`: training state,
    activations, autocast's casts, KV cache, sampling logits and the process overhead) is >= the reserved peak
    (``torch.cuda.max_memory_reserved``) of one sample + update step in a fresh process and <= 1.3x it. ``--cpu``
    has no reserved peak: it checks each phase's peak RSS growth within 0.8-1.5x of the planner's terms for it (the
    band of ``tests/distributed/test_memory_measured.py``);
(b) bf16 against fp32 on one batch from the same weights: the loss and the mean response NLL within 1e-2 relative,
    the gradients' cosine >= 0.99;
(c) stale weights (issue 38, item 1): with ``train.grad_accum: 1`` (four optimizer steps a step) bf16's mean
    ``approx_kl_old`` within 0.5-2x of fp32's (``--stale-lr``: the learning rate that moves the weights).

It prints HF decode tokens/s and training tokens/s of that step. ``--checks-only`` skips the pair's run.

Engine: vLLM when it is installed, else the HF engine (``--engine`` to force one). ``--cpu`` runs the
same script with tiny sizes on the CPU (what CI runs). Output: ``OUT/smoke.json`` and a printed table
with, per policy, generation tokens/s (sampled tokens / sampling time), training tokens/s (trained
response tokens / update time), and the process's peak memory (``torch.cuda.max_memory_allocated`` of
the trainer; a vLLM engine's own memory is its configured share, ``gpu_memory_utilization``, in its
own process; on CPU the peak RSS of this process and its children).

    experiments/gpu/smoke.sh [--cpu] [--steps 4] [--out DIR] [--engine auto|hf|vllm] [--ranks K]
        [--fsdp-unit layer|model|none] [--grad-sync micro_batch|mini_batch] [--checks-only] [--stale-lr LR]

``--ranks K`` (K > 1) runs :mod:`experiments.gpu.smoke_ranks` instead: the pair's ``qwen2.5-like`` policy as a
worker group of K FSDP2 ranks (one GPU each; gloo processes with ``--cpu``) against one rank, in the same
invocation, with the HF engine: step time ratio, tokens/s, peak memory per rank (``OUT/smoke_ranks.json``);
``--fsdp-unit`` and ``--grad-sync`` set the group's ``train.fsdp_unit`` and ``train.grad_sync`` (default: per-layer
units, reduce-scattered every micro-batch). A machine with one GPU runs K = 1, the default.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import resource
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "experiments" / "data" / "arithmetic"
BUDGET_S = 300.0

#: Qwen2.5-1.5B and Qwen3-1.7B widths (their config.json), cut to ``layers`` layers.
GPU_MODELS = {
    "qwen2.5-like": {"model_type": "qwen2", "hidden_size": 1536, "intermediate_size": 8960, "num_attention_heads": 12,
                     "num_key_value_heads": 2, "num_hidden_layers": 6, "max_position_embeddings": 4096,
                     "rope_theta": 10000.0, "tie_word_embeddings": True},
    "qwen3-like": {"model_type": "qwen3", "hidden_size": 2048, "intermediate_size": 6144, "num_attention_heads": 16,
                   "num_key_value_heads": 8, "head_dim": 128, "num_hidden_layers": 5, "max_position_embeddings": 4096,
                   "rope_theta": 1000000.0, "tie_word_embeddings": True},
}
#: The same architectures at toy size for ``--cpu`` (head_dim 64: a size vLLM's CPU attention takes).
CPU_MODELS = {
    "qwen2.5-like": {"model_type": "qwen2", "hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 2,
                     "num_key_value_heads": 1, "num_hidden_layers": 2, "max_position_embeddings": 512},
    "qwen3-like": {"model_type": "qwen3", "hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 2,
                   "num_key_value_heads": 1, "head_dim": 64, "num_hidden_layers": 2, "max_position_embeddings": 512},
}


def vllm_installed() -> bool:
    """Whether vLLM can be imported here, without importing it."""
    try:
        return importlib.util.find_spec("vllm") is not None
    except (ImportError, ValueError):
        return False


def make_bpe_tokenizer(out_dir: Path, vocab_size: int = 400) -> Path:
    """A byte-level BPE tokenizer trained on the arithmetic task's questions and answers."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    texts = []
    for name in ("train.jsonl", "eval.jsonl"):
        for line in (DATA / name).read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            texts.append(f"{row['question']}\nThe answer is \\boxed{{{row['answer']}}}.")
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tk.train_from_iterator(texts, trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(str(out_dir))
    return out_dir


def smoke_config(out: Path, *, cpu: bool, steps: int, engine: str) -> Any:
    """The run's :class:`mrl_llm.config.RunConfig`."""
    from mrl_llm.config import config_from_mapping

    models = CPU_MODELS if cpu else GPU_MODELS
    bpe = make_bpe_tokenizer(out / "tokenizers" / "bpe")
    tokenizers = {"qwen2.5-like": str(bpe), "qwen3-like": "utf8-bytes"}
    size = ({"group_size": 2, "max_new_tokens": 8, "micro_batch": 4, "prompts": 2, "chunk": 16} if cpu else
            {"group_size": 8, "max_new_tokens": 96, "micro_batch": 16, "prompts": 16, "chunk": 256})
    budget = 4 * (64 + size["max_new_tokens"])  # four of the longest rows (max_prompt_len 64) per micro-batch
    # two engines and two trainers share the GPU: each vLLM engine gets a fifth of it
    engine_args = {} if cpu or engine != "vllm" else {"gpu_memory_utilization": 0.2}
    policies = [{
        "name": name, "model_config": dict(mc), "tokenizer_dir": tokenizers[name], "dtype": "fp32" if cpu else "bf16",
        "device": "cpu" if cpu else "auto", "engine": engine, "engine_args": engine_args,
        "group_size": size["group_size"], "max_prompt_len": 64,
        "template": {"text": "{question}\n{instruction}\n"},
        "drift": {"threshold": 1e-3 if cpu else 0.05},
        "sampling": {"temperature": 1.0, "top_p": 1.0, "max_new_tokens": size["max_new_tokens"]},
        "train": {"optimizer": "adamw", "lr": 1e-6, "micro_batch": size["micro_batch"], "grad_clip": 1.0,
                  "max_tokens_per_micro_batch": budget, "logprob_chunk": size["chunk"]},
    } for name, mc in models.items()]
    return config_from_mapping({
        "name": f"gpu-smoke{'-cpu' if cpu else ''}", "seed": 0, "steps": steps, "prompts_per_step": size["prompts"],
        "regime": {"name": "prp_thl+sgt"}, "loss": {"kl_coef": 0.001},
        "data": {"path": str(DATA / "train.jsonl"), "verifier": "arithmetic"},
        "eval": {"enabled": False}, "checkpoint_every": 0, "tensorboard": False, "progress": False,
        "threads": 2 if cpu else None, "policies": policies,
    })


def peak_memory(cpu: bool) -> dict[str, float]:
    import torch

    if not cpu and torch.cuda.is_available():
        return {"gpu_max_allocated_gib": torch.cuda.max_memory_allocated() / 2**30,
                "gpu_max_reserved_gib": torch.cuda.max_memory_reserved() / 2**30}
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss + resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return {"host_max_rss_gib": kib / 2**20}


def summarize(run_dir: Path, config: Any) -> dict[str, Any]:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r["kind"] == "train"]
    out = {}
    for name in config.policy_names:
        mine = [r for r in rows if r["policy"] == name]
        gen_s, upd_s = sum(r["generation_s"] for r in mine), sum(r["update_s"] for r in mine)
        out[name] = {
            "steps": len(mine),
            "generation_tokens_per_s": sum(r["gen_tokens"] for r in mine) / gen_s if gen_s else None,
            "training_tokens_per_s": sum(r["train_tokens"] for r in mine) / upd_s if upd_s else None,
            "step_s_mean": sum(r["step_s"] for r in mine) / max(1, len(mine)),
            "reward_mean_last": mine[-1]["reward_mean"] if mine else None,
            "drift_mean_abs_last": mine[-1].get("drift_mean_abs") if mine else None,
            "padding_waste_mean": sum(r["padding_waste"] for r in mine) / max(1, len(mine)),
            **weight_dtypes(run_dir, name),
        }
    return out


def weight_dtypes(run_dir: Path, name: str) -> dict[str, Any]:
    """The dtypes of the policy's last checkpoint (the fp32 masters) and of its exported weights."""
    from safetensors import safe_open

    def dtypes(files: list[Path]) -> list[str]:
        seen = set()
        for f in files:
            with safe_open(str(f), framework="pt") as fh:
                seen.update(str(fh.get_slice(k).get_dtype()) for k in fh.keys())
        return sorted(seen)

    ckpt = sorted(p for p in run_dir.rglob("model/*.safetensors") if name in p.parts and "policies" not in p.parts)
    return {"checkpoint_dtypes": dtypes(ckpt[-1:]),
            "export_dtypes": dtypes(sorted((run_dir / "policies" / name).glob("*.safetensors")))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cpu", action="store_true", help="tiny sizes on the CPU (the CI check of this script)")
    ap.add_argument("--steps", type=int, default=None, help="training steps (default: 4 on GPU, 2 with --cpu)")
    ap.add_argument("--engine", choices=["auto", "hf", "vllm"], default="auto",
                    help="rollout engine (auto: vllm when installed, else hf)")
    ap.add_argument("--out", default="runs/gpu-smoke", help="output directory (a new one each run)")
    ap.add_argument("--ranks", type=int, default=1,
                    help="K > 1: one policy on K FSDP2 ranks (K GPUs, or gloo processes with --cpu) against 1 rank")
    ap.add_argument("--fsdp-unit", choices=["layer", "model", "none"], default="layer",
                    help="with --ranks K: train.fsdp_unit of the K ranks (none: whole replicas)")
    ap.add_argument("--grad-sync", choices=["micro_batch", "mini_batch"], default="micro_batch",
                    help="with --ranks K: train.grad_sync of the K ranks (mini_batch: units kept gathered, one reduce-scatter)")
    ap.add_argument("--checks-only", action="store_true", help="run the checks (a)-(c) alone, not the pair's training run")
    ap.add_argument("--stale-lr", type=float, default=None,
                    help="learning rate of check (c) (default: 1e-4 on the GPU, 1e-2 with --cpu)")
    args = ap.parse_args(argv)
    if args.stale_lr is not None and not args.stale_lr > 0:
        print(f"smoke: --stale-lr must be > 0, got {args.stale_lr}", file=sys.stderr)
        return 2
    if args.ranks < 1:
        print(f"smoke: --ranks must be >= 1, got {args.ranks}", file=sys.stderr)
        return 2

    import torch

    if not args.cpu and not torch.cuda.is_available():
        print("smoke: no GPU visible to torch; run with --cpu for the CPU check", file=sys.stderr)
        return 2
    engine = ("vllm" if vllm_installed() else "hf") if args.engine == "auto" else args.engine
    steps = args.steps if args.steps is not None else (2 if args.cpu else 4)
    out = Path(args.out)
    run_dir = out / f"run-{time.strftime('%Y%m%d-%H%M%S')}"
    if args.ranks > 1:
        gpus = 0 if args.cpu else torch.cuda.device_count()
        if not args.cpu and gpus < args.ranks:
            print(f"smoke: --ranks {args.ranks} needs {args.ranks} GPUs, torch sees {gpus}; run --ranks {gpus or 1}",
                  file=sys.stderr)
            return 2
        from experiments.gpu.smoke_ranks import main as ranks_main

        out.mkdir(parents=True, exist_ok=True)
        ranks_main(args.ranks, smoke_config(out, cpu=args.cpu, steps=steps, engine="hf"), out, cuda=not args.cpu,
                   train={"fsdp_unit": args.fsdp_unit, "grad_sync": args.grad_sync})
        return 0
    out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {}
    if not args.checks_only:
        result = pair_run(args, out, run_dir, engine, steps)
        if not args.cpu:  # the pair's cached blocks: the checks' processes need the GPU
            torch.cuda.empty_cache()
    from experiments.gpu.smoke_checks import run_checks

    t0 = time.perf_counter()
    checks, failures = run_checks(cpu=args.cpu, stale_lr=args.stale_lr)
    result |= {"checks": checks, "check_failures": failures, "checks_s": time.perf_counter() - t0,
               "device": "cpu" if args.cpu else torch.cuda.get_device_name(0), "torch": torch.__version__}
    (out / "smoke.json").write_text(json.dumps(result, indent=1))
    print_checks(checks, failures, result["checks_s"])
    print(f"written: {out / 'smoke.json'}")
    return 1 if failures else 0


def print_checks(checks: dict[str, Any], failures: list[str], seconds: float) -> None:
    size = checks["size"]
    print(f"checks on one {size['model_config']['num_hidden_layers']}-layer qwen2 policy (hidden "
          f"{size['model_config']['hidden_size']}, vocabulary {size['model_config']['vocab_size']}), {size['rows']} "
          f"rows x {size['response_len']} response tokens, {size['dtype']} ({seconds:.0f} s):")
    print(f"  HF decode {checks['decode_tokens_per_s']:.1f} tokens/s, training {checks['train_tokens_per_s']:.1f} "
          "tokens/s")
    for key, m in checks.items():
        if key.startswith("memory"):
            print(f"  {key}: " + ", ".join(f"{k}={v:.3f}" for k, v in m.items()))
    par, st = checks["parity"], checks["stale"]
    print(f"  bf16 vs fp32: loss rel {par['loss_rel']:.2e}, NLL rel {par['nll_rel']:.2e}, gradient cosine "
          f"{par['grad_cos']:.5f}")
    print(f"  stale weights: approx_kl_old bf16 {st['kl_bf16']:.3e} / fp32 {st['kl_fp32']:.3e} = {st['ratio']:.2f}")
    for f in failures:
        print(f"CHECK FAILED: {f}", file=sys.stderr)
    print("checks: " + ("all passed" if not failures else f"{len(failures)} failed"))


def pair_run(args: argparse.Namespace, out: Path, run_dir: Path, engine: str, steps: int) -> dict[str, Any]:
    """The reduced pair trained for ``steps`` steps (module docstring); its summary, printed."""
    import torch

    if not args.cpu:
        torch.cuda.reset_peak_memory_stats()

    from mrl_llm.trainer import train

    t0 = time.perf_counter()
    cfg = smoke_config(out, cpu=args.cpu, steps=steps, engine=engine)
    train(cfg, run_dir)
    wall = time.perf_counter() - t0
    result = {
        "device": "cpu" if args.cpu else torch.cuda.get_device_name(0), "engine": engine, "steps": steps,
        "torch": torch.__version__, "python": sys.version.split()[0], "wall_s": wall, "within_budget": wall <= BUDGET_S,
        "policies": summarize(run_dir, cfg), "peak_memory": peak_memory(args.cpu), "run_dir": str(run_dir),
    }
    import transformers

    result["transformers"] = transformers.__version__
    print(f"smoke on {result['device']} with the {engine} engine: {steps} steps in {wall:.1f} s "
          f"({'within' if result['within_budget'] else 'OVER'} the {BUDGET_S:.0f} s budget)")
    print(f"{'policy':<14}{'gen tok/s':>12}{'train tok/s':>13}{'step s':>9}{'padded/real':>13}  weights ckpt / export")
    for name, p in result["policies"].items():
        g, t = p["generation_tokens_per_s"] or 0.0, p["training_tokens_per_s"] or 0.0
        print(f"{name:<14}{g:12.1f}{t:13.1f}{p['step_s_mean']:9.2f}{p['padding_waste_mean']:13.2f}  "
              f"{','.join(p['checkpoint_dtypes'])} / {','.join(p['export_dtypes'])}")
    print("peak memory: " + ", ".join(f"{k}={v:.2f}" for k, v in result["peak_memory"].items()))
    return result


if __name__ == "__main__":
    sys.exit(main())
