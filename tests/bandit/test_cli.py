"""``python -m bandit_sim run | sweep | predict | scenario``: outputs, overrides and errors (predict: test_predict.py)."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from bandit_sim.cli import main
from bandit_sim.presets import get_preset
from bandit_sim.results import SUMMARY_KEYS
from bandit_sim.scenario import load_scenario
from shared_interfaces.config_io import ConfigError


def test_run_smoke_preset_writes_everything(tmp_path):
    out = tmp_path / "run"
    assert main(["run", "--preset", "smoke", "--out", str(out), "--quiet", "--steps", "10", "--seeds", "3",
                 "--regimes", "grpo,sgt+xgrpo,prp_thl"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["config"]["steps"] == 10 and summary["config"]["seeds"] == 3
    assert list(summary["regimes"]) == ["grpo", "sgt+xgrpo", "prp_thl"]
    for name, reg in summary["regimes"].items():
        assert len(reg["policies"]) == 2
        for pol in reg["policies"]:
            assert set(SUMMARY_KEYS) <= set(pol)
            assert 0.0 <= pol["accuracy"] <= 1.0
            assert (pol["ratio_variance"] is None) == (name != "prp_thl")
    m = np.load(out / "metrics.npz")
    assert m["accuracy"].shape == (len(m["steps"]), 3, 3, 2)
    assert (out / "metrics.csv").read_text().startswith("step,regime,policy,metric")
    for png in ("learning_curves.png", "stability_support.png"):
        assert (out / png).stat().st_size < 300_000


def test_overrides_config_file_and_scenario_file(tmp_path):
    assert main(["scenario", "--preset", "smoke", "--out", str(tmp_path / "s.npz")]) == 0
    sc = load_scenario(tmp_path / "s.npz")
    (tmp_path / "c.yaml").write_text("steps: 7\nseeds: 2\nlr: 3.0\nsgt: {weight: 0.25}\nregimes: [grpo, sgt]\n")
    out = tmp_path / "run"
    assert main(["run", "--scenario", str(tmp_path / "s.npz"), "--config", str(tmp_path / "c.yaml"), "--out", str(out),
                 "--lr", "4.0", "--group-size", "3", "--batch-prompts", "5", "--epochs", "2", "--thl-sigma", "0.2",
                 "--seed", "9", "--sgt-weight", "0.5", "--quiet", "--no-plots"]) == 0
    cfg = json.loads((out / "summary.json").read_text())["config"]
    assert (cfg["steps"], cfg["seeds"], cfg["lr"], cfg["group_size"], cfg["batch_prompts"], cfg["epochs"]) == (7, 2, 4.0, 3, 5, 2)
    assert (cfg["thl_sigma"], cfg["seed"], cfg["sgt"]["weight"], cfg["regimes"]) == (0.2, 9, 0.5, ["grpo", "sgt"])
    assert cfg["scenario"].endswith("s.npz") and sc.n_contexts == 32


@pytest.mark.parametrize("argv, msg", [
    (["--preset", "nope"], "unknown preset 'nope'"),
    (["--preset", "smoke", "--regimes", "grpo,ppo"], "unknown regime component"),
    (["--preset", "smoke", "--regimes", "prp_thl+xgrpo"], "combines bases"),
    (["--preset", "smoke", "--steps", "0"], "steps must be >= 1"),
    (["--preset", "smoke", "--batch-prompts", "999"], "batch_prompts 999 exceeds the generated scenario's 32"),
    (["--preset", "smoke", "--seed", "-1"], "the command line: seed must be >= 0, got -1"),
    ([], "give a scenario"),
    (["--scenario", "/nonexistent.npz"], "does not exist"),
    (["--preset", "smoke", "--seeds", "100000000000"], "this run would need about"),
    (["--preset", "smoke", "--group-size", "1000000000"], "lower --seeds, the scenario's size, --batch-prompts x"),
])
def test_bad_input_gives_a_clear_error(tmp_path, capsys, argv, msg):
    assert main(["run", *argv, "--out", str(tmp_path / "o"), "--quiet"]) == 2
    assert msg in capsys.readouterr().err


@pytest.mark.parametrize("cmd", [["run", "--preset", "smoke"], ["sweep", "--grid", "smoke"]])
def test_workers_below_one_are_refused(tmp_path, capsys, cmd):
    for bad in ("0", "-2"):
        with pytest.raises(SystemExit) as exc:
            main([*cmd, "--workers", bad, "--out", str(tmp_path / "o")])
        assert exc.value.code == 2 and f"--workers: must be >= 1, got {bad}" in capsys.readouterr().err


def test_out_is_checked_before_the_run_and_a_rerun_leaves_no_stale_figure(tmp_path, capsys):
    """A file, an empty string or a foreign non-empty directory as --out is refused before anything runs; an
    earlier run's directory is replaced whole (no figure of it left beside a ``--no-plots`` rerun's summary)."""
    (tmp_path / "afile").write_text("x")
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "notes.txt").write_text("mine")
    for out, msg in ((tmp_path / "afile", "is a file"), (tmp_path / "afile" / "sub", "is a file, not a directory"),
                     ("", "--out is empty"), (tmp_path / "home", "holds no bandit_sim run")):
        assert main(["run", "--preset", "smoke", "--steps", "2", "--seeds", "1", "--out", str(out), "--quiet"]) == 2
        err = capsys.readouterr().err
        assert msg in err and "Traceback" not in err
    assert (tmp_path / "home" / "notes.txt").read_text() == "mine" and not (tmp_path / "summary.json").exists()
    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").write_text("{}")
    (run / "stability_support.png").write_bytes(b"old figure")
    assert main(["run", "--preset", "smoke", "--steps", "2", "--seeds", "1", "--regimes", "grpo", "--out", str(run),
                 "--quiet", "--no-plots"]) == 0
    assert sorted(f.name for f in run.iterdir()) == ["metrics.csv", "metrics.npz", "summary.json"]


def test_scenario_and_predict_out_files_are_checked_before_the_work(tmp_path, capsys):
    (tmp_path / "afile").write_text("x")
    fixture = str(Path(__file__).resolve().parents[1] / "fixtures" / "demo" / "seed0.json.gz")
    for cmd in (["scenario", "--preset", "smoke"], ["predict", "--success-matrix", fixture, "--seeds", "2"]):
        for out, msg in ((tmp_path, "is a directory; give a file name"), (tmp_path / "afile" / "x", "is a file, not a"),
                         ("", "--out is empty")):
            assert main([*cmd, "--out", str(out)]) == 2
            err = capsys.readouterr().err
            assert msg in err and "Traceback" not in err, (cmd, out, err)


@pytest.mark.parametrize("text, msg", [
    ("stepz: 3\n", "unknown key(s) ['stepz']"),
    ("- 1\n", "the top level must be a mapping of SimConfig keys, got list"),
    ("lr: 1e-3x\n", "lr: expected a number, got '1e-3x'"),
    ("steps: 1e3\n", "steps: expected an integer, got 1000.0; write it as 1000"),
    ("support_eps: -1\n", "support_eps must be >= 0"),
    ("rescue_peer_min: 7\n", "rescue_peer_min must be in [0, 1]"),
    ("support_eps: 2.0\n", "support_eps must be >= 0 and < 1"),  # was accepted: support 0 everywhere
    ("rescue_eps: 1.5\n", "rescue_eps must be >= 0 and < 1"),
    ("scenario: ''\n", "scenario is empty"),  # was "scenario . is a directory"
    ("lr: 1.0e+39\n", "lr must be > 0 and finite (at most 3.4e+38 in float32)"),  # was a torch overflow traceback
])
def test_bad_config_file(tmp_path, capsys, text, msg):
    (tmp_path / "c.yaml").write_text(text)
    assert main(["run", "--preset", "smoke", "--config", str(tmp_path / "c.yaml"), "--out", str(tmp_path)]) == 2
    assert msg in capsys.readouterr().err


def test_more_threads_than_cores_use_the_cores(tmp_path):
    """``threads: 100000`` crashed torch (a segfault, no message); the engine uses at most this machine's cores."""
    import os

    import torch

    was = torch.get_num_threads()
    try:
        (tmp_path / "c.yaml").write_text("threads: 100000\nsteps: 2\nseeds: 1\nregimes: [grpo]\n")
        assert main(["run", "--preset", "smoke", "--config", str(tmp_path / "c.yaml"), "--out", str(tmp_path / "o"),
                     "--quiet", "--no-plots"]) == 0
        assert torch.get_num_threads() == os.cpu_count()
    finally:
        torch.set_num_threads(was)


def test_config_lr_in_exponent_form(tmp_path):
    (tmp_path / "c.yaml").write_text("lr: 1e-3\nsteps: 2\nseeds: 1\nregimes: [grpo]\n")
    assert main(["run", "--preset", "smoke", "--config", str(tmp_path / "c.yaml"), "--out", str(tmp_path / "o"),
                 "--quiet", "--no-plots"]) == 0
    assert json.loads((tmp_path / "o" / "summary.json").read_text())["config"]["lr"] == 1e-3


def test_bad_scenario_values(tmp_path, capsys):
    np.savez(tmp_path / "b.npz", init_logits=np.zeros((2, 3, 4)), rewards=np.full((3, 4), 2.0))
    assert main(["run", "--scenario", str(tmp_path / "b.npz"), "--out", str(tmp_path / "o")]) == 2
    assert "in [0, 1]" in capsys.readouterr().err


def test_sweep_smoke_grid(tmp_path):
    """The smoke grid (4 points; about 10 s on an idle 2-core machine, start-up included)."""
    proc = subprocess.run([sys.executable, "-m", "bandit_sim", "sweep", "--grid", "smoke", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    rows = (tmp_path / "sweep.csv").read_text().splitlines()
    assert rows[0].startswith("overlap,thl_sigma,regime,policy,accuracy") and len(rows) == 1 + 4 * 5 * 2
    assert (tmp_path / "sweep.png").exists()
    assert "grid points" in proc.stderr  # the progress bar


def test_unknown_grid(tmp_path, capsys):
    assert main(["sweep", "--grid", "huge", "--out", str(tmp_path)]) == 2
    assert "unknown sweep grid" in capsys.readouterr().err


def test_single_policy_run_reports_nulls(tmp_path, capsys):
    """P = 1 is allowed: no rescue set and no peer samples, so those metrics are null, not 0; each peer regime
    is named as training like grpo."""
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "one.npz", init_logits=rng.normal(size=(1, 6, 4)), rewards=(rng.random((6, 4)) < 0.4) * 1.0)
    out = tmp_path / "o"
    assert main(["run", "--scenario", str(tmp_path / "one.npz"), "--regimes", "grpo,xgrpo,prp_thl,sgt", "--steps", "5",
                 "--seeds", "2", "--batch-prompts", "3", "--out", str(out), "--quiet"]) == 0
    warned = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning: ")]
    assert [w.split(":")[1].strip() for w in warned] == ["regime xgrpo", "regime prp_thl", "regime sgt"]
    assert all("no peers, so it trains as grpo" in w for w in warned)
    summary = json.loads((out / "summary.json").read_text())
    for reg in summary["regimes"].values():
        (pol,) = reg["policies"]
        assert pol["rescue_accuracy"] is None and pol["ratio_variance"] is None and pol["sgt_activations"] == 0
    assert (out / "learning_curves.png").exists()


def test_group_size_one_under_own_group_statistics_is_named(tmp_path, capsys):
    """G = 1 under grpo / sgt: every advantage is 0; the run goes on (a sweep may want it) with a warning."""
    assert main(["run", "--preset", "smoke", "--group-size", "1", "--steps", "2", "--seeds", "1", "--out",
                 str(tmp_path / "o"), "--quiet", "--no-plots"]) == 0
    warned = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning: ")]
    assert [w.split(":")[1].strip() for w in warned] == ["regime grpo", "regime sgt"]
    assert all("group_size 1 for ['policy0', 'policy1']" in w for w in warned)
    assert main(["run", "--preset", "smoke", "--steps", "2", "--seeds", "1", "--out", str(tmp_path / "o2"),
                 "--quiet", "--no-plots"]) == 0
    assert "warning" not in capsys.readouterr().err


def test_one_seed_leaves_the_ci95_cells_empty(tmp_path):
    """One seed gives no interval: the ci95 cell is empty (it was "nan"), the seed variance 0."""
    import csv

    assert main(["run", "--preset", "smoke", "--steps", "2", "--seeds", "1", "--out", str(tmp_path / "o2"),
                 "--quiet", "--no-plots"]) == 0
    with open(tmp_path / "o2" / "metrics.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert rows and all(r["ci95"] == "" and float(r["seed_var"]) == 0 for r in rows)
    assert "nan" not in (tmp_path / "o2" / "metrics.csv").read_text()


@pytest.mark.parametrize("field, value, msg", [
    ("thl_sigma", math.inf, "thl_sigma must be >= 0 and finite"),
    ("thl_bias", math.nan, "thl_bias must be a finite number"),
    ("lr", math.inf, "lr must be > 0 and finite"),
])
def test_configs_built_in_code_refuse_non_finite_values(field, value, msg):
    """Configs built in code (predict, fit, a sweep point) skip the file loader's finite check; the config's own
    check refuses them (``predict --thl-sigma inf`` ran and printed a prediction)."""
    with pytest.raises(ConfigError, match=re.escape(msg)):
        replace(get_preset("smoke"), **{field: value})


def test_predict_refuses_an_infinite_thl_sigma(capsys):
    fixture = str(Path(__file__).resolve().parents[1] / "fixtures" / "demo" / "seed0.json.gz")
    assert main(["predict", "--success-matrix", fixture, "--seeds", "2", "--steps", "1", "--thl-sigma", "inf"]) == 2
    err = capsys.readouterr().err
    assert "thl_sigma must be >= 0 and finite, got inf" in err and "Traceback" not in err
