"""``mrl_llm``'s success matrix of a run directory (:mod:`mrl_llm.success_matrix`) and its command."""

from __future__ import annotations

import json

import numpy as np
import pytest

from mrl_llm.cli import main
from mrl_llm.success_matrix import matrix_from_run, write_run_matrix
from shared_interfaces.success_matrix import SuccessMatrixError, read_success_matrix
from tests.crosscheck.helpers import llm_config, start_counts, two_family_prompts, write_run


def _run(tmp_path, regime="sgt"):
    prompts = two_family_prompts(4)
    s0, g0 = start_counts(4, 4)
    s1 = np.minimum(s0 + 1, 4) * (s0 > 0)
    s1[0, 4] = 1  # alpha solves one of its rescue prompts (sub:0) at the end
    return write_run(tmp_path / regime, regime, {0: (s0, g0), 5: (s1, s1 > 2), 10: (s1, s1 > 2)}, prompts)


def test_matrix_of_a_run(tmp_path):
    d = _run(tmp_path)
    m = matrix_from_run(d)
    s0, g0 = start_counts(4, 4)
    order = np.argsort(two_family_prompts(4))
    assert m.policies == ("alpha", "beta") and list(m.prompts) == sorted(two_family_prompts(4))
    assert m.samples.tolist() == np.full((2, 8), 4).tolist()
    assert m.successes.tolist() == s0[:, order].tolist() and m.greedy_known.tolist() == g0[:, order].tolist()
    assert m.families == tuple(p.split(":")[0] for p in m.prompts)
    assert m.run["steps"] == 10 and m.run["group_size"] == 4 and m.run["regime"]["name"] == "sgt"
    assert m.curve_steps.tolist() == [0, 5, 10]
    assert m.curve_accuracy[0, 0] == pytest.approx(s0[0].sum() / 32)
    o = m.outcomes["sgt"]
    # every prompt of the other family is in each policy's rescue set: 4 + 4; alpha solved one of them
    assert o["rescue_set"] == 8 and o["rescue_rate"] == pytest.approx(1 / 8) and o["seeds"] == 1


def test_written_at_run_end_and_by_the_command(tmp_path, capsys):
    d = _run(tmp_path)
    assert write_run_matrix(d) == d / "success_matrix.json"
    assert read_success_matrix(d / "success_matrix.json").to_dict() == matrix_from_run(d).to_dict()
    assert main(["success-matrix", "--run", str(d), "--out", str(tmp_path / "m.json")]) == 0
    assert "success matrix:" in capsys.readouterr().out
    assert json.loads((tmp_path / "m.json").read_text())["format"] == "mrl-success-matrix"


def test_run_without_evaluation(tmp_path, capsys):
    d = tmp_path / "noeval"
    d.mkdir()
    (d / "config.json").write_text("{}")
    assert write_run_matrix(d) is None  # a run with eval disabled writes none, and does not fail
    assert main(["success-matrix", "--run", str(d)]) == 2
    assert "is not a run directory with an evaluation" in capsys.readouterr().err
    (d / "config.json").write_text(json.dumps(llm_config("grpo")))  # ("{}" is a damaged config: its own error)
    (d / "eval.jsonl").write_text("")
    with pytest.raises(SuccessMatrixError, match="has no step-0 evaluation"):
        matrix_from_run(d)
    assert main(["success-matrix", "--run", str(tmp_path / "missing")]) == 2


def test_a_greedy_only_start_writes_no_matrix_at_run_end_and_the_command_says_why(tmp_path, caplog):
    d = _run(tmp_path)
    rows = [json.loads(line) for line in (d / "eval.jsonl").read_text().splitlines()]
    for r in rows:  # eval.k: 0 -- greedy only, no sampled successes to estimate a start from
        r["samples"], r["successes"] = 0, 0
    (d / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(SuccessMatrixError):
        matrix_from_run(d)
    assert write_run_matrix(d) is None and not (d / "success_matrix.json").exists()
    assert "no success_matrix.json written" in caplog.text
    with pytest.raises(SuccessMatrixError):
        write_run_matrix(d, tmp_path / "m.json")


# -- split: the run's pool or only evaluated (mrl_llm.run_problems) -------------------------------------------------

def _exchange(d, steps: dict[int, list[str]]) -> None:
    (d / "exchange.jsonl").write_text("".join(json.dumps({"step": s, "prompt_id": p, "policy_id": "alpha"}) + "\n"
                                              for s, ids in steps.items() for p in ids))


def test_split_from_the_runs_problems_json(tmp_path):
    prompts = two_family_prompts(4)
    s0, g0 = start_counts(4, 4)
    d = write_run(tmp_path / "r", "grpo", {0: (s0, g0)}, prompts, pool=["add:0", "sub:3", "mul:9"])
    m = matrix_from_run(d)
    assert [p for p, s in zip(m.prompts, m.split, strict=True) if s == "train"] == ["add:0", "sub:3"]
    assert m.heldout_index.tolist() == [1, 2, 3, 4, 5, 6]
    assert read_success_matrix(write_run_matrix(d)).split == m.split


def test_split_from_the_exchange_once_the_pool_has_been_drawn_whole(tmp_path):
    prompts = two_family_prompts(4)
    s0, g0 = start_counts(4, 4)
    d = write_run(tmp_path / "r", "grpo", {0: (s0, g0)}, prompts, pool=[], prompts_per_step=2)
    _exchange(d, {0: ["add:0", "add:1"], 1: ["add:2", "add:0"]})  # 4 draws of 3 prompts: an epoch is complete
    assert matrix_from_run(d).split == ("train", "train", "train", "heldout", "heldout", "heldout", "heldout",
                                        "heldout")
    _exchange(d, {0: ["add:0", "add:1"], 1: ["add:2", "add:3"]})  # 4 draws of 4: the pool may be larger
    with pytest.raises(SuccessMatrixError, match="cannot tell which of .* evaluated prompts it trained on"):
        matrix_from_run(d)


def test_split_undecidable_refuses_the_command_and_writes_none_at_run_end(tmp_path, capsys, caplog):
    prompts = two_family_prompts(4)
    s0, g0 = start_counts(4, 4)
    d = write_run(tmp_path / "r", "grpo", {0: (s0, g0)}, prompts, pool=[])
    with pytest.raises(SuccessMatrixError, match="no problems.json .* no data section"):
        matrix_from_run(d)
    assert main(["success-matrix", "--run", str(d)]) == 2
    assert "cannot tell which" in capsys.readouterr().err
    assert write_run_matrix(d) is None and "no success_matrix.json written" in caplog.text


def test_split_from_the_configs_data_section(tmp_path):
    from mrl_llm.data import Problem, write_jsonl

    prompts = two_family_prompts(4)
    s0, g0 = start_counts(4, 4)
    d = write_run(tmp_path / "r", "grpo", {0: (s0, g0)}, prompts, pool=[])
    data = write_jsonl([Problem(prompt_id=p, question=f"q {p}", gold="1", verifier="arithmetic")
                        for p in ("sub:1", "sub:2", "mul:0")], tmp_path / "train.jsonl")
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "data": {"path": str(data), "verifier": "arithmetic"}}))
    assert [p for p, s in zip(*(lambda m: (m.prompts, m.split))(matrix_from_run(d)), strict=True)
            if s == "train"] == ["sub:1", "sub:2"]
    data.unlink()
    with pytest.raises(SuccessMatrixError, match="cannot load the run's data again"):
        matrix_from_run(d)


def test_a_damaged_problems_json_is_named(tmp_path):
    prompts = two_family_prompts(4)
    s0, g0 = start_counts(4, 4)
    d = write_run(tmp_path / "r", "grpo", {0: (s0, g0)}, prompts)
    (d / "problems.json").write_text("{oops")
    with pytest.raises(SuccessMatrixError, match=r"problems.json: not JSON"):
        matrix_from_run(d)
    (d / "problems.json").write_text(json.dumps({"format": "mrl-run-problems", "version": 1, "train": [1], "eval": []}))
    with pytest.raises(SuccessMatrixError, match="'train' must be a list of prompt ids"):
        matrix_from_run(d)
