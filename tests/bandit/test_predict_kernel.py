"""``bandit_sim predict --model kernel`` on the committed demo fixture (``tests/fixtures/demo``: per seed the success
matrix with the policies' transfer kernels and every regime's per-prompt dynamics, ``python -m mrl_llm.demo.fixture``),
its errors, and (slow) the numbers of ``experiments/crosscheck/README.md`` pinned so that a regression fails."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from bandit_sim.cli import main
from bandit_sim.kernel_fit import LR_GRID, curves_from_dynamics
from bandit_sim.predict import PredictOptions, predict
from shared_interfaces.config_io import ConfigError
from shared_interfaces.dynamics import read_dynamics
from shared_interfaces.success_matrix import SuccessMatrixError, read_success_matrix

FIXTURE = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "demo"


def _seed(s: int):
    return read_success_matrix(FIXTURE / f"seed{s}.json.gz"), read_dynamics(FIXTURE / f"seed{s}" / "grpo.dynamics.json.gz")


def test_the_fixture_holds_kernels_splits_and_every_regimes_dynamics():
    for s in range(5):
        m, dyn = _seed(s)
        assert m.kernel.shape == (2, 186, 186) and m.split.count("train") == 64 and m.run["seed"] == s
        assert all(len(e["logprob"]) == 186 for e in m.kernel_meta["policies"])
        for r in ("grpo", "xgrpo", "prp_snapshot", "prp_thl", "sgt"):
            d = read_dynamics(FIXTURE / f"seed{s}" / f"{r}.dynamics.json.gz")
            assert d.run["regime"]["name"] == r and d.run["seed"] == s and list(d.steps) == [0, 25, 50, 75, 100]
        cv = curves_from_dynamics(dyn, m.prompts, m.policies)
        assert cv.train.tolist() == [x == "train" for x in m.split]


@pytest.mark.slow
def test_kernel_prediction_on_one_seed(capsys):
    m, dyn = _seed(0)
    res = predict(m, None, PredictOptions(seeds=4, model="kernel", regimes=("grpo", "sgt")), dyn)
    assert res["model"] == "kernel" and set(res["regimes"]) == {"grpo", "sgt"}
    for v in res["regimes"].values():
        for k in ("final", "heldout", "heldout_change", "rescue_rate"):
            assert v[k]["mean"] is not None and v[k]["ci95"] > 0
    assert res["clear_winner"] == (not res["ties_with_use"])
    # the fit is the best point of the profile over the learning rates (a joint search from one start stopped at
    # lr 0.2, a few log-likelihood units short), and the predictions mix the learning rates it cannot tell apart
    f = res["free_settings"]
    assert [p["lr"] for p in f["profile"]] == list(LR_GRID)
    assert f["log_likelihood"] == max(p["log_likelihood"] for p in f["profile"]) > -3819.0 and f["lr"] == 0.1
    assert len(f["weights"]) == 2 and sum(w["weight"] for w in f["weights"]) == pytest.approx(1.0)
    # SGT rescues the peer's family far more than GRPO, and pays on its own family's held-out prompts
    assert res["regimes"]["sgt"]["rescue_rate"]["mean"] > 2 * res["regimes"]["grpo"]["rescue_rate"]["mean"]
    assert res["regimes"]["sgt"]["heldout"]["mean"] < res["regimes"]["grpo"]["heldout"]["mean"]
    assert main(["predict", "--success-matrix", str(FIXTURE / "seed0.json.gz"), "--model", "kernel", "--dynamics",
                 str(FIXTURE / "seed0" / "grpo.dynamics.json.gz"), "--seeds", "2", "--regimes", "grpo,sgt",
                 "--objective", "heldout"]) == 0
    out = capsys.readouterr().out
    assert "kernel model: adam lr" in out and "predictions mixed with weights lr 0.1" in out and "held-out" in out.replace("heldout", "held-out") and "use: " in out


def test_kernel_model_errors(capsys):
    m, dyn = _seed(0)
    opts = PredictOptions(seeds=2, model="kernel", regimes=("grpo",))
    with pytest.raises(SuccessMatrixError, match="python -m mrl_llm kernel --run"):
        predict(replace(m, kernel=None, kernel_meta=None), None, opts, dyn)
    with pytest.raises(SuccessMatrixError, match="pass --dynamics"):
        predict(m, None, opts, None)
    other = read_dynamics(FIXTURE / "seed1" / "grpo.dynamics.json.gz")
    with pytest.raises(SuccessMatrixError, match="another run than the success matrix.*seed"):
        predict(m, None, opts, other)
    fewer = replace(dyn, prompts=dyn.prompts[:-1] + ("add:99+99",))
    with pytest.raises(ConfigError, match="prompts are not the success matrix's"):
        predict(m, None, opts, fewer)
    swapped = replace(dyn, policies=("qwen-add", "gpt2-mul"))
    with pytest.raises(ConfigError, match="trains policies"):
        curves_from_dynamics(swapped, m.prompts, m.policies)
    with pytest.raises(ConfigError, match="pass --model kernel"):
        predict(m, None, PredictOptions(seeds=2, regimes=("grpo",)), dyn)
    with pytest.raises(ConfigError, match="--model must be tabular or kernel"):
        PredictOptions(model="magic")
    assert main(["predict", "--success-matrix", str(FIXTURE / "seed0.json.gz"), "--model", "kernel", "--seeds", "2"]) == 2
    assert "pass --dynamics" in capsys.readouterr().err


@pytest.mark.slow
def test_the_crosscheck_numbers_on_the_five_seeds():
    """``python -m experiments.crosscheck.kernel_demo`` (issue 40's acceptance, ``experiments/crosscheck/README.md``):
    the means over the 5 seeds, pinned at the checks the kernel model meets (the tabular model meets none of the
    final-accuracy ones: SGT - GRPO +0.085, the wrong sign). The ``use`` and coverage checks it misses are not
    pinned."""
    from experiments.crosscheck.kernel_demo import seed_result

    per = {s: seed_result(FIXTURE, s, 16) for s in range(5)}

    def mean(f):
        return float(np.mean([f(per[s]) for s in per]))

    for r, bound in (("grpo", 2.0), ("xgrpo", 2.0), ("prp_thl", 2.0), ("prp_snapshot", 2.0), ("sgt", 1.5)):
        ratio = mean(lambda x, r=r: x["kernel"]["regimes"][r]["rescue_rate"]["mean"]) / mean(
            lambda x, r=r: x["observed"][r]["rescue_rate"])
        assert 1 / bound <= ratio <= bound, (r, ratio)
    d_pred = mean(lambda x: x["kernel"]["regimes"]["sgt"]["final"]["mean"] - x["kernel"]["regimes"]["grpo"]["final"]["mean"])
    d_obs = mean(lambda x: x["observed"]["sgt"]["final"] - x["observed"]["grpo"]["final"])
    assert d_obs < 0 and d_pred < 0 and abs(d_pred - d_obs) <= 0.03
    p_pred = mean(lambda x: x["kernel"]["regimes"]["prp_snapshot"]["final"]["mean"]
                  - x["kernel"]["regimes"]["grpo"]["final"]["mean"])
    p_obs = mean(lambda x: x["observed"]["prp_snapshot"]["final"] - x["observed"]["grpo"]["final"])
    assert abs(p_pred - p_obs) <= 0.05
    h_pred = mean(lambda x: x["kernel"]["regimes"]["grpo"]["heldout_change"]["mean"])
    h_obs = mean(lambda x: x["observed"]["grpo"]["heldout_change"])
    assert abs(h_pred - h_obs) <= 0.10
    sh_pred = mean(lambda x: x["kernel"]["regimes"]["sgt"]["heldout"]["mean"] - x["kernel"]["regimes"]["grpo"]["heldout"]["mean"])
    sh_obs = mean(lambda x: x["observed"]["sgt"]["heldout_change"] - x["observed"]["grpo"]["heldout_change"])
    assert abs(sh_pred - sh_obs) <= 0.08
    print(json.dumps({"sgt_minus_grpo_final": [d_pred, d_obs], "grpo_heldout_change": [h_pred, h_obs],
                      "sgt_minus_grpo_heldout": [sh_pred, sh_obs]}))
