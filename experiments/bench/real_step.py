"""One RL step of the real pair (SmolLM2-135M-Instruct + Gemma-3-270M, fp32, CPU), stage by stage (issue 41, item 4).

The step runs through the runtime's own objects: two :class:`~mrl_llm.distributed.actors.PolicyActor` s built
from a run config (``mrl_llm.worker:build``) over an in-process exchange, each policy's ``generate`` (the HF
engine's rollouts, scoring, publishing) then each policy's ``train`` (fetch + the core's plan, THL, the update,
the weight sync), as :mod:`mrl_llm.runner` schedules them. The prompts are the preset's shape: ``--prompts``
``add`` problems, each with 3 few-shot examples whose answers differ (:func:`experiments.real.task_probe.draw_prompts`
with ``shots="distinct"``), SmolLM2 in its ChatML template and Gemma-3 in plain "Q: ... A:" text
(:func:`experiments.real.task_probe.render`), cached into each worker's prompt cache (``set_prompt``); ``--k``
samples a prompt at temperature 0.5, ``--max-new-tokens`` each, stopped at EOS only (every response of a few-shot
base model then runs to the limit: the step's largest size).

Printed per policy and step, wall and process CPU seconds (the process's CPU time over all its threads):
rollouts (the engine's ``generate``), scoring, exchange (publish + fetch + the core's plan), THL (the batch's
rows, the peer rows aligned), update and its parts (the policy's forward + loss, the reference model's pass,
the backward, the optimizer step; measured by wrapping :mod:`mrl_llm.update`'s calls), and the weight sync.
After the last step, on that step's data: the trainer's old-log-prob pass (:func:`mrl_llm.logprobs.response_logprob_rows`,
what the update runs first when ``train.grad_accum`` splits the step), THL of all of the peer's responses into the
learner's tokens (a fresh trace cache), and, with ``--reference-engine``, the engine's rollouts with every copy of
a prompt prefilled (``HFEngine(share_prompts=False)``), the reference the shared prefill is measured against, its
tokens checked equal. The process's peak RSS at the end.

    flock /work/realmodels.lock env OMP_NUM_THREADS=2 TOKENIZERS_PARALLELISM=false \\
        python -m experiments.bench.real_step --models-dir models [--steps 2] [--reference-engine]
"""

from __future__ import annotations

import argparse
import contextlib
import resource
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

POLICIES = {"smollm2": ("smollm2-135m-instruct", "chat"), "gemma3": ("gemma-3-270m", "plain")}


class Clock:
    """Wall and process-CPU seconds per label, summed over calls."""

    def __init__(self) -> None:
        self.wall: dict[str, float] = defaultdict(float)
        self.cpu: dict[str, float] = defaultdict(float)

    @contextlib.contextmanager
    def __call__(self, label: str):
        w, c = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            self.wall[label] += time.perf_counter() - w
            self.cpu[label] += time.process_time() - c


def run_config(models_dir: Path, args: argparse.Namespace):
    from mrl_llm.config import config_from_mapping

    pols = []
    for name, (sub, _) in POLICIES.items():
        pols.append({"name": name, "model_dir": str(models_dir / sub), "template": {"text": "{question}"},
                     "dtype": "fp32", "device": "cpu", "group_size": args.k, "max_prompt_len": 512,
                     "sampling": {"temperature": args.temperature, "top_p": 1.0, "max_new_tokens": args.max_new_tokens},
                     "train": {"optimizer": "adamw", "lr": 1.0e-6, "micro_batch": args.micro_batch,
                               "grad_clip": 1.0, "share_prefix": args.share_prefix}})
    return config_from_mapping({
        "name": "real-step-bench", "seed": args.seed, "steps": args.steps, "prompts_per_step": args.prompts,
        "threads": args.threads, "track_ref_kl": args.ref,
        "regime": {"name": args.regime, "sgt": {"weight": 1.0, "successes_per_prompt": 1, "selection": "shortest"}},
        "loss": {"clip_low": 0.2, "clip_high": 0.28, "agg": "token-mean", "kl_coef": args.kl_coef if args.ref else 0.0},
        "policies": pols})


#: each policy's last step's TrainBatch, and the rows its LM head ran on (forward calls, recomputation included)
LAST_BATCH: dict = {}
head_rows: dict[str, int] = {}


def instrument(clock: Clock, actors: dict) -> None:
    """Wrap :mod:`mrl_llm.update`'s forward, backward and the optimizers' step so that ``clock`` times them
    (labels ``POLICY/forward``, ``POLICY/ref``, ``POLICY/backward``, ``POLICY/optimizer``)."""
    import mrl_llm.update as upd

    owner = {}
    for name, a in actors.items():
        owner[id(a.worker.model)] = f"{name}/forward"
        if a.worker.ref_model is not None:
            owner[id(a.worker.ref_model)] = f"{name}/ref"
    fwd, bwd = upd.forward_logprobs, upd.backward
    current = {"policy": None}

    def forward_logprobs(model, *a, **kw):
        with clock(owner.get(id(model), "other/forward")):
            return fwd(model, *a, **kw)

    def backward(*a, **kw):
        with clock(f"{current['policy']}/backward"):
            return bwd(*a, **kw)

    upd.forward_logprobs, upd.backward = forward_logprobs, backward
    for name, a in actors.items():
        opt = a.worker.optimizer
        step = opt.step

        def timed_step(*s, _step=step, _name=name, **kw):
            with clock(f"{_name}/optimizer"):
                return _step(*s, **kw)

        opt.step = timed_step
        train, build = a.worker.train_step, a.worker.build_batch

        def train_step(rows, _train=train, _name=name):
            current["policy"] = _name
            return _train(rows)

        def build_batch(rows, _build=build, _name=name):
            batch = _build(rows)
            LAST_BATCH[_name] = batch
            return batch

        a.worker.train_step, a.worker.build_batch = train_step, build_batch
        head_rows[name] = 0

        def count(_m, args, _out, _name=name):
            head_rows[_name] += args[0].reshape(-1, args[0].shape[-1]).shape[0]

        a.worker.model.get_output_embeddings().register_forward_hook(count)


class FewShot:
    """A worker's template that renders a problem as its few-shot text (``texts[prompt_id]``); the rest (how the
    text is tokenized) is the policy's own template's."""

    def __init__(self, base, texts: dict[str, str]) -> None:
        self.base, self.texts = base, texts

    def render(self, problem) -> str:
        return self.texts[problem.prompt_id]

    def __getattr__(self, name: str):
        return getattr(self.base, name)


def prompts_of(args: argparse.Namespace, step: int, actors: dict) -> list:
    """The step's problems; each worker's template renders them as its few-shot text (:class:`FewShot`)."""
    from experiments.real.task_probe import draw_prompts, render

    drawn = draw_prompts("add", args.prompts * args.steps, args.seed, shots="distinct")
    mine = drawn[step * args.prompts:(step + 1) * args.prompts]
    for name, (_, fmt) in POLICIES.items():
        w = actors[name].worker
        base = w.prompts.template.base if isinstance(w.prompts.template, FewShot) else w.prompts.template
        texts = {p.problem.prompt_id: render(w.tokenizer, fmt, p.with_shots()) for p in mine}
        w.prompts.template = FewShot(base, texts)
        for p in mine:
            w.render(p.problem)
    return [p.problem for p in mine]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models-dir", default="models")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--temperature", type=float, default=0.5)
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--regime", default="sgt")
    ap.add_argument("--ref", action=argparse.BooleanOptionalAction, default=True,
                    help="a reference model (kl_coef --kl-coef and the KL metric); --no-ref: none")
    ap.add_argument("--kl-coef", type=float, default=0.001)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--stop-at-newline", action="store_true",
                    help="a response also ends at its first newline-holding token (the engine's stop ids, as "
                         "experiments/real/task_probe.py --sampler engine does)")
    ap.add_argument("--share-prompts", action=argparse.BooleanOptionalAction, default=True,
                    help="the HF engine prefills each distinct prompt once (--no-share-prompts: every copy)")
    ap.add_argument("--share-prefix", action=argparse.BooleanOptionalAction, default=False,
                    help="train.share_prefix: each distinct prompt of a micro-batch through the backbone once")
    ap.add_argument("--reference-engine", action="store_true",
                    help="also time the rollouts with every copy prefilled (share_prompts=False), the reference")
    ap.add_argument("--reference-update", action="store_true",
                    help="also time the update's forward + backward on the last step's batch with and without "
                         "share_prefix, the values and gradients compared")
    args = ap.parse_args(argv)
    models_dir = Path(args.models_dir)
    missing = [d for d, _ in POLICIES.values() if not (models_dir / d / "config.json").is_file()]
    if missing:
        sys.exit(f"{models_dir}: no prepared {', '.join(missing)}; run `python -m mrl_llm models prepare --out "
                 f"{models_dir}` or pass --models-dir")
    import torch

    from mrl_llm.distributed.actors import PolicyActor
    from mrl_llm.run_setup import actor_specs
    from shared_interfaces.exchange import InMemoryExchange

    torch.set_num_threads(args.threads)
    cfg = run_config(models_dir, args)
    clock = Clock()
    exchange = InMemoryExchange()
    with tempfile.TemporaryDirectory() as tmp:
        with clock("load"):
            actors = {s.name: PolicyActor(s, exchange) for s in actor_specs(cfg, Path(tmp))}
        print(f"torch threads {torch.get_num_threads()}; loaded both in {clock.wall['load']:.1f} s wall, "
              f"{clock.cpu['load']:.1f} s CPU", flush=True)
        instrument(clock, actors)
        for a in actors.values():
            a.worker.engine.share_prompts = args.share_prompts
        if args.stop_at_newline:
            from experiments.real.task_probe import stop_ids

            for a in actors.values():
                eng = a.worker.engine
                eng.eos_ids = sorted(set(eng.eos_ids) | set(stop_ids(a.worker.tokenizer)))
        names = list(actors)
        for step in range(args.steps):
            clock.wall.clear()
            clock.cpu.clear()
            head_rows.update(dict.fromkeys(head_rows, 0))
            problems = prompts_of(args, step, actors)
            ids = [p.prompt_id for p in problems]
            lens = {n: [len(actors[n].worker.prompts.ids(i)) for i in ids] for n in names}
            w0, c0 = time.perf_counter(), time.process_time()
            gen = {}
            for n in names:
                with clock(f"{n}/generate"):
                    gen[n] = actors[n].generate(problems, step)
            trained = {}
            for n in names:
                with clock(f"{n}/train"):
                    trained[n] = actors[n].train(step, ids, peers=names)
            wall, cpu = time.perf_counter() - w0, time.process_time() - c0
            print(f"\nstep {step}: {wall:.1f} s wall, {cpu:.1f} s CPU (both policies); prompt tokens "
                  + ", ".join(f"{n} {min(v)}-{max(v)} (mean {sum(v) / len(v):.0f})" for n, v in lens.items()))
            print("| policy | stage | wall s | CPU s |\n|---|---|---|---|")
            for n in names:
                t, m = gen[n]["timings"], trained[n]["metrics"]
                tt = trained[n]["timings"]
                rows = [("rollouts (engine)", t.get("generation_s"), None), ("scoring", t.get("scoring_s"), None),
                        ("exchange (publish + fetch + plan)", t.get("publish_s", 0.0) + tt["fetch_plan_s"], None),
                        ("THL + batch rows", m["thl_s"], None),
                        ("update", m["update_s"], None),
                        ("  forward + loss", clock.wall[f"{n}/forward"], clock.cpu[f"{n}/forward"]),
                        ("  reference pass", clock.wall[f"{n}/ref"], clock.cpu[f"{n}/ref"]),
                        ("  backward", clock.wall[f"{n}/backward"], clock.cpu[f"{n}/backward"]),
                        ("  optimizer", clock.wall[f"{n}/optimizer"], clock.cpu[f"{n}/optimizer"]),
                        ("weight sync", m["sync_s"], None),
                        ("exchange + THL wait in train()", tt["fetch_plan_s"], None),
                        ("generate() total", clock.wall[f"{n}/generate"], clock.cpu[f"{n}/generate"]),
                        ("train() total", clock.wall[f"{n}/train"], clock.cpu[f"{n}/train"])]
                for label, w, c in rows:
                    print(f"| {n} | {label} | {w:.2f} | {'' if c is None else f'{c:.2f}'} |")
                print(f"| {n} | rows own / peer / SGT; response tokens trained; reward | {int(m['own_rows'])} / "
                      f"{int(m['peer_rows'])} / {int(m['sgt_rows'])}; {int(m['train_tokens'])}; "
                      f"{m['reward_mean']:.3f}; LM-head rows (policy model, all calls) {head_rows[n]} | |")
            for n in names:
                recs = [r for pid in ids for r in actors[n].exchange.fetch_groups([pid], step)[pid].records
                        if r.policy_id == n]
                mean = sum(len(r.token_ids) for r in recs) / max(1, len(recs))
                print(f"{n}: {len(recs)} responses, {mean:.1f} tokens on average; two of them: "
                      + " | ".join(f"{r.response_text!r} {list(r.token_ids)}" for r in recs[:2]))
        print(f"\nafter step {args.steps - 1}, on its data:")
        extra(args, actors, problems, clock)
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        print(f"peak RSS of the process: {rss:.2f} GiB")
        for a in actors.values():
            a.close()


def extra(args: argparse.Namespace, actors: dict, problems: list, clock: Clock) -> None:
    """The old-log-prob pass, THL of all the peer's responses, and (``--reference-engine``) the reference rollouts."""
    import torch

    from mrl_llm.logprobs import response_logprob_rows
    from mrl_llm.rank.alignment import PeerAlignment
    from mrl_llm.rollout.base import SamplingConfig
    from mrl_llm.rollout.hf_engine import HFEngine

    names = list(actors)
    step = args.steps - 1
    ids = [p.prompt_id for p in problems]
    groups = actors[names[0]].exchange.fetch_groups(ids, step)
    for n in names:
        w = actors[n].worker
        own = [r for pid in ids for r in groups[pid].records if r.policy_id == n]
        peer = [r for pid in ids for r in groups[pid].records if r.policy_id != n]
        prompts = [w.prompts.ids(r.prompt_id) for r in own]
        responses = [list(r.token_ids) for r in own]
        t = w.policy.train
        with clock(f"{n}/old"):
            response_logprob_rows(w.model, prompts, responses, pad_id=w.pad_id,
                                  temperature=w.policy.sampling.temperature, micro_batch=t.micro_batch,
                                  chunk_size=t.logprob_chunk, share_prefix=t.share_prefix)
        fresh = PeerAlignment(n, w.tokenizer, w.prompts, tokenizers=w.alignment.tokenizers,
                              peer_eos_ids=w.cfg.peer_eos_ids)
        with clock(f"{n}/thl"):
            fresh.prefetch(peer)
        print(f"{n}: old-log-prob pass over its {len(own)} rows {clock.wall[f'{n}/old']:.2f} s wall "
              f"{clock.cpu[f'{n}/old']:.2f} s CPU; THL of the peer's {len(peer)} responses "
              f"{clock.wall[f'{n}/thl']:.3f} s wall {clock.cpu[f'{n}/thl']:.3f} s CPU")
        if args.reference_update:
            reference_update(args, n, w, clock)
        if not args.reference_engine:
            continue
        sp = SamplingConfig(temperature=args.temperature, top_p=1.0, max_new_tokens=args.max_new_tokens, seed=1234)
        pids = [w.prompts.ids(i) for i in ids]
        out = {}
        for share in (False, True):
            eng = HFEngine(w.model, w.tokenizer, share_prompts=share)
            eng.eos_ids = w.engine.eos_ids  # the run's stop ids (--stop-at-newline)
            with clock(f"{n}/engine/{share}"), torch.no_grad():
                out[share] = eng.generate(pids, args.k, sp)
        same = all(a.token_ids == b.token_ids for ga, gb in zip(out[False], out[True], strict=True)
                   for a, b in zip(ga, gb, strict=True))
        err = max((abs(x - y) for ga, gb in zip(out[False], out[True], strict=True)
                   for a, b in zip(ga, gb, strict=True) for x, y in zip(a.logprobs, b.logprobs, strict=False)),
                  default=0.0)
        ref_w, new_w = clock.wall[f"{n}/engine/False"], clock.wall[f"{n}/engine/True"]
        ref_c, new_c = clock.cpu[f"{n}/engine/False"], clock.cpu[f"{n}/engine/True"]
        print(f"{n}: rollouts {len(ids)} x {args.k}: every copy prefilled {ref_w:.2f} s wall {ref_c:.2f} s CPU; "
              f"each prompt prefilled once {new_w:.2f} s wall {new_c:.2f} s CPU: x{ref_w / new_w:.2f} wall, "
              f"x{ref_c / new_c:.2f} CPU; same tokens {same}, largest log-prob difference {err:.2e}")


def reference_update(args: argparse.Namespace, n: str, w, clock: Clock) -> None:
    """The last step's batch through forward + backward (``sum`` of the response log-probs), micro-batch by
    micro-batch, with and without ``share_prefix``: seconds, and the largest log-prob and gradient differences."""
    import torch

    from mrl_llm.logprobs import forward_logprobs, pack

    batch = LAST_BATCH[n]
    mb, t = w.policy.train.micro_batch, w.policy.train
    grads, logps = {}, {}
    for share in (False, True):
        w.model.zero_grad(set_to_none=True)
        parts = []
        with clock(f"{n}/fb/{share}"):
            for s in range(0, len(batch), mb):
                idx = range(s, min(len(batch), s + mb))
                packed = pack([batch.prompts[i] for i in idx], [batch.responses[i] for i in idx], w.pad_id)
                lp, _ = forward_logprobs(w.model, packed, w.policy.sampling.temperature, with_entropy=True,
                                         chunk_size=t.logprob_chunk, share_prefix=share)
                (lp * packed.response_mask).sum().backward()
                parts.append(lp.detach()[packed.response_mask])
        logps[share] = torch.cat(parts)
        grads[share] = torch.cat([p.grad.flatten() for p in w.model.parameters() if p.grad is not None])
    w.model.zero_grad(set_to_none=True)
    a, b = clock.wall[f"{n}/fb/False"], clock.wall[f"{n}/fb/True"]
    ca, cb = clock.cpu[f"{n}/fb/False"], clock.cpu[f"{n}/fb/True"]
    print(f"{n}: forward + backward of the {len(batch)} rows in micro-batches of {mb}: plain {a:.2f} s wall "
          f"{ca:.2f} s CPU; shared prefix {b:.2f} s wall {cb:.2f} s CPU: x{a / b:.2f} wall, x{ca / cb:.2f} CPU; "
          f"largest log-prob difference {(logps[True] - logps[False]).abs().max():.2e}, gradient "
          f"{(grads[True] - grads[False]).abs().max():.2e} (largest entry {grads[False].abs().max():.2e})")


if __name__ == "__main__":
    main()
