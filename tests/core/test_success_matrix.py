"""The success-matrix format (:mod:`shared_interfaces.success_matrix`): round trip, and every malformed case
raises SuccessMatrixError naming the key."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest

from shared_interfaces.config_io import ConfigError
from shared_interfaces.success_matrix import (
    SuccessMatrix,
    SuccessMatrixError,
    from_dict,
    read_success_matrix,
    validate,
    write_success_matrix,
)


def good() -> dict:
    return {
        "format": "mrl-success-matrix", "version": 1, "policies": ["a", "b"], "prompts": ["x", "y", "z"],
        "families": ["add", "add", "sub"], "samples": [[4, 4, 4], [4, 4, 8]], "successes": [[0, 2, 4], [1, 0, 8]],
        "greedy_correct": [[False, None, True], [True, False, None]],
        "run": {"steps": 10, "prompts_per_step": 2, "group_size": 4, "seed": 0, "eval_k": 4,
                "regime": {"name": "grpo"}, "loss": {}},
        "curve": {"steps": [0, 5, 10], "accuracy": [[0.5, 0.6, None], [0.4, 0.5, 0.6]]},
        "outcomes": {"grpo": {"final_accuracy": [0.6, 0.6], "mean_accuracy": 0.6, "rescue_rate": None,
                              "rescue_set": 2, "seeds": 1}},
    }


def test_round_trip(tmp_path):
    m = from_dict(good())
    assert m.rates[0].tolist() == [0.0, 0.5, 1.0] and m.greedy_known.tolist() == [[False, False, True], [True, False, False]]
    p = write_success_matrix(tmp_path / "m.json", m)
    back = read_success_matrix(p)
    assert back.to_dict() == {**good(), "version": 2, "split": None, "kernel": None}  # version 1 read, 2 written
    assert np.isnan(back.curve_accuracy[0, 2]) and back.outcomes["grpo"]["rescue_set"] == 2


def test_gzip_round_trip_and_a_damaged_gzip(tmp_path):
    import gzip

    p = write_success_matrix(tmp_path / "m.json.gz", from_dict(good()))
    assert gzip.decompress(p.read_bytes()).startswith(b"{")
    assert read_success_matrix(p).to_dict() == read_success_matrix(write_success_matrix(tmp_path / "m.json",
                                                                                        from_dict(good()))).to_dict()
    p.write_bytes(p.read_bytes()[:10])
    with pytest.raises(SuccessMatrixError, match="not a readable gzip file"):
        read_success_matrix(p)


def test_minimal_matrix():
    d = good()
    for k in ("families", "run", "curve", "outcomes"):
        d[k] = None
    m = from_dict(d)
    assert m.run is None and m.curve_steps is None and m.outcomes == {}


def _with(path: str, value):
    d = good()
    obj = d
    keys = path.split(".")
    for k in keys[:-1]:
        obj = obj[k]
    if value is KeyError:
        del obj[keys[-1]]
    else:
        obj[keys[-1]] = value
    return d


@pytest.mark.parametrize(("data", "needle"), [
    ([], "expected a JSON object"),
    ({}, "'format' must be 'mrl-success-matrix'"),
    (_with("version", 3), "version 3 is not supported"),
    ({**good(), "split": None}, "unknown key(s) ['split']; known keys"),
    ({**good(), "extra": 1}, "unknown key(s) ['extra']"),
    (_with("policies", []), "'policies' must be a non-empty list"),
    (_with("policies", ["a", "a"]), "'policies' lists ['a'] more than once"),
    (_with("prompts", KeyError), "'prompts' must be a non-empty list"),
    (_with("families", ["add"]), "'families' must be null or a list of 3 strings"),
    (_with("samples", [[4, 4, 4]]), "'samples' must be a [P, C] = [2, 3] list of lists"),
    (_with("samples", [[4, 4, 4], [4, 4.5, 4]]), "'samples'[1][1] must be an integer, got 4.5"),
    (_with("samples", [[4, 0, 4], [4, 4, 8]]), "samples[0][1] (policy a, prompt y) is 0"),
    (_with("successes", [[0, 5, 4], [1, 0, 8]]), "successes[0][1] = 5 is outside [0, samples = 4]"),
    (_with("successes", [[0, -1, 4], [1, 0, 8]]), "successes[0][1] = -1 is outside"),
    (_with("greedy_correct", [[1, None, True], [True, False, None]]), "'greedy_correct'[0][0] must be true, false or null"),
    (_with("run.steps", 0), "run.steps must be a positive integer"),
    (_with("run.regime", "grpo"), "run.regime must be the run's regime section"),
    (_with("curve.steps", [5, 0, 10]), "curve.steps must be increasing and start at 0"),
    (_with("curve.steps", []), "curve.steps must be a non-empty list"),
    (_with("curve.accuracy", [[0.5, 0.6, 1.2], [0.4, 0.5, 0.6]]), "curve.accuracy[0][2] must be a number in [0, 1]"),
    (_with("curve.accuracy", [[0.5, 0.6]]), "curve.accuracy must be [P, T] = [2, 3]"),
    (_with("outcomes.grpo.final_accuracy", [0.6]), "outcomes.grpo.final_accuracy must be 2 numbers"),
    (_with("outcomes.grpo.rescue_rate", 2.0), "outcomes.grpo.rescue_rate must be null or a number in [0, 1]"),
    (_with("outcomes.grpo.speed", 1), "outcomes.grpo: unknown key(s) ['speed']"),
    (_with("outcomes.grpo.seeds", 0), "outcomes.grpo.seeds must be a positive integer"),
])
def test_malformed_matrices_name_the_problem(data, needle):
    with pytest.raises(SuccessMatrixError) as err:
        validate(copy.deepcopy(data), where="m.json")
    assert str(err.value).startswith("m.json: ") and needle in str(err.value)
    assert isinstance(err.value, ConfigError)  # the CLIs turn it into one line


def test_file_errors(tmp_path):
    with pytest.raises(SuccessMatrixError, match="does not exist; write one with"):
        read_success_matrix(tmp_path / "none.json")
    (tmp_path / "bad.json").write_text("{oops")
    with pytest.raises(SuccessMatrixError, match="bad.json is not valid JSON"):
        read_success_matrix(tmp_path / "bad.json")
    (tmp_path / "empty.json").write_text("")
    with pytest.raises(SuccessMatrixError, match="empty.json is not valid JSON"):
        read_success_matrix(tmp_path / "empty.json")
    (tmp_path / "v.json").write_text(json.dumps({**good(), "version": 9}))
    with pytest.raises(SuccessMatrixError, match=r"success matrix .*v.json: version 9"):
        read_success_matrix(tmp_path / "v.json")


def test_constructor_validates():
    with pytest.raises(SuccessMatrixError, match="successes"):
        SuccessMatrix(policies=("a",), prompts=("x",), samples=np.array([[2]]), successes=np.array([[3]]),
                      greedy_correct=np.array([[np.nan]]))
