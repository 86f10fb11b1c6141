"""``bandit_sim predict`` (:mod:`bandit_sim.predict`) with the tabular model on the demo fixtures: the earlier
demo's (``tests/fixtures/demo_v1``, version-1 matrices without a split, lr 3e-4: its step-0 counts calibrate to
the cross-check's scenarios, and its predictions are pinned, so the tabular model's results stay unchanged) and
the current demo's (``tests/fixtures/demo``, version 2: a train / held-out split). The kernel model:
``tests/bandit/test_predict_kernel.py``."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from bandit_sim.calibrate import CalibrationConfig, Counts, calibrate
from bandit_sim.cli import main
from bandit_sim.predict import PredictOptions, observed_agreement, predict
from bandit_sim.scenario import load_scenario
from shared_interfaces.config_io import ConfigError
from shared_interfaces.success_matrix import (
    SuccessMatrixError,
    read_success_matrix,
    validate,
    write_success_matrix,
)

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests" / "fixtures" / "demo_v1"
FIXTURE_V2 = REPO / "tests" / "fixtures" / "demo"
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
    # the seed's own outcomes (the fixture's per-seed final accuracy and rescue rate) are compared in the output
    own = m.outcomes
    assert res["observed"]["rescue_rate"]["observed"] == {r: own[r]["rescue_rate"] for r in res["regimes"]}
    assert sorted(res["observed"]["rescue_rate"]["observed_ordering"]) == sorted(res["regimes"])
    assert res["model"] == "tabular" and res["regimes"]["grpo"]["heldout"]["mean"] is None  # no split in version 1


def test_the_tabular_model_on_a_split_matrix_trains_the_pool_only():
    """Version 2 (the current demo's fixture): held-out prompts are evaluated, never drawn, so the tabular model
    leaves their accuracy where it started; ``final`` is the pool's, the rescue set the pool's."""
    m = read_success_matrix(FIXTURE_V2 / "seed0.json.gz")
    res = predict(m, None, PredictOptions(seeds=2, regimes=("grpo", "sgt"), steps=5))
    train = np.array([x == "train" for x in m.split])
    rates = m.successes / m.samples
    start = [rates[i, ~train & (np.array(m.families) == f)].mean() for i, f in enumerate(("add", "sub"))]
    for v in res["regimes"].values():
        assert v["heldout"]["mean"] == pytest.approx(np.mean(start), abs=0.02)  # calibrated start, never moved
    cal = calibrate(Counts(m.samples, m.successes, m.greedy_known), m.prompts, m.policies, CalibrationConfig(),
                    steps=5, batch_prompts=16, group_size=8)
    assert sum(res["rescue_set_sizes"].values()) == int((cal.rescue & train).sum()) < int(cal.rescue.sum())


@pytest.mark.slow
def test_predict_with_the_probe_fit(tmp_path):
    """The seed's GRPO curve as the probe: the fit picks the lr, as the cross-check does."""
    m = read_success_matrix(FIXTURE / "seed0.json")
    res = predict(m, m, PredictOptions(seeds=8))
    assert res["free_settings"]["source"] == "fitted on the probe's GRPO curve"
    assert res["free_settings"]["rmse"] < res["free_settings"]["flat_baseline_rmse"]
    observed = json.loads((FIXTURE / "observed.json").read_text())["outcomes"]
    agree = observed_agreement(res["regimes"], observed)
    assert agree["regimes"] == list(res["regimes"])


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


def _tiny(prompts=2, **run):
    """A small valid success matrix (two policies), as a dict, with ``run`` keys over the defaults."""
    ids = [f"p{i}" for i in range(prompts)]
    return {"format": "mrl-success-matrix", "version": 1, "policies": ["a", "b"], "prompts": ids, "families": None,
            "samples": [[4] * prompts, [4] * prompts], "successes": [[1] * prompts, [0] * prompts],
            "greedy_correct": [[None] * prompts, [None] * prompts],
            "run": {"steps": 4, "prompts_per_step": 2, "group_size": 4, "seed": 0, "eval_k": 4,
                    "regime": {"name": "grpo"}, "loss": {}, **run}, "curve": None, "outcomes": None}


def _bounded(args, timeout=120):
    """``python ARGS`` in a subprocess that is killed after ``timeout`` s (the bugs here hung: a test must fail)."""
    import subprocess
    import sys

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    try:
        return subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"python {' '.join(args)[:80]}... still running after {timeout} s")


def _predict_cli(tmp_path, data, *flags):
    f = tmp_path / "m.json"
    f.write_text(json.dumps(data))
    return main(["predict", "--success-matrix", str(f), "--seeds", "2", "--regimes", "grpo", *flags])


def test_a_prediction_past_the_work_limit_is_refused_before_simulating(tmp_path, capsys):
    """``run.steps: 10**12`` in a 478-byte matrix simulated forever with no output: the work is now estimated from
    the settings and refused past --max-work, with the number and the flag."""
    f = tmp_path / "huge.json"
    f.write_text(json.dumps(_tiny(steps=10**12)))
    assert len(f.read_bytes()) < 500
    done = _bounded(["-m", "bandit_sim", "predict", "--success-matrix", str(f), "--seeds", "2", "--regimes", "grpo"])
    err = done.stderr
    assert done.returncode == 2 and err.count("\n") == 1, err
    work = 1 * 2 * 2 * (10**12 * 1 * 2 * (16 + 4) + 2 * 16)  # R S P (steps epochs B (K + G) + C K)
    assert f"about {work} arm draws" in err and f"more than --max-work {10**9}" in err
    assert f"pass --max-work {work} to run it" in err
    assert _predict_cli(tmp_path, _tiny(steps=10**12), "--steps", "5", "--max-work", "800") == 2
    assert "more than --max-work 800" in capsys.readouterr().err
    assert _predict_cli(tmp_path, _tiny(steps=10**12), "--steps", "5", "--max-work", str(2 * 2 * (5 * 2 * 20 + 32))) == 0
    assert "use: grpo" in capsys.readouterr().out
    m = read_success_matrix(FIXTURE / "seed0.json")  # a probe's fit over its grid of settings counts too
    with pytest.raises(ConfigError, match="plus the probe fit"):
        predict(m, m, PredictOptions(seeds=2, regimes=("grpo",), steps=1, max_work=10**6))
    assert _predict_cli(tmp_path, _tiny(), "--steps", str(2**63)) == 2
    assert "--steps 9223372036854775808 does not fit a signed 64-bit integer" in capsys.readouterr().err


def test_a_matrix_of_200000_prompts_is_read_in_linear_time(tmp_path):
    """The duplicate check counted each name in the whole list (quadratic): 200,000 prompts hung."""
    code = ("import time; from tests.bandit.test_predict import _tiny; from shared_interfaces.success_matrix import "
            "validate; d = _tiny(prompts=200_000); t = time.perf_counter(); validate(d); print(time.perf_counter() - t)")
    done = _bounded(["-c", code], timeout=60)
    assert done.returncode == 0, done.stderr
    data = _tiny(prompts=200_000)
    validate(data)
    data["prompts"][-1] = data["prompts"][7]
    with pytest.raises(SuccessMatrixError, match=r"'prompts' lists \['p7'\] more than once"):
        validate(data)


@pytest.mark.parametrize(("change", "msg"), [
    (lambda d: d["samples"][0].__setitem__(1, 2**63), "'samples'[0][1] must be an integer, got 9223372036854775808 (a count below 2**63)"),
    (lambda d: d["successes"][1].__setitem__(0, 2**70), "'successes'[1][0] must be an integer, got"),
    (lambda d: d["run"].__setitem__("steps", 2**64), "run.steps must be a positive integer (below 2**63)"),
    (lambda d: d["run"].__setitem__("seed", 2**63), "run.seed must be an integer in [0, 2**63)"),
    (lambda d: d["run"].__setitem__("loss", [0.2]), "run.loss must be null or the run's loss section"),
    (lambda d: d.__setitem__("curve", {"steps": [0, 2**63], "accuracy": [[0.1, 0.2], [0.1, 0.2]]}),
     "curve.steps must be a non-empty list of integers in [0, 2**63)"),
    (lambda d: d.__setitem__("outcomes", {r: {"final_accuracy": [0.5, 0.5], "rescue_rate": 0.1}
                                          for r in ("sgt+xgrpo", "xgrpo+sgt")}),
     "outcomes 'sgt+xgrpo' and 'xgrpo+sgt' name one regime (sgt+xgrpo); keep one of them"),
    (lambda d: d.__setitem__("outcomes", {"magic": {"final_accuracy": [0.5, 0.5]}}), "outcomes.magic: "),
    (lambda d: d["outcomes"]["grpo"].__setitem__("seeds", 2**63), "outcomes.grpo.seeds must be a positive integer"),
], ids=["samples", "successes", "steps", "seed", "loss-list", "curve", "two-names", "unknown", "seeds"])
def test_malformed_matrix_values_are_one_line_errors(tmp_path, capsys, change, msg):
    """Integers >= 2**63 and a ``loss`` that is a list gave tracebacks (numpy's OverflowError, an AttributeError);
    two outcome names of one regime silently kept one."""
    data = _tiny()
    data["outcomes"] = {"grpo": {"final_accuracy": [0.5, 0.5], "rescue_rate": 0.1}}
    change(data)
    assert _predict_cli(tmp_path, data, "--steps", "2") == 2  # (a run.steps of 2**64 would run forever unchecked)
    err = capsys.readouterr().err
    assert msg in err and err.count("\n") == 1 and "Traceback" not in err, err


def test_deep_nesting_and_a_huge_integer_in_the_file_are_one_line_errors(tmp_path, capsys):
    f = tmp_path / "deep.json"
    f.write_text('{"run": ' + "[" * 100_000 + "]" * 100_000 + "}")
    assert main(["predict", "--success-matrix", str(f)]) == 2
    err = capsys.readouterr().err
    assert "is nested too deeply to read" in err and err.count("\n") == 1
    f.write_text('{"version": ' + "9" * 5000 + "}")
    assert main(["predict", "--success-matrix", str(f)]) == 2
    err = capsys.readouterr().err
    assert "is not valid JSON" in err and err.count("\n") == 1


def test_outcomes_without_a_rescue_rate_are_reported_as_not_recorded(tmp_path, capsys):
    """``rescue_rate`` is optional in an outcome; predict read it with [] and raised KeyError."""
    data = _tiny()
    data["outcomes"] = {r: {"final_accuracy": [0.5, 0.4]} for r in ("grpo", "sgt", "xgrpo")}
    assert _predict_cli(tmp_path, data, "--regimes", "grpo,sgt,xgrpo") == 0
    assert "observed rescue_rate: not recorded in the matrix's outcomes" in capsys.readouterr().out
