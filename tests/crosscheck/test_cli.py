"""``python -m experiments.crosscheck`` end to end on a tiny fabricated runs directory."""

from __future__ import annotations

import json

import numpy as np
import pytest

from experiments.crosscheck.__main__ import main
from tests.crosscheck.helpers import fabricate

TINY = ["--bandit-seeds", "3", "--sgd-lrs", "0.5,4", "--adam-lrs", "", "--epochs", "1", "--sgt-factors", "1,100"]


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    root = tmp_path_factory.mktemp("xc")
    fabricate(root / "runs", regimes=("grpo", "xgrpo", "prp_snapshot", "sgt"), seeds=(0, 1),
              rescued={"grpo": 0, "xgrpo": 1, "prp_snapshot": 2, "sgt": 4})
    out = root / "out"
    assert main(["--llm-runs", str(root / "runs"), "--out", str(out), *TINY]) == 0
    return out


def test_writes_report_plots_numbers_and_scenarios(report):
    for name in ("report.md", "crosscheck.json", "curves.png", "fit.png", "ordering.png", "rescue.png",
                 "scenario_seed0.npz", "scenario_seed1.npz"):
        assert (report / name).is_file() and (report / name).stat().st_size > 0, name
    text = (report / "report.md").read_text()
    for reg in ("grpo", "xgrpo", "prp_snapshot", "sgt"):
        assert reg in text
    assert "![curves](curves.png)" in text and "Spearman" in text


def test_numbers_match_the_fabrication(report):
    res = json.loads((report / "crosscheck.json").read_text())
    assert res["llm_runs"]["seeds"] == [0, 1]
    assert res["llm_runs"]["regimes"] == ["grpo", "xgrpo", "prp_snapshot", "sgt"]
    assert res["llm_runs"]["prompts"] == 8
    for c in res["calibration"].values():
        for pol in c["policies"].values():
            assert pol["rescue_set"] == 4 and pol["never_solved"] == 4
            assert pol["bandit_step0_accuracy"] == pytest.approx(pol["llm_step0_sample_accuracy"], abs=1e-3)
    rescued = {"grpo": 0, "xgrpo": 1, "prp_snapshot": 2, "sgt": 4}
    for reg, m in rescued.items():
        r = res["regimes"][reg]["rescue"]
        assert r["set_size"] == 2 * 2 * 4  # 2 seeds x 2 policies x 4 prompts
        assert r["observed"] == 2 * 2 * m
        assert r["tp"] + r["fn"] == r["observed"] and r["tp"] + r["fp"] == r["predicted"]
        assert res["regimes"][reg]["llm"]["rescue_rate"] == pytest.approx(m / 4)
        assert res["regimes"][reg]["rescue_curve"]["llm"][-1] == pytest.approx(m / 4)
        assert res["regimes"][reg]["rescue_curve"]["llm"][0] == 0.0
    # the ordering statistics are those of the reported values
    from bandit_sim.stats import spearman

    regs = res["llm_runs"]["regimes"]
    for key in ("final", "mean", "rescue_rate"):
        b = [res["regimes"][r]["bandit"][key] for r in regs]
        llm = [res["regimes"][r]["llm"][key] for r in regs]
        got = res["ordering"][key]["spearman"]["statistic"]
        assert got is None and np.isnan(spearman(b, llm)) or got == pytest.approx(spearman(b, llm))
    fit = res["fit"]
    assert len(fit["grid"]) == 2 and fit["best"] in fit["grid"]
    assert fit["best"]["sse"] == min(g["sse"] for g in fit["grid"])
    scan = res["sgt_weight_scan"]
    assert [(s["factor"], s["regime"]) for s in scan] == [(1.0, "sgt"), (100.0, "sgt")]
    assert scan[1]["rescue_rate"] >= scan[0]["rescue_rate"]


def test_bad_input_exits_2(tmp_path, capsys):
    assert main(["--llm-runs", str(tmp_path / "nothing"), "--out", str(tmp_path / "o")]) == 2
    assert "is not a directory" in capsys.readouterr().err
    assert main(["--llm-runs", str(tmp_path), "--out", str(tmp_path / "o"), "--sgd-lrs", "", "--adam-lrs", ""]) == 2
    assert "grid is empty" in capsys.readouterr().err


def test_rescue_auc_is_reported(report):
    res = json.loads((report / "crosscheck.json").read_text())
    assert res["regimes"]["grpo"]["rescue"]["auc"] is None  # nothing observed rescued
    a = res["regimes"]["sgt"]["rescue"]["auc"]
    assert a is None  # every rescue prompt observed rescued: no negatives
    b = res["regimes"]["xgrpo"]["rescue"]["auc"]
    assert b is not None and 0.0 <= b <= 1.0
