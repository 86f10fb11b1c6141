"""Reading fabricated run directories: layouts, errors, pooled step-0 counts, curves, solved sets."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from experiments.crosscheck.llm_runs import RunsError, discover, step0_counts
from tests.crosscheck.helpers import fabricate, start_counts, two_family_prompts, write_run


def test_demo_layout_and_flat_layout(tmp_path):
    fabricate(tmp_path / "demo", seeds=(0, 1))
    found, unfinished = discover(tmp_path / "demo")
    assert sorted(found) == [0, 1] and unfinished == []
    assert sorted(found[1]) == ["grpo", "sgt", "xgrpo"]
    flat, _ = discover(tmp_path / "demo" / "seed1")
    assert sorted(flat) == [1] and flat[1]["sgt"].path == found[1]["sgt"].path
    one, _ = discover(tmp_path / "demo" / "seed0" / "grpo")
    assert list(one[0]) == ["grpo"]


def test_regime_names_are_canonical(tmp_path):
    prompts = two_family_prompts()
    s, g = start_counts()
    write_run(tmp_path / "a", "grpo", {0: (s, g)}, prompts)
    write_run(tmp_path / "b", "xgrpo+sgt", {0: (s, g)}, prompts)
    found, _ = discover(tmp_path)
    assert sorted(found[0]) == ["grpo", "sgt+xgrpo"]


def test_errors_name_the_problem(tmp_path):
    with pytest.raises(RunsError, match="no run directories"):
        discover(tmp_path)
    prompts = two_family_prompts()
    s, g = start_counts()
    write_run(tmp_path / "x" / "sgt", "sgt", {0: (s, g)}, prompts)
    with pytest.raises(RunsError, match="no grpo run"):
        discover(tmp_path / "x")
    write_run(tmp_path / "y" / "a", "grpo", {0: (s, g)}, prompts)
    write_run(tmp_path / "y" / "b", "grpo", {0: (s, g)}, prompts)
    with pytest.raises(RunsError, match="two runs of regime grpo"):
        discover(tmp_path / "y")
    write_run(tmp_path / "z" / "grpo", "grpo", {0: (s, g)}, prompts)
    write_run(tmp_path / "z" / "sgt", "sgt", {0: (s, g)}, prompts, steps=20)
    with pytest.raises(RunsError, match="steps"):
        discover(tmp_path / "z")


def test_unfinished_runs_are_left_out(tmp_path):
    fabricate(tmp_path)
    (tmp_path / "seed0" / "xgrpo" / "summary.json").unlink()
    found, unfinished = discover(tmp_path)
    assert sorted(found[0]) == ["grpo", "sgt"]
    assert unfinished == [tmp_path / "seed0" / "xgrpo"]


def test_step0_counts_pool_distinct_evaluations_only(tmp_path):
    fabricate(tmp_path)  # three regimes with identical step-0 rows
    found, _ = discover(tmp_path)
    counts, pols, pids = step0_counts(found[0])
    s0, g0 = start_counts()
    assert pols == ("alpha", "beta") and pids == tuple(sorted(two_family_prompts()))
    order = [two_family_prompts().index(p) for p in pids]
    np.testing.assert_array_equal(counts.s, s0[:, order])
    np.testing.assert_array_equal(counts.n, 4)
    np.testing.assert_array_equal(counts.g, g0[:, order])
    # a run whose step-0 evaluation differs adds its samples
    path = tmp_path / "seed0" / "sgt" / "eval.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    for r in rows:
        if r["step"] == 0:
            r["successes"] = 0
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    counts2, _, _ = discover_counts(tmp_path)
    np.testing.assert_array_equal(counts2.n, 8)
    np.testing.assert_array_equal(counts2.s, s0[:, order])


def discover_counts(root):
    found, _ = discover(root)
    return step0_counts(found[0])


def test_curves_and_solved_sets(tmp_path):
    fabricate(tmp_path, rescued={"sgt": 2})
    found, _ = discover(tmp_path)
    run = found[0]["sgt"]
    steps, samp, greedy = run.accuracy_curve()
    np.testing.assert_array_equal(steps, [0, 5, 10])
    s0, _ = start_counts()
    assert samp[0, 0] == pytest.approx(s0[0].sum() / (8 * 4))
    # at step 5 each own-family prompt gained one success (capped at 4)
    assert samp[0, 1] == pytest.approx(np.minimum(s0[0, :4] + 1, 4).sum() / 32)
    pids = run.prompt_ids
    solved = run.solved(10, pids)
    assert solved[0, [pids.index("sub:0"), pids.index("sub:1")]].all()
    assert not solved[0, [pids.index("sub:2"), pids.index("sub:3")]].any()
    assert not found[0]["grpo"].solved(10, pids)[0, [pids.index(f"sub:{i}") for i in range(4)]].any()
    assert run.eval_k() == 4


def test_missing_step0_is_an_error(tmp_path):
    s, g = start_counts()
    write_run(tmp_path / "grpo", "grpo", {5: (s, g)}, two_family_prompts())
    with pytest.raises(RunsError, match="no step-0 evaluation"):
        discover(tmp_path)
    shutil.rmtree(tmp_path / "grpo")
