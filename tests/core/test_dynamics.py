"""The dynamics format (:mod:`shared_interfaces.dynamics`): round trip, the helpers a simulator fit uses, and every
malformed case raises DynamicsError naming the file or the key."""

from __future__ import annotations

import json

import numpy as np
import pytest

from shared_interfaces.config_io import ConfigError
from shared_interfaces.dynamics import (
    Dynamics,
    DynamicsError,
    from_dict,
    read_dynamics,
    validate,
    write_dynamics,
)

RUN = {"name": "r", "seed": 3, "regime": {"name": "sgt", "sgt": {"weight": 0.05}}, "steps": 10, "prompts_per_step": 2,
       "group_size": 4, "eval_k": 4, "loss": {}, "split_from": "test"}


def good() -> dict:
    """2 policies, 2 evaluations (steps 0 and 10), 3 prompts: x, y in the pool, z held out."""
    return {
        "format": "mrl-dynamics", "version": 1, "policies": ["a", "b"], "prompts": ["x", "y", "z"],
        "families": ["add", "add", "sub"], "split": ["train", "train", "heldout"], "steps": [0, 10],
        "samples": [[[4, 4, 4], [4, 4, 0]], [[4, 4, 4], [4, 4, 4]]],
        "successes": [[[0, 2, 4], [1, 3, 0]], [[4, 4, 0], [4, 4, 1]]],
        "greedy_correct": [[[False, None, True], [True, True, None]], [[True, True, False], [True, True, False]]],
        "skipped": [[0, 1], [0, 0]],
        "entropy": {"steps": [0, 1, 9], "values": [[0.5, None, 0.25], [0.75, 0.5, 0]]},
        "run": dict(RUN),
    }


def test_round_trip(tmp_path):
    d = from_dict(good())
    p = write_dynamics(tmp_path / "d.json", d)
    back = read_dynamics(p)
    assert back.to_dict() == good()
    assert back.samples.dtype == np.int64 and back.samples.shape == (2, 2, 3)
    assert np.isnan(back.greedy_correct[0, 0, 1]) and np.isnan(back.entropy[0, 1]) and back.entropy[1, 2] == 0.0
    assert not list(tmp_path.glob(".*tmp"))  # written atomically, no temporary file left


def test_gzip_round_trip_and_a_damaged_gzip(tmp_path):
    import gzip

    p = write_dynamics(tmp_path / "d.json.gz", from_dict(good()))
    assert gzip.decompress(p.read_bytes()).startswith(b"{")
    assert read_dynamics(p).to_dict() == good()
    p.write_bytes(p.read_bytes()[:20])
    with pytest.raises(DynamicsError, match="not a readable gzip file"):
        read_dynamics(p)


def test_helpers_a_fit_uses():
    d = from_dict(good())
    assert d.split_index("train").tolist() == [0, 1] and d.split_index("heldout").tolist() == [2]
    r = d.rates
    assert r[0, 0].tolist() == [0.0, 0.5, 1.0] and np.isnan(r[0, 1, 2]) and r[1, 1, 2] == 0.25
    # pooled over the split's prompts: policy a at step 10 on the pool (1 + 3) / (4 + 4); a's z not sampled then
    acc = d.accuracy("train")
    assert acc.tolist() == [[2 / 8, 4 / 8], [8 / 8, 8 / 8]]
    held = d.accuracy("heldout")
    assert held[0, 0] == 1.0 and np.isnan(held[0, 1]) and held[1].tolist() == [0.0, 0.25]
    assert d.accuracy()[0].tolist() == [6 / 12, 4 / 8]
    with pytest.raises(DynamicsError, match="split 'eval' is not one of"):
        d.split_index("eval")


def test_an_empty_split_and_no_entropy_steps():
    g = good()
    g["split"] = ["train"] * 3
    g["entropy"] = {"steps": [], "values": [[], []]}
    d = from_dict(g)
    assert d.split_index("heldout").tolist() == [] and d.entropy.shape == (2, 0)
    assert np.isnan(d.accuracy("heldout")).all() and d.accuracy("heldout").shape == (2, 2)


def test_mismatch_names_what_differs_from_a_success_matrix_run():
    d = from_dict(good())
    same = {"steps": 10, "prompts_per_step": 2, "group_size": 4, "seed": 3, "eval_k": 4, "regime": {"name": "sgt"}}
    assert d.mismatch(same) == [] and d.mismatch(None) == []
    other = {**same, "seed": 4, "regime": {"name": "grpo"}}
    assert d.mismatch(other) == ["seed: 3 vs 4", "regime: 'sgt' vs 'grpo'"]


def _with(path: str, value) -> dict:
    d = good()
    obj = d
    keys = path.split(".")
    for k in keys[:-1]:
        obj = obj[int(k)] if isinstance(obj, list) else obj[k]
    last = keys[-1]
    if value is KeyError:
        del obj[last]
    elif isinstance(obj, list):
        obj[int(last)] = value
    else:
        obj[last] = value
    return d


@pytest.mark.parametrize("path, value, says", [
    ("format", "mrl-success-matrix", "'format' must be 'mrl-dynamics'"),
    ("version", 2, "version 2 is not supported"),
    ("version", KeyError, "version None is not supported"),
    ("extra", 1, "unknown key(s) ['extra']"),
    ("policies", [], "'policies' must be a non-empty list"),
    ("policies", ["a", "a"], "more than once"),
    ("prompts", [], "'prompts' must be a non-empty list"),  # no prompts
    ("prompts", ["x", "y", 3], "'prompts' must be a non-empty list of non-empty strings"),
    ("families", ["add"], "'families' must be null or a list of 3 strings"),
    ("split", ["train", "train"], "'split' must be a list of 3 entries"),
    ("split", ["train", "train", "eval"], "each \"train\" or \"heldout\""),
    ("steps", [], "'steps' must be a non-empty list"),  # no steps
    ("steps", [5, 10], "'steps' must start at 0"),
    ("steps", [0, 0], "'steps' must be increasing"),
    ("steps", [0, 10.0], "'steps' must be a non-empty list of step numbers"),
    ("steps", [0, 10, 20], "'samples' must be [P][T][C] = [2][3][3]"),  # mismatched lengths
    ("samples", [[[4, 4, 4]], [[4, 4, 4], [4, 4, 4]]], "'samples' must be [P][T][C] = [2][2][3]"),
    ("samples.0.0", [4, 4], "'samples' must be [P][T][C]"),
    ("samples.0.0.1", -1, "samples[0][0][1] (policy a, step 0, prompt y) must be a count"),  # negative
    ("samples.0.0.1", 4.0, "must be a count (an integer >= 0, below 2**63), got 4.0"),  # non-int
    ("samples.0.0.1", True, "got True"),
    ("samples.0.0.1", float("nan"), "got nan"),
    ("samples.0.0.1", 2 ** 63, "below 2**63"),
    ("successes.1.1.2", 5, "successes[1][1][2] (policy b, step 10, prompt z) = 5 exceeds samples = 4"),
    ("successes.1.1.2", -1, "successes[1][1][2] (policy b, step 10, prompt z) must be a count"),
    ("greedy_correct.0.1.0", 1, "greedy_correct[0][1][0] (policy a, step 10, prompt x) must be true, false or null"),
    ("skipped", [[0, 1]], "'skipped' must be [P][T] = [2][2] counts"),
    ("skipped.1", [0, -1], "'skipped' must be [P][T]"),
    ("entropy", None, "'entropy' must be an object with exactly 'steps' and 'values'"),
    ("entropy.steps", [0, 1], "entropy.values must be [P][U] = [2][2]"),
    ("entropy.steps", [1, 0, 9], "entropy.steps must be increasing"),
    ("entropy.values.0.0", float("nan"), "must be a finite number >= 0 or null, got nan; write a missing value as null"),
    ("entropy.values.0.0", float("inf"), "write a missing value as null"),
    ("entropy.values.0.0", -0.1, "entropy.values[0][0] (policy a, step 0) must be a finite number >= 0"),
    ("entropy.values.0.0", "0.5", "got '0.5'"),
    ("run", None, "'run' must be an object"),
    ("run.seed", -1, "run.seed must be an integer >= 0"),
    ("run.steps", 0, "run.steps must be an integer >= 1"),
    ("run.eval_k", KeyError, "run.eval_k must be an integer >= 0"),
    ("run.group_size", 2.5, "run.group_size must be an integer >= 1"),
    ("run.name", KeyError, "run.name must be the run's name"),
    ("run.regime", "sgt", "run.regime must be the run's regime section"),
])
def test_malformed(path, value, says):
    with pytest.raises(DynamicsError) as err:
        validate(_with(path, value), where="dynamics f.json")
    assert says in str(err.value) and str(err.value).startswith("dynamics f.json: ")
    assert "\n" not in str(err.value)
    assert isinstance(err.value, ConfigError)


def test_not_an_object():
    with pytest.raises(DynamicsError, match="expected a JSON object, got list"):
        validate([])


def test_null_entropy_and_greedy_only_evaluations_are_fine():
    g = good()
    g["entropy"]["values"] = [[None] * 3, [None] * 3]
    g["samples"] = [[[0] * 3] * 2] * 2  # eval.k 0: greedy only
    g["successes"] = [[[0] * 3] * 2] * 2
    g["run"]["eval_k"] = 0
    d = from_dict(g)
    assert np.isnan(d.entropy).all() and np.isnan(d.accuracy()).all() and np.isnan(d.rates).all()


def test_the_dataclass_validates_what_it_is_given():
    d = from_dict(good())
    with pytest.raises(DynamicsError, match=r"successes\[0\]\[0\]\[0\] .* exceeds samples"):
        Dynamics(**{**d.__dict__, "successes": d.samples + 1})
    with pytest.raises(DynamicsError, match="'split' must be a list of 3 entries"):
        Dynamics(**{**d.__dict__, "split": ("train",)})


def test_read_errors_name_the_file(tmp_path):
    with pytest.raises(DynamicsError, match=r"does not exist; write one with `python -m mrl_llm dynamics"):
        read_dynamics(tmp_path / "none.json")
    with pytest.raises(DynamicsError, match="is a directory; pass a dynamics file"):
        read_dynamics(tmp_path)
    write_dynamics(tmp_path / "dynamics.json", from_dict(good()))
    with pytest.raises(DynamicsError, match=f"is a directory; pass {tmp_path / 'dynamics.json'}"):
        read_dynamics(tmp_path)
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "mrl-dynamics", ')
    with pytest.raises(DynamicsError, match=f"dynamics {bad} is not valid JSON"):
        read_dynamics(bad)
    bad.write_bytes(b"\xff\xfe")
    with pytest.raises(DynamicsError, match="is not valid JSON"):
        read_dynamics(bad)
    bad.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(DynamicsError, match="nested too deeply|not valid JSON"):
        read_dynamics(bad)
    bad.write_text(json.dumps({**good(), "version": 7}))
    with pytest.raises(DynamicsError, match=f"dynamics {bad}: version 7 is not supported"):
        read_dynamics(bad)
    bad.write_text(json.dumps(good()).replace("0.75", "NaN"))  # Python's json reads NaN; the format does not
    with pytest.raises(DynamicsError, match=rf"dynamics {bad}: entropy.values\[1\]\[0\] .* got nan"):
        read_dynamics(bad)


def test_a_large_file_reads_back(tmp_path):
    """3 policies x 6 evaluations x 20,000 prompts (360,000 cells per array) read and write exactly."""
    rng = np.random.default_rng(0)
    P, T, C = 3, 6, 20_000
    n = rng.integers(0, 9, size=(P, T, C))
    g = np.where(n > 0, rng.integers(0, 2, size=(P, T, C)), np.nan)
    d = Dynamics(policies=("a", "b", "c"), prompts=tuple(f"p{i}" for i in range(C)),
                 split=tuple("train" if i % 3 else "heldout" for i in range(C)), steps=np.arange(T) * 10,
                 samples=n, successes=rng.integers(0, n + 1), greedy_correct=g, skipped=np.zeros((P, T), int),
                 entropy_steps=np.arange(60), entropy=rng.random((P, 60)), run=dict(RUN), families=None)
    back = read_dynamics(write_dynamics(tmp_path / "big.json", d))
    assert (back.samples == d.samples).all() and (back.successes == d.successes).all()
    assert np.array_equal(back.greedy_correct, d.greedy_correct, equal_nan=True)
    assert (back.entropy == d.entropy).all() and back.split == d.split
