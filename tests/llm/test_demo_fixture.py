"""The demo fixture built from a demo's own run directories (:mod:`mrl_llm.demo.fixture`), and the committed one."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from mrl_llm.demo.fixture import build_fixture, find_runs, main, observed_outcomes
from mrl_llm.dynamics import dynamics_from_run
from shared_interfaces.dynamics import read_dynamics
from shared_interfaces.success_matrix import SuccessMatrixError, read_success_matrix
from tests.crosscheck.helpers import fabricate, start_counts, two_family_prompts

FIXTURE = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "demo"


def _demo(tmp_path: Path, seeds=(0, 1)) -> Path:
    return fabricate(tmp_path / "demo", regimes=("grpo", "xgrpo", "sgt"), seeds=seeds, rescued={"sgt": 2, "xgrpo": 1})


def test_fixture_from_demo_runs(tmp_path):
    files = build_fixture(_demo(tmp_path), tmp_path / "fx", kernel=False)
    assert sorted(str(f.relative_to(tmp_path / "fx")) for f in files) == [
        "observed.json", "seed0.json.gz", *[f"seed0/{r}.dynamics.json.gz" for r in ("grpo", "sgt", "xgrpo")],
        "seed1.json.gz", *[f"seed1/{r}.dynamics.json.gz" for r in ("grpo", "sgt", "xgrpo")]]
    dyn = read_dynamics(tmp_path / "fx" / "seed1" / "sgt.dynamics.json.gz")
    assert dyn.run["seed"] == 1 and dyn.run["regime"]["name"] == "sgt" and dyn.prompts == dynamics_from_run(
        tmp_path / "demo" / "seed1" / "sgt").prompts
    m = read_success_matrix(tmp_path / "fx" / "seed1.json.gz")
    s0, g0 = start_counts(4, 4)
    order = np.argsort(two_family_prompts(4))
    # every regime starts from the same evaluation: one copy counted, not three
    assert m.samples.tolist() == np.full((2, 8), 4).tolist()
    assert m.successes.tolist() == s0[:, order].tolist() and m.greedy_known.tolist() == g0[:, order].tolist()
    assert m.run["regime"]["name"] == "grpo" and m.run["seed"] == 1 and m.curve_steps.tolist() == [0, 5, 10]
    assert sorted(m.outcomes) == ["grpo", "sgt", "xgrpo"]
    # a rescue set of 4 prompts per policy; sgt solves 2 of each policy's, xgrpo 1, grpo none
    assert [m.outcomes[r]["rescue_rate"] for r in ("grpo", "xgrpo", "sgt")] == [0.0, 0.25, 0.5]
    obs = json.loads((tmp_path / "fx" / "observed.json").read_text())
    assert obs["seeds"] == [0, 1] and obs["policies"] == ["alpha", "beta"]
    sgt = obs["outcomes"]["sgt"]
    assert sgt["rescue_set"] == 16 and sgt["rescue_rate"] == pytest.approx(0.5) and sgt["seeds"] == 2
    assert sgt["final_accuracy"] == pytest.approx(m.outcomes["sgt"]["final_accuracy"])


def test_distinct_starts_are_pooled_and_the_rescue_rate_is_weighted_by_set_size(tmp_path):
    demo = _demo(tmp_path, seeds=(0,))
    ev = demo / "seed0" / "sgt" / "eval.jsonl"
    rows = [json.loads(line) for line in ev.read_text().splitlines()]
    for r in rows:
        if r["step"] == 0 and r["policy"] == "alpha" and r["prompt_id"] == "add:0":
            r["successes"] = 4  # a different step-0 evaluation: pooled with the others' (identical) one
    ev.write_text("".join(json.dumps(r) + "\n" for r in rows))
    build_fixture(demo, tmp_path / "fx", kernel=False)
    m = read_success_matrix(tmp_path / "fx" / "seed0.json.gz")
    c = m.prompts.index("add:0")
    assert m.samples[0, c] == 8 and m.successes[0, c] == 1 + 4 and m.samples[1, 0] == 8
    per_seed = {0: m, 1: m}
    o = dict(m.outcomes["xgrpo"], rescue_rate=1.0, rescue_set=2)
    per_seed[1] = replace(m, outcomes={**m.outcomes, "xgrpo": o})
    pooled = observed_outcomes(per_seed)["xgrpo"]
    assert pooled["rescue_set"] == 10 and pooled["rescue_rate"] == pytest.approx((0.25 * 8 + 1.0 * 2) / 10)


def test_demo_directory_errors(tmp_path, capsys):
    with pytest.raises(SuccessMatrixError, match="is not a directory"):
        find_runs(tmp_path / "missing")
    (tmp_path / "empty" / "seed0" / "sft").mkdir(parents=True)
    with pytest.raises(SuccessMatrixError, match="no run directories under"):
        find_runs(tmp_path / "empty")
    demo = _demo(tmp_path)
    (demo / "seed1" / "sgt" / "summary.json").unlink()
    with pytest.raises(SuccessMatrixError, match="has not finished"):
        find_runs(demo)
    shutil.rmtree(demo / "seed1" / "sgt")
    with pytest.raises(SuccessMatrixError, match="seed 1 ran regimes"):
        build_fixture(demo, tmp_path / "fx")
    shutil.rmtree(demo / "seed1" / "grpo")
    with pytest.raises(SuccessMatrixError, match="has no grpo run"):
        build_fixture(demo, tmp_path / "fx")
    (demo / "seed1" / "xgrpo" / "config.json").write_text("{not json")
    with pytest.raises(SuccessMatrixError, match="is not a trainer config"):
        find_runs(demo)
    shutil.copytree(demo / "seed0" / "grpo", demo / "seed0" / "grpo-copy")
    shutil.rmtree(demo / "seed1")
    with pytest.raises(SuccessMatrixError, match="are both seed 0, regime grpo"):
        find_runs(demo)
    assert main(["--demo", str(tmp_path / "empty"), "--out", str(tmp_path / "fx")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("mrl_llm.demo.fixture: no run directories under")
    assert not (tmp_path / "fx").exists()


def test_command_writes_the_fixture(tmp_path, capsys):
    assert main(["--demo", str(_demo(tmp_path)), "--out", str(tmp_path / "fx"), "--no-kernel"]) == 0
    assert "8 success matrices and dynamics files, and observed.json" in capsys.readouterr().out



def test_committed_fixture_is_the_demos_five_seeds_and_pools_to_observed():
    obs = json.loads((FIXTURE / "observed.json").read_text())
    assert obs["seeds"] == [0, 1, 2, 3, 4]
    per_seed = {s: read_success_matrix(FIXTURE / f"seed{s}.json.gz") for s in obs["seeds"]}
    for s, m in per_seed.items():
        assert m.run["seed"] == s and m.run["regime"]["name"] == "grpo" and m.families is not None
        assert sorted(m.outcomes) == sorted(obs["outcomes"])
    pooled = observed_outcomes(per_seed)
    assert json.loads(json.dumps(pooled)) == obs["outcomes"]
