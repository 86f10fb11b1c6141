"""Command line: ``python -m bandit_sim run | sweep | predict | scenario`` (also the ``bandit-sim`` script).

``run``: ``--scenario FILE.npz`` or ``--preset NAME`` (``paper``, ``smoke``), ``--regimes grpo,xgrpo,...``,
``--steps``, ``--seeds``, ``--out DIR``; ``--lr``, ``--group-size``, ``--batch-prompts``, ``--epochs``,
``--sgt-weight``, ``--thl-sigma``, ``--seed`` override the preset, which a ``--config FILE.yaml`` (keys of
:class:`bandit_sim.config.SimConfig`) also overrides: preset < config file < flags.
``sweep --grid NAME|FILE.yaml --out DIR [--runtime sequential|ray] [--ray-address ADDR] [--resume DIR]
[--max-points N]``: the
grid's full product, one result file per point as it finishes, a progress bar, one table and one plot
(:mod:`bandit_sim.sweep`); a failed point is listed and the command exits 1.
``scenario --preset NAME --out FILE.npz``: write the preset's generated scenario, to edit or calibrate.
``predict --success-matrix FILE [--probe-run FILE] [--max-work N]``: calibrate a scenario from an LLM pair's success
matrix, simulate every regime and print the predicted ordering and the regime to use (:mod:`bandit_sim.predict`);
``--model kernel --dynamics GRPO_RUN/dynamics.json``: the kernel model, fitted on the pair's GRPO run.
``--max-points`` / ``--max-work`` bound a sweep's points and a prediction's simulated draws, checked before any work.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

from bandit_sim.config import SimConfig, config_from_mapping, with_overrides
from bandit_sim.predict import DEFAULT_MAX_WORK
from bandit_sim.presets import RUN_PRESETS, get_preset
from bandit_sim.scenario import ScenarioError, save_scenario
from bandit_sim.sweep_config import DEFAULT_MAX_POINTS
from shared_interfaces.config_io import ConfigError, int_at_least, load_yaml
from shared_interfaces.ray_address import check_ray_address
from shared_interfaces.regimes import idle_signal_warnings


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="bandit_sim", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run regimes on one scenario")
    src = run.add_mutually_exclusive_group()
    src.add_argument("--scenario", help="scenario .npz (init_logits [P, C, K], rewards [C, K])")
    src.add_argument("--preset", help=f"named run preset: {', '.join(sorted(RUN_PRESETS))}")
    run.add_argument("--config", help="YAML file with SimConfig keys (over the preset)")
    run.add_argument("--regimes", help="comma-separated regimes, e.g. grpo,xgrpo,prp_snapshot,prp_thl,sgt")
    run.add_argument("--out", required=True, help="output directory")
    for flag, typ in (("--steps", int), ("--seeds", int), ("--lr", float), ("--group-size", int),
                      ("--batch-prompts", int), ("--epochs", int), ("--sgt-weight", float),
                      ("--thl-sigma", float), ("--seed", int)):
        run.add_argument(flag, type=typ)
    run.add_argument("--workers", type=int_at_least(1), default=1, help="processes (regimes are sharded; exact)")
    run.add_argument("--no-plots", action="store_true")
    run.add_argument("--quiet", action="store_true", help="no progress bar")
    sw = sub.add_parser("sweep", help="run a grid of configs")
    sw.add_argument("--grid", help="a named grid (bandit_sim/grids: paper, paper-full, smoke) or a YAML file "
                    "(base + axes); with --resume, the grid recorded in DIR by default")
    sw.add_argument("--out", help="output directory (a new one; see --resume)")
    sw.add_argument("--resume", metavar="DIR", help="continue the sweep in DIR: finished points are skipped")
    sw.add_argument("--runtime", choices=("sequential", "ray"), default="sequential",
                    help="sequential: points one by one, each over --workers processes; ray: points as Ray tasks")
    sw.add_argument("--ray-address", help="an existing Ray cluster (default: start a local one)")
    sw.add_argument("--workers", type=int_at_least(1), default=1, help="processes per point (sequential runtime)")
    sw.add_argument("--quiet", action="store_true", help="no progress bar")
    sw.add_argument("--max-points", type=int_at_least(1), default=DEFAULT_MAX_POINTS,
                    help=f"refuse a grid of more points than this (default {DEFAULT_MAX_POINTS})")
    pr = sub.add_parser("predict", help="predict the regimes' outcomes for LLM policies from their success matrix")
    pr.add_argument("--success-matrix", required=True, help="success_matrix.json of a run (mrl_llm success-matrix)")
    pr.add_argument("--probe-run", help="success matrix of a short GRPO run of the same policies: fit the lr on it")
    pr.add_argument("--regimes", help="comma-separated regimes (default: the five standard ones)")
    pr.add_argument("--seeds", type=int, default=32, help="bandit seeds")
    pr.add_argument("--preset", default="paper", help="run preset whose optimizer / lr / epochs are used without a probe")
    pr.add_argument("--objective", choices=("final", "heldout", "rescue"), default="final",
                    help="what 'the regime to use' maximises: the pool's final accuracy, the own family's held-out "
                    "accuracy, or the rescue rate")
    pr.add_argument("--model", choices=("tabular", "kernel"), default="tabular",
                    help="tabular (calibrated per-prompt logits) or kernel (the matrix's measured transfer kernel, "
                    "fitted on --dynamics)")
    pr.add_argument("--dynamics", help="dynamics.json of the pair's GRPO run: the kernel model's fit input")
    pr.add_argument("--arms", type=int, default=16, help="bandit arms per prompt (one correct)")
    pr.add_argument("--alpha", type=float, default=0.01, help="never-solved floor: p = alpha / (draws of the prompt)")
    pr.add_argument("--thl-sigma", type=float, default=0.0, help="THL residual on prp_thl's denominator")
    for flag in ("--steps", "--prompts-per-step", "--group-size", "--eval-k"):
        pr.add_argument(flag, type=int, help="override the matrix's run setting")
    pr.add_argument("--max-work", type=int_at_least(1), default=DEFAULT_MAX_WORK,
                    help=f"refuse a prediction of more simulated arm draws than this (default {DEFAULT_MAX_WORK:.0e}; "
                    "regimes x seeds x policies x steps x prompts per step x (arms + G))")
    pr.add_argument("--out", help="also write the prediction as JSON to this file")
    sc = sub.add_parser("scenario", help="write a preset's generated scenario as .npz")
    sc.add_argument("--preset", required=True)
    sc.add_argument("--out", required=True)
    return ap


def build_config(args: argparse.Namespace) -> SimConfig:
    cfg = get_preset(args.preset) if args.preset else SimConfig()
    if args.config:
        cfg = config_from_mapping(load_yaml(args.config), cfg, where=f"config {args.config}")
    if args.scenario:
        cfg = replace(cfg, scenario=args.scenario)
    if cfg.scenario is None and not (args.preset or args.config):
        raise ConfigError("give a scenario: --scenario FILE.npz or --preset NAME (e.g. --preset smoke)")
    regimes = None if args.regimes is None else [r.strip() for r in args.regimes.split(",") if r.strip()]
    return with_overrides(
        cfg, regimes=regimes, steps=args.steps, seeds=args.seeds, lr=args.lr, group_size=args.group_size,
        batch_prompts=args.batch_prompts, epochs=args.epochs, sgt_weight=args.sgt_weight,
        thl_sigma=args.thl_sigma, seed=args.seed,
    )


def cmd_run(args: argparse.Namespace) -> int:
    from bandit_sim.results import check_out_dir, write_run
    from bandit_sim.runner import run_config, scenario_of

    cfg = build_config(args)
    check_out_dir(args.out)
    scenario = scenario_of(cfg)
    for spec in cfg.regime_specs():
        for msg in idle_signal_warnings(spec, dict.fromkeys(scenario.policy_names, cfg.group_size)):
            print(f"warning: {msg}", file=sys.stderr)
    res = run_config(cfg, scenario, workers=args.workers, progress=not args.quiet)
    info = {"source": cfg.scenario or "generator", "shape": list(scenario.init_logits.shape)}
    summary = write_run(res, args.out, info, plots=not args.no_plots)
    print(f"{res.steps[-1]} steps x {cfg.seeds} seeds x {len(res.regimes)} regimes in {res.wall_s:.1f} s -> {args.out}")
    for name, reg in summary["regimes"].items():
        accs = ", ".join(f"{p['accuracy']:.3f}" for p in reg["policies"])
        print(f"  {name:>14}: accuracy {accs}")
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    from bandit_sim.sweep import read_grid_record, run_sweep
    from bandit_sim.sweep_config import load_grid

    if (args.out is None) == (args.resume is None):
        raise ConfigError("give exactly one of --out DIR (a new sweep) and --resume DIR (continue one)")
    if args.ray_address and args.runtime != "ray":
        raise ConfigError("--ray-address needs --runtime ray")
    check_ray_address(args.ray_address, flag="--ray-address")  # before the sweep directory is made
    flag, out_arg = ("--out", args.out) if args.resume is None else ("--resume", args.resume)
    if not out_arg.strip():
        raise ConfigError(f"{flag} is empty; give the sweep's directory")
    out = Path(out_arg)
    if args.grid is not None:
        grid = load_grid(args.grid, max_points=args.max_points)
    elif args.resume:
        grid_file = out / "grid.json"
        if not grid_file.is_file():
            raise ConfigError(f"--resume {out}: no grid.json there; it is not a sweep directory")
        grid = _recorded_grid(read_grid_record(grid_file), grid_file, args.max_points)
    else:
        raise ConfigError("give --grid NAME or FILE.yaml (named grids: paper, paper-full, smoke)")
    res = run_sweep(grid, out, runtime=args.runtime, workers=args.workers, resume=args.resume is not None,
                    ray_address=args.ray_address, progress=not args.quiet)
    print(f"{res.points - len(res.failures)}/{res.points} points ({res.ran} run now, {res.wall_s:.1f} s), "
          f"{len(res.rows)} rows -> {out / 'sweep.csv'}")
    for f in res.failures:
        print(f"  failed point {f['key']} after {f['attempts']} attempts: {f['error']}", file=sys.stderr)
    return 1 if res.failures else 0


def _recorded_grid(data: dict, where: Path, max_points: int):
    from bandit_sim.config import config_from_mapping
    from bandit_sim.sweep_config import SweepGrid, check_grid_size

    check_grid_size(data["axes"], max_points, where=str(where))
    base = config_from_mapping(data["base"], where=f"{where}: base")
    return SweepGrid(base, {k: tuple(v) for k, v in data["axes"].items()}, name=str(data["name"]))


def cmd_predict(args: argparse.Namespace) -> int:
    from bandit_sim.predict import PredictOptions, format_prediction, predict, write_prediction
    from bandit_sim.results import check_out_file
    from shared_interfaces.success_matrix import read_success_matrix

    regimes = None if args.regimes is None else tuple(r.strip() for r in args.regimes.split(",") if r.strip())
    opts = PredictOptions(**({"regimes": regimes} if regimes is not None else {}), seeds=args.seeds,
                          preset=args.preset, objective=args.objective, model=args.model, arms=args.arms, alpha=args.alpha,
                          thl_sigma=args.thl_sigma, steps=args.steps, prompts_per_step=args.prompts_per_step,
                          group_size=args.group_size, eval_k=args.eval_k, max_work=args.max_work)
    if args.out is not None:
        check_out_file(args.out)
    matrix = read_success_matrix(args.success_matrix)
    probe = read_success_matrix(args.probe_run) if args.probe_run else None
    if args.dynamics:
        from shared_interfaces.dynamics import read_dynamics

        dyn = read_dynamics(args.dynamics)
    else:
        dyn = None
    res = predict(matrix, probe, opts, dyn)
    print(format_prediction(res))
    if args.out:
        print(f"-> {write_prediction(res, args.out)}")
    return 0


def cmd_scenario(args: argparse.Namespace) -> int:
    from bandit_sim.results import check_out_file
    from bandit_sim.runner import scenario_of

    check_out_file(args.out)
    path = save_scenario(args.out, scenario_of(get_preset(args.preset)))
    print(json.dumps({"written": str(path)}))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return {"run": cmd_run, "sweep": cmd_sweep, "scenario": cmd_scenario,
                "predict": cmd_predict}[args.command](args)
    except (ConfigError, ScenarioError, ValueError) as err:
        print(f"bandit_sim: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
