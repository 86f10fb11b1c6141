"""A transfer kernel measured from the policies at a run's start: ``python -m mrl_llm kernel --run DIR [--out FILE]
[--dim D] [--seed S]`` (the ``kernel`` section of the success matrix, :mod:`shared_interfaces.success_kernel`).

For each policy ``i`` and each prompt ``x`` of the run's success matrix (pool and held-out), at the run's START
weights (the policy's ``model_dir``, before RL), the gradient of the log-probability of a correct response::

    g(x) = grad_theta sum_t log pi(y*_t | x, y*_<t)      (over the response tokens, EOS included)

``y*``: the policy's verified greedy success at step 0 (``eval.jsonl``; ``target: "success"``), else the gold
answer rendered in the policy's response format (``target: "gold"``; for the arithmetic task the SFT target
``\\boxed{19}``, :func:`mrl_llm.rewards.arithmetic.reference_response`; a task with no rendering is refused).
The prompt is the trainer's (:class:`mrl_llm.rank.prompts.PromptCache`); the response is split off the joint
encoding of prompt + response, as SFT and THL encode a text. Then::

    K(x, x') = sum_params lr * D * g(x) * g(x')

``lr``: each parameter's learning rate (``train.lr``, ``train.lr_groups``; a frozen parameter, lr 0, counts 0);
``D``: the run's optimizer's preconditioner — identity for SGD; for Adam / AdamW the diagonal
``D = 1 / (sqrt(v) + eps)`` with ``v = mean_x g(x)^2``: Adam's bias-corrected second moment
``v_t / (1 - beta2^t)`` after steps on these per-prompt gradients in the limit ``beta2 -> 1`` (exactly ``g^2``
after one step on one prompt). So ``K(x, x')`` is about how far one optimizer step on ``x`` moves
``log pi(y*|x')`` per unit of advantage (momentum, weight decay and clipping left out). It is computed as
``<S(sqrt(lr D) g(x)), S(sqrt(lr D) g(x'))>``, ``S`` a seeded count-sketch to ``dim`` dimensions (each parameter
coordinate hashed to a bucket with a random sign: unbiased for inner products, with variance at most
``(|a|^2 |b|^2 + <a, b>^2) / dim``; its buckets are drawn again per parameter, so it costs no memory beyond
one parameter's), or exactly (``dim`` None or 0, or ``>=`` the parameter count; the ``[C, N]`` gradients are
then held). On the CPU in fp32, one prompt at a time, two passes for Adam (``v`` first), with the run's
``threads``. The matrix (version 2, its ``split`` included) is written to ``--out`` (default: the run's
``success_matrix.json``, replaced atomically); the cost (seconds, peak RSS) is printed and stored, and so is each
target's ``log pi(y*|x)`` at the start (``logprob``: where a never-solved prompt's correct answer starts, which the
kernel model of ``bandit_sim`` uses instead of a floor).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import resource
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mrl_llm.data import Problem
from shared_interfaces.success_matrix import SuccessMatrix, SuccessMatrixError, write_success_matrix

log = logging.getLogger(__name__)

Gradient = Callable[[int], list[torch.Tensor]]


def count_sketch(z: Sequence[torch.Tensor], dim: int, seed: int) -> torch.Tensor:
    """``S z``: ``out[h(j)] += s(j) z_j`` over every coordinate ``j`` of the tensors ``z`` (float64 ``[dim]``);
    tensor ``k``'s buckets ``h`` and signs ``s`` are drawn from a generator seeded by ``(seed, k)``, so the same
    ``(seed, shapes)`` give the same ``S`` in any process."""
    out = torch.zeros(dim, dtype=torch.float64)
    for k, t in enumerate(z):
        gen = torch.Generator().manual_seed(seed * 1_000_003 + k)
        n = t.numel()
        bucket = torch.randint(0, dim, (n,), generator=gen)
        sign = torch.randint(0, 2, (n,), generator=gen, dtype=torch.int8).to(torch.float64).mul_(2).sub_(1)
        out.index_add_(0, bucket, t.reshape(-1).to(torch.float64) * sign)
    return out


def preconditioned_kernel(grad: Gradient, n_prompts: int, lrs: Sequence[float], *, adam_eps: float | None,
                          dim: int | None = None, seed: int = 0) -> np.ndarray:
    """``K [C, C]`` with ``K[x, x'] = sum_j lr_j D_j g_j(x) g_j(x')`` (module docstring): ``grad(c)`` gives prompt
    ``c``'s gradient as one tensor per parameter, ``lrs`` their learning rates; ``adam_eps`` None: ``D = 1``
    (SGD), else ``D = 1 / (sqrt(mean_c g(c)^2) + adam_eps)``. Exact when ``dim`` is None / 0 or at least the
    parameter count, else through :func:`count_sketch` of seed ``seed``. No prompts: a ``[0, 0]`` matrix."""
    if n_prompts == 0:
        return np.zeros((0, 0))
    lr = [torch.tensor(float(r), dtype=torch.float32) for r in lrs]
    if adam_eps is None:
        scale = [r.sqrt() for r in lr]
    else:
        v: list[torch.Tensor] | None = None
        for c in range(n_prompts):
            g = grad(c)
            v = [x * x for x in g] if v is None else [a.add_(x * x) for a, x in zip(v, g, strict=True)]
        assert v is not None
        scale = [(r / (a.div_(n_prompts).sqrt_() + adam_eps)).sqrt_() for r, a in zip(lr, v, strict=True)]
    Z: torch.Tensor | None = None
    for c in range(n_prompts):
        z = [s * x for s, x in zip(scale, grad(c), strict=True)]
        if Z is None:
            n_params = sum(t.numel() for t in z)
            exact = not dim or dim >= n_params
            Z = torch.empty(n_prompts, n_params if exact else dim, dtype=torch.float32 if exact else torch.float64)
        Z[c] = torch.cat([t.reshape(-1) for t in z]) if exact else count_sketch(z, dim, seed)
    assert Z is not None
    K = gram(Z)
    return (K + K.T) / 2


def gram(Z: torch.Tensor, block: int = 32) -> np.ndarray:
    """``Z Z^T`` in float64, ``block`` rows at a time (an fp32 ``Z`` is never copied whole)."""
    K = np.empty((Z.shape[0], Z.shape[0]))
    for a in range(0, Z.shape[0], block):
        za = Z[a:a + block].to(torch.float64)
        for b in range(0, Z.shape[0], block):
            K[a:a + block, b:b + block] = (za @ Z[b:b + block].to(torch.float64).T).numpy()
    return K


# -- a policy's gradients ---------------------------------------------------------------------------------------

def gold_response(problem: Problem) -> str:
    """The gold answer of ``problem`` in its task's response format (:data:`GOLD_RENDERINGS`); an error for a
    task that has none."""
    render = GOLD_RENDERINGS.get(problem.verifier)
    if render is None:
        raise SuccessMatrixError(f"prompt {problem.prompt_id!r} has no verified step-0 success and its task (verifier "
                                 f"{problem.verifier!r}) has no gold rendering (known: {sorted(GOLD_RENDERINGS)}); "
                                 "evaluate with more samples or greedy successes, or add a rendering for the task")
    return render(problem)


def _arithmetic(problem: Problem) -> str:
    from mrl_llm.rewards.arithmetic import reference_response

    return reference_response(problem)


#: how each task's gold answer reads as a response (the format SFT taught)
GOLD_RENDERINGS: dict[str, Callable[[Problem], str]] = {"arithmetic": _arithmetic}


def response_ids(tokenizer: Any, add_special_tokens: bool, prompt_text: str, prompt_ids: Sequence[int],
                 text: str) -> list[int]:
    """``text``'s ids as a response to the prompt: the joint encoding of prompt + text past the prompt's ids (as
    SFT and THL split a text; when the joint encoding does not start with the prompt's ids, ``text`` encoded
    alone), EOS appended."""
    joint = list(tokenizer(prompt_text + text, add_special_tokens=add_special_tokens).input_ids)
    n = len(prompt_ids)
    ids = joint[n:] if joint[:n] == list(prompt_ids) else list(tokenizer(text, add_special_tokens=False).input_ids)
    eos = tokenizer.eos_token_id
    return ids + ([] if eos is None else [int(eos)])


def lr_parameters(model: torch.nn.Module, policy: Any) -> list[tuple[str, torch.nn.Parameter, float]]:
    """``(name, parameter, lr)`` of every parameter the policy's optimizer steps (its ``train.lr_groups``,
    :func:`mrl_llm.param_groups.split_param_groups`; frozen ones left out)."""
    from mrl_llm.param_groups import split_param_groups

    t = policy.train
    groups = split_param_groups(model.named_parameters(), t.lr_groups, t.lr, policy=policy.name)
    by_name = dict(model.named_parameters())
    return [(n, by_name[n], float(g["lr"])) for g in groups for n in g["names"]]


def policy_examples(policy: Any, tokenizer: Any, problems: Sequence[Problem],
                    successes: dict[str, str]) -> tuple[list[tuple[list[int], list[int]]], list[str]]:
    """Per problem ``(prompt ids, response ids)`` of its ``y*`` and the target kind: ``successes[prompt_id]``
    (a verified step-0 response) when there is one, else :func:`gold_response`."""
    from mrl_llm.rank.prompts import PromptCache
    from mrl_llm.templates import PromptTemplate

    tpl = PromptTemplate(policy.template, tokenizer, policy=f"policy {policy.name!r}")
    cache = PromptCache(policy.name, tokenizer, tpl, max_prompt_len=policy.max_prompt_len)
    out, kinds = [], []
    for p in problems:
        text, ids = cache.render(p)
        hit = successes.get(str(p.prompt_id))
        kinds.append("success" if hit else "gold")
        out.append((ids, response_ids(tokenizer, tpl.add_special_tokens, text, ids, hit or gold_response(p))))
    return out, kinds


def gradient_fn(model: torch.nn.Module, params: Sequence[torch.nn.Parameter], examples: Sequence[tuple[list[int],
                list[int]]], *, pad_id: int, temperature: float, logprobs: dict[int, float] | None = None) -> Gradient:
    """``grad(c)``: the gradient of ``sum_t log pi(response_t | ...)`` of ``examples[c]`` w.r.t. ``params``
    (the trainer's log-probs, :func:`mrl_llm.logprobs.forward_logprobs`, at the sampling temperature); the
    log-probability itself goes to ``logprobs[c]`` when given."""
    from mrl_llm.logprobs import forward_logprobs, pack

    def grad(c: int) -> list[torch.Tensor]:
        batch = pack([examples[c][0]], [examples[c][1]], pad_id)
        logp, _ = forward_logprobs(model, batch, temperature)
        total = logp[0][batch.response_mask[0]].sum()
        if logprobs is not None:
            logprobs[c] = float(total.detach())
        return [g.detach() for g in torch.autograd.grad(total, list(params))]

    return grad


# -- a run --------------------------------------------------------------------------------------------------------

def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def check_start(policy: Any) -> None:
    """An error naming the policy when its start weights (``model_dir``) are missing."""
    from mrl_llm.hub import is_hub_id

    d = policy.model_dir
    if d is None:
        raise SuccessMatrixError(f"policy {policy.name!r} has no model_dir (it started from model_config's random "
                                 "weights): the kernel needs the start checkpoint; point model_dir at it")
    if not is_hub_id(d) and not (Path(d) / "config.json").is_file():
        raise SuccessMatrixError(f"policy {policy.name!r}'s start checkpoint {d} (model_dir in the run's config.json) "
                                 "is missing; restore it or edit model_dir to where the weights before RL are")


def start_model(policy: Any, tokenizer: Any) -> torch.nn.Module:
    """The policy's start weights (its ``model_dir``, :func:`check_start`) in fp32 on the CPU."""
    from mrl_llm.models import build_model

    check_start(policy)
    return build_model(policy, tokenizer, seed=0, dtype="fp32").to("cpu")


def step0_successes(run_dir: Path, policy: str, policies: list[str]) -> dict[str, str]:
    """Prompt id -> policy ``policy``'s verified greedy response at step 0 (``eval.jsonl``)."""
    from mrl_llm.success_matrix import read_run_eval

    rows = read_run_eval(run_dir / "eval.jsonl", policies, run_dir / "config.json")
    return {str(r["prompt_id"]): r["greedy_response"] for r in rows
            if r["step"] == 0 and r["policy"] == policy and not r["skipped"] and r["greedy_correct"] == 1
            and isinstance(r.get("greedy_response"), str) and r["greedy_response"]}


def run_kernel(run_dir: str | Path, out: str | Path | None = None, *, dim: int | None = None,
               seed: int = 0) -> tuple[Path, SuccessMatrix]:
    """Measure the kernel of every policy of ``run_dir`` (module docstring) and write the run's success matrix
    with it to ``out`` (a file or directory; default ``run_dir/success_matrix.json``); returns the path and the
    matrix."""
    from mrl_llm.config import config_from_mapping
    from mrl_llm.models import load_tokenizer
    from mrl_llm.run_problems import run_eval_problems
    from mrl_llm.success_matrix import FILE_NAME, matrix_from_run, output_path

    d = Path(run_dir)
    if dim is not None and (isinstance(dim, bool) or not isinstance(dim, int) or dim < 0):
        raise SuccessMatrixError(f"--dim must be a whole number >= 0 (0: exact), got {dim!r}")
    t0 = time.perf_counter()
    matrix = matrix_from_run(d)  # the run's checks first: config.json, eval.jsonl, its split
    raw = json.loads((d / "config.json").read_text(encoding="utf-8"))
    cfg = config_from_mapping(raw, base_dir=d, where=str(d / "config.json"))
    for pol in cfg.policies:
        check_start(pol)
    problems = run_eval_problems(d, raw, matrix.prompts)
    probs = [problems[p] for p in matrix.prompts]
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    names = list(cfg.policy_names)
    C = len(probs)
    K = np.full((len(names), C, C), np.nan)
    entries: list[dict[str, Any] | None] = []
    for i, pol in enumerate(cfg.policies):
        ti = time.perf_counter()
        tok = load_tokenizer(pol)
        model = start_model(pol, tok)
        examples, kinds = policy_examples(pol, tok, probs, step0_successes(d, pol.name, names))
        named = lr_parameters(model, pol)
        adam = pol.train.optimizer in ("adam", "adamw")
        logps: dict[int, float] = {}
        grad = gradient_fn(model, [p for _, p, _ in named], examples, pad_id=int(tok.pad_token_id),
                           temperature=pol.sampling.temperature, logprobs=logps)
        K[i] = preconditioned_kernel(grad, C, [r for _, _, r in named], adam_eps=pol.train.eps if adam else None,
                                     dim=dim, seed=seed)
        n = sum(p.numel() for _, p, _ in named)
        entries.append({"preconditioner": "adam" if adam else "identity", "parameters": int(n), "target": kinds,
                        "logprob": [round(logps[c], 6) for c in range(C)],
                        "seconds": round(time.perf_counter() - ti, 3)})
        log.info("kernel of %s: %d prompts, %d parameters, %.1f s", pol.name, C, n, entries[-1]["seconds"])
        del model
    n_max = max(e["parameters"] for e in entries if e is not None)
    meta = {"projection_dim": dim if dim and dim < n_max else None, "seed": int(seed), "lr_weighted": True,
            "seconds": round(time.perf_counter() - t0, 3), "peak_rss_mb": round(_peak_rss_mb(), 1),
            "policies": entries}
    if any(not math.isfinite(x) for x in K.reshape(-1)):
        raise SuccessMatrixError(f"{d}: a kernel entry is not finite (a gradient overflowed in fp32); check the "
                                 "start weights")
    result = dataclasses.replace(matrix, kernel=K, kernel_meta=meta)
    path = write_success_matrix(output_path(out) if out is not None else d / FILE_NAME, result)
    return path, result
