"""``experiments/study/select.py``: the acceptance checks' numbers of a study directory on selection seeds, and
the chance that a 3-seed check passes."""

from __future__ import annotations

import json

import pytest

from experiments.study.select import load, p3, report


def _curves(own_s: dict, reward: dict, own: dict, excl_s: dict) -> dict:
    return {"own_s": own_s, "reward": reward, "own": own, "excl_s": excl_s}


def _study(tmp_path, gains: list[float]) -> None:
    runs = {}
    for s, g in enumerate(gains):
        runs[f"grpo/seed{s}"] = {"p": _curves({"0": 0.4, "10": 0.4 + g}, {"0": 0.5, "10": 0.5 + 2 * g},
                                              {"0": 0.7, "10": 0.7}, {"0": 0.0, "10": 0.0})}
        runs[f"sgt/seed{s}"] = {"p": _curves({"0": 0.4, "10": 0.4 + g - 0.03}, {"0": 0.5, "10": 0.5},
                                             {"0": 0.7, "10": 0.7}, {"0": 0.0, "10": 0.02 + 0.002 * (s % 3)})}
    (tmp_path / "study.json").write_text(json.dumps({"steps": [0, 10], "runs": runs}))


def test_report_gives_the_paired_differences_and_the_three_seed_pass_chance(tmp_path):
    _study(tmp_path, [0.10, 0.11, 0.12, 0.10, 0.11, 0.12])
    res, seeds, pols, steps = load(tmp_path)
    assert seeds == [0, 1, 2, 3, 4, 5] and pols == ["p"] and steps == [0, 10] and res[("grpo", 0)]["p"]["own_s"][10] == 0.5
    text = "\n".join(report(str(tmp_path)))
    assert "| p | +0.110 ± 0.009* (" in text and "P3 1.00" in text  # a gain of ~12 seed sds passes with 3 seeds
    assert "peer-exclusive sampled +0.022 ± 0.002*" in text and "own held-out sampled -0.030" in text
    # a gain of about one seed sd rarely passes with 3 seeds; one seed: no estimate; no gain: never
    assert 0.1 < p3([0.0, 0.02, 0.04]) < 0.3 and p3([0.1]) is None and p3([]) is None and p3([0.0, 0.0]) == 0.0


def test_a_directory_without_a_study_report_is_an_error_that_says_what_to_run(tmp_path):
    with pytest.raises(SystemExit, match="no study.json; run `python -m mrl_llm study --out"):
        load(tmp_path)


def test_a_malformed_study_report_is_an_error_that_says_what_to_run(tmp_path):
    for text in ("{not json", "{}", "[]"):
        (tmp_path / "study.json").write_text(text)
        with pytest.raises(SystemExit, match="not a study report .*rerun `python -m mrl_llm study --out"):
            load(tmp_path)
