"""``bandit_sim predict`` (:mod:`bandit_sim.predict`) on the committed demo fixture (``tests/fixtures/demo``,
built from the demo's runs by ``python -m mrl_llm.demo.fixture``): its step-0 counts calibrate to the
cross-check's scenarios; the prediction's ordering is compared with the demo's
observed LLM ordering as a rank correlation (reported, not asserted equal)."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from bandit_sim.calibrate import CalibrationConfig, Counts, calibrate
from bandit_sim.cli import main
from bandit_sim.predict import PredictOptions, observed_agreement, predict
from bandit_sim.scenario import load_scenario
from shared_interfaces.success_matrix import SuccessMatrixError, read_success_matrix, write_success_matrix

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests" / "fixtures" / "demo"
CROSSCHECK = REPO / "experiments" / "crosscheck" / "demo"


@pytest.mark.parametrize("seed", range(5))
def test_fixture_calibrates_to_the_crosschecks_scenarios(seed):
    m = read_success_matrix(FIXTURE / f"seed{seed}.json")
    run = m.run
    cal = calibrate(Counts(m.samples, m.successes, m.greedy_known), m.prompts, m.policies, CalibrationConfig(),
                    steps=run["steps"], batch_prompts=run["prompts_per_step"], group_size=run["group_size"])
    ref = load_scenario(CROSSCHECK / f"scenario_seed{seed}.npz")
    np.testing.assert_allclose(cal.scenario.init_logits, ref.init_logits, rtol=0, atol=1e-9)
    cc = json.loads((CROSSCHECK / "crosscheck.json").read_text())["calibration"][str(seed)]["policies"]
    assert [int(cal.rescue[i].sum()) for i in range(2)] == [cc[p]["rescue_set"] for p in m.policies]


def test_predict_on_the_fixture_against_the_observed_ordering(capsys):
    m = read_success_matrix(FIXTURE / "seed0.json")
    res = predict(m, None, PredictOptions(seeds=4))
    assert res["free_settings"]["source"].startswith("preset paper (no --probe-run")
    assert set(res["regimes"]) == {"grpo", "xgrpo", "prp_snapshot", "prp_thl", "sgt"}
    assert res["rescue_set_sizes"] == {"qwen-add": 33, "llama-sub": 26}
    for v in res["regimes"].values():
        assert 0 <= v["final"]["mean"] <= 1 and v["final"]["ci95"] >= 0 and 0 <= v["rescue_rate"]["mean"] <= 1
    assert res["use"] == res["ordering"]["final"][0]
    observed = json.loads((FIXTURE / "observed.json").read_text())["outcomes"]
    agree = observed_agreement(res["regimes"], observed)
    for key in ("final", "rescue_rate"):
        rho = agree[key]["spearman"]
        assert -1.0 <= rho <= 1.0
        print(f"predict (preset lr) vs the demo's 5-seed LLM ordering by {key}: Spearman {rho:.2f}")
    # the seed's own outcomes (the fixture's per-seed final accuracy and rescue rate) are compared in the output
    own = m.outcomes
    assert res["observed"]["rescue_rate"]["observed"] == {r: own[r]["rescue_rate"] for r in res["regimes"]}
    assert sorted(res["observed"]["rescue_rate"]["observed_ordering"]) == sorted(res["regimes"])
    for key in ("final", "rescue_rate"):
        rho = res["observed"][key]["spearman"]
        assert -1.0 <= rho <= 1.0
        print(f"predict (preset lr) vs seed 0's own LLM ordering by {key}: Spearman {rho:.2f}")


@pytest.mark.slow
def test_predict_with_the_probe_fit(tmp_path):
    """The seed's GRPO curve as the probe: the fit picks the lr, as the cross-check does."""
    m = read_success_matrix(FIXTURE / "seed0.json")
    res = predict(m, m, PredictOptions(seeds=8))
    assert res["free_settings"]["source"] == "fitted on the probe's GRPO curve"
    assert res["free_settings"]["rmse"] < res["free_settings"]["flat_baseline_rmse"]
    observed = json.loads((FIXTURE / "observed.json").read_text())["outcomes"]
    agree = observed_agreement(res["regimes"], observed)
    for key in ("final", "rescue_rate"):
        for name, rho in (("the 5-seed", agree[key]["spearman"]), ("seed 0's own", res["observed"][key]["spearman"])):
            assert not math.isnan(rho)
            print(f"predict (probe fit {res['free_settings']}) vs {name} LLM ordering by {key}: Spearman {rho:.2f}")


def test_cli_predict(tmp_path, capsys):
    out = tmp_path / "p.json"
    assert main(["predict", "--success-matrix", str(FIXTURE / "seed1.json"), "--seeds", "3", "--regimes",
                 "grpo,sgt", "--objective", "rescue", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "preset paper (no --probe-run: not fitted)" in text and "use: " in text
    assert "rescue-set sizes" in text and "predicted ordering by rescue rate" in text
    res = json.loads(out.read_text())
    assert res["objective"] == "rescue" and res["use"] == res["ordering"]["rescue_rate"][0]


def test_predict_errors(tmp_path, capsys):
    m = read_success_matrix(FIXTURE / "seed0.json")
    norun = write_success_matrix(tmp_path / "norun.json", replace(m, run=None))
    assert main(["predict", "--success-matrix", str(norun), "--seeds", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "give --steps, --prompts-per-step, --group-size" in err
    other = write_success_matrix(tmp_path / "other.json", replace(m, policies=("x", "y")))
    with pytest.raises(SuccessMatrixError, match="the probe must train the same policies"):
        predict(m, read_success_matrix(other), PredictOptions(seeds=2))
    nocurve = replace(m, curve_steps=None, curve_accuracy=None)
    with pytest.raises(SuccessMatrixError, match="--probe-run has no learning curve"):
        predict(m, nocurve, PredictOptions(seeds=2))
    sgt_probe = replace(m, run={**m.run, "regime": {**m.run["regime"], "name": "sgt"}})
    with pytest.raises(SuccessMatrixError, match="the fit needs a GRPO probe"):
        predict(m, sgt_probe, PredictOptions(seeds=2))
    (tmp_path / "bad.json").write_text(json.dumps({"format": "mrl-success-matrix", "version": 1}))
    assert main(["predict", "--success-matrix", str(tmp_path / "bad.json")]) == 2
    assert "'policies' must be a non-empty list" in capsys.readouterr().err
    assert main(["predict", "--success-matrix", str(tmp_path / "none.json")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["predict", "--success-matrix", str(FIXTURE / "seed0.json"), "--regimes", "magic"]) == 2
    assert "magic" in capsys.readouterr().err
    assert main(["predict", "--success-matrix", str(FIXTURE / "seed0.json"), "--seeds", "1"]) == 2
    assert "--seeds must be >= 2" in capsys.readouterr().err
    assert main(["predict", "--success-matrix", str(FIXTURE / "seed0.json"), "--arms", "1000000000"]) == 2
    assert "1000000000 arms is beyond 4096" in capsys.readouterr().err
    for flag, value in (("--eval-k", "-2"), ("--eval-k", "0"), ("--steps", "0"), ("--group-size", "0")):
        assert main(["predict", "--success-matrix", str(FIXTURE / "seed0.json"), flag, value]) == 2
        assert f"{flag} must be >= 1, got {value}" in capsys.readouterr().err
    raw = json.loads((FIXTURE / "seed0.json").read_text())
    for bad in (-4, "4"):
        (tmp_path / "k.json").write_text(json.dumps({**raw, "run": {**raw["run"], "eval_k": bad}}))
        assert main(["predict", "--success-matrix", str(tmp_path / "k.json")]) == 2
        assert "run.eval_k must be a positive integer or null" in capsys.readouterr().err
    (tmp_path / "run").mkdir()
    assert main(["predict", "--success-matrix", str(tmp_path / "run")]) == 2
    assert "is a directory; pass a success-matrix file" in capsys.readouterr().err
    write_success_matrix(tmp_path / "run" / "success_matrix.json", m)
    assert main(["predict", "--success-matrix", str(tmp_path / "run")]) == 2
    assert f"is a directory; pass {tmp_path / 'run' / 'success_matrix.json'}" in capsys.readouterr().err


def test_a_probe_without_evaluations_or_past_its_steps_is_refused():
    m = read_success_matrix(FIXTURE / "seed0.json")
    blank = replace(m, curve_accuracy=np.where(np.arange(m.curve_steps.size) == 0, m.curve_accuracy, np.nan))
    with pytest.raises(SuccessMatrixError, match="curve has no accuracy after step 0"):
        predict(m, blank, PredictOptions(seeds=2))
    late = replace(m, curve_steps=m.curve_steps * (m.run["steps"] + 1))
    with pytest.raises(SuccessMatrixError, match="past its run's"):
        predict(m, late, PredictOptions(seeds=2))


def test_prompts_per_step_above_the_matrix_prompts_is_reported_as_capped(capsys):
    """A step draws each of the matrix's prompts at most once: a larger --prompts-per-step is capped, and the
    output says what was used and what was given (it echoed the value given)."""
    m = read_success_matrix(FIXTURE / "seed1.json")
    n = len(m.prompts)
    assert main(["predict", "--success-matrix", str(FIXTURE / "seed1.json"), "--seeds", "2", "--regimes", "grpo",
                 "--steps", "2", "--prompts-per-step", str(n + 50)]) == 0
    text = capsys.readouterr().out
    assert f"prompts_per_step {n + 50} is capped at the matrix's {n} prompts" in text
    res = predict(m, None, PredictOptions(seeds=2, regimes=("grpo",), steps=2, prompts_per_step=n + 50))
    assert (res["run"]["prompts_per_step"], res["run"]["prompts_per_step_given"]) == (n, n + 50)
    res = predict(m, None, PredictOptions(seeds=2, regimes=("grpo",), steps=2, prompts_per_step=n))
    assert res["run"]["prompts_per_step"] == n and "prompts_per_step_given" not in res["run"]
