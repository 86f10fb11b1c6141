"""``success-matrix --run DIR`` and ``report --runs DIR`` on damaged or hand-edited run directories: every
refusal is one line (exit 2) naming the file, the ``.jsonl`` line, and what to do; ``--out`` may be a
directory, and the printed paths are the files written."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

from mrl_llm import cli
from mrl_llm.cli import main
from mrl_llm.metrics import read_metrics
from mrl_llm.success_matrix import matrix_from_run
from tests.crosscheck.helpers import start_counts, two_family_prompts, write_run


def _sm_run(tmp_path):
    s0, g0 = start_counts(4, 4)
    return write_run(tmp_path / "run", "sgt", {0: (s0, g0), 5: (np.minimum(s0 + 1, 4), g0)}, two_family_prompts(4))


def _eval_lines(d):
    return (d / "eval.jsonl").read_text().splitlines(keepends=True)


def _edit_line(path, i, **change):
    """Line ``i`` of JSONL file ``path`` with keys set (or dropped: ``_DROP``)."""
    lines = path.read_text().splitlines(keepends=True)
    r = json.loads(lines[i])
    for k, v in change.items():
        if v is _DROP:
            del r[k]
        else:
            r[k] = v
    lines[i] = json.dumps(r) + "\n"
    path.write_text("".join(lines))


def _edit_row(d, i, **change):
    _edit_line(d / "eval.jsonl", i, **change)


_DROP = object()


def _refused(capsys, argv, *parts):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err
    for p in parts:
        assert p in err, (p, err)
    return err


# ---------------------------------------------------------------- success-matrix


@pytest.mark.parametrize("damage, says", [
    (lambda d: _edit_row(d, 2, skipped=_DROP), ["eval.jsonl, line 3:", "no 'skipped'", "repair or remove the line"]),
    (lambda d: _edit_row(d, 2, policy="ghost"),
     ["eval.jsonl, line 3:", "policy 'ghost' is not one of", "config.json's policies (alpha, beta)"]),
    (lambda d: _edit_row(d, 4, samples="four"), ["eval.jsonl, line 5:", "samples 'four'", "repair or remove"]),
    (lambda d: _edit_row(d, 0, skipped="no"), ["eval.jsonl, line 1:", "skipped is 'no'"]),
    (lambda d: (d / "eval.jsonl").write_text("".join(_eval_lines(d)) + '{"step": 5, "policy": "al'),
     ["eval.jsonl, line 33: not a JSON row", "repair or remove the line", "train --resume drops it"]),
    (lambda d: (d / "eval.jsonl").write_text("[1, 2]\n" + "".join(_eval_lines(d))),
     ["eval.jsonl, line 1: not a JSON object"]),
])
def test_success_matrix_names_the_bad_eval_line(tmp_path, capsys, damage, says):
    d = _sm_run(tmp_path)
    damage(d)
    _refused(capsys, ["success-matrix", "--run", str(d)], str(d / "eval.jsonl"), *says)
    assert not (d / "success_matrix.json").exists()


def test_a_repeated_eval_row_is_refused_not_counted_twice(tmp_path, capsys):
    """A run writes each (step, policy, prompt) once (a resume cuts eval.jsonl back and skips done
    evaluations): a repeat is damage, and counting it would double the prompt's samples."""
    d = _sm_run(tmp_path)
    assert matrix_from_run(d).samples[0, 0] == 4
    lines = _eval_lines(d)
    (d / "eval.jsonl").write_text("".join(lines + [lines[0]]))
    _refused(capsys, ["success-matrix", "--run", str(d)], "eval.jsonl, line 33:", "step 0, policy 'alpha', prompt "
             "'add:0' (the first is line 1)", "remove the repeated line")


@pytest.mark.parametrize("edit, says", [
    (lambda c: c.pop("regime"), "config.json has no 'regime'"),
    (lambda c: c.pop("policies"), "config.json has no 'policies'"),
    (lambda c: c.update(steps="ten"), "steps is 'ten', not a whole number"),
    (lambda c: c.update(regime="sgt"), "'regime' has no 'name'"),
])
def test_success_matrix_names_the_bad_config_key(tmp_path, capsys, edit, says):
    d = _sm_run(tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    edit(cfg)
    (d / "config.json").write_text(json.dumps(cfg))
    _refused(capsys, ["success-matrix", "--run", str(d)], says, "restore it from the experiment's YAML")


def test_success_matrix_names_a_corrupt_config(tmp_path, capsys):
    d = _sm_run(tmp_path)
    (d / "config.json").write_text("{\n")
    _refused(capsys, ["success-matrix", "--run", str(d)], f"{d / 'config.json'}: not JSON (")


def test_success_matrix_out_may_be_a_directory(tmp_path, capsys):
    d, out = _sm_run(tmp_path), tmp_path / "out"
    out.mkdir()
    assert main(["success-matrix", "--run", str(d), "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == f"success matrix: {out / 'success_matrix.json'}"
    assert [p.name for p in out.iterdir()] == ["success_matrix.json"]  # no stray temporary file
    (out / "success_matrix.json").unlink()
    (out / "success_matrix.json").mkdir()  # a directory in the way of the file
    _refused(capsys, ["success-matrix", "--run", str(d), "--out", str(out)], "success_matrix.json is a directory",
             "pass --out FILE")
    assert [p.name for p in out.iterdir()] == ["success_matrix.json"]
    _refused(capsys, ["success-matrix", "--run", str(d), "--out", str(d / "config.json" / "m.json")],
             "config.json is a file, not a directory")


# ---------------------------------------------------------------- report


def _report_run(root, name="sgt", rows=None, summary=True):
    d = root / name
    d.mkdir(parents=True)
    rows = [{"kind": k, "step": s, "policy": p, "regime": name, "reward_mean": 0.5, "eval_accuracy": 0.25}
            for s in range(3) for p in ("a", "b") for k in ("train", "eval")] if rows is None else rows
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if summary:
        (d / "summary.json").write_text(json.dumps({"regime": name, "policies": [
            {"name": "a", "eval_accuracy": 0.5, "kl_to_ref": None}, {"name": "b", "eval_accuracy": 0.75}]}))
    return d


def _edit_metrics(d, i, **change):
    _edit_line(d / "metrics.jsonl", i, **change)


@pytest.mark.parametrize("damage, says", [
    (lambda d: _edit_metrics(d, 1, step=_DROP), "line 2: the eval row has no 'step'"),
    (lambda d: _edit_metrics(d, 0, policy=_DROP), "line 1: the train row has no 'policy'"),
    (lambda d: _edit_metrics(d, 0, reward_mean="high"), "line 1: reward_mean is 'high', not a number"),
    (lambda d: _edit_metrics(d, 3, eval_accuracy=[1]), "line 4: eval_accuracy is [1], not a number"),
    (lambda d: (d / "metrics.jsonl").write_text("[1, 2, 3]\n"), "line 1: not a JSON object"),
])
def test_report_names_the_bad_metrics_line(tmp_path, capsys, damage, says):
    d = _report_run(tmp_path / "runs")
    damage(d)
    _refused(capsys, ["report", "--runs", str(tmp_path / "runs")], f"{d / 'metrics.jsonl'}, {says}",
             "repair or remove the line")


def test_report_refuses_a_run_with_two_train_rows_of_one_step_and_policy(tmp_path, capsys):
    """Two processes on one run directory doubled every row; the report averaged them. A rolled-back row (a
    resume's) is not a duplicate."""
    rows = [{"kind": "train", "step": s, "policy": p, "regime": "sgt", "reward_mean": 0.5} for s in range(3) for p in "ab"]
    d = _report_run(tmp_path / "runs", rows=[*rows, {**rows[0], "rolled_back": True}])
    assert main(["report", "--runs", str(tmp_path / "runs")]) == 0
    capsys.readouterr()
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows + rows[2:]))
    _refused(capsys, ["report", "--runs", str(tmp_path / "runs")],
             f"{d / 'metrics.jsonl'}: 2 train rows of step 1, policy 'a' and 3 more (two processes wrote this run?)",
             "train it again into a new --out directory")


def test_read_metrics_refuses_a_row_that_is_not_an_object(tmp_path):
    p = tmp_path / "metrics.jsonl"
    p.write_text('{"kind": "train"}\n"text"\n')
    with pytest.raises(ValueError, match=r"metrics\.jsonl, line 2: not a JSON object; repair or remove the line"):
        read_metrics(p)


@pytest.mark.parametrize("summary, says", [
    ({"regime": "sgt"}, "summary.json has no 'policies' list"),
    ({"policies": []}, "summary.json has no 'regime' name"),
    ({"regime": "sgt", "policies": [{"eval_accuracy": 0.5}]}, "policies[0] has no 'name'"),
    ({"regime": "sgt", "policies": [{"name": "a", "entropy": "low"}]}, "policies[0].entropy is 'low', not a number"),
    ("{\n", "summary.json: not JSON ("),
])
def test_report_names_the_bad_summary(tmp_path, capsys, summary, says):
    d = _report_run(tmp_path / "runs")
    (d / "summary.json").write_text(summary if isinstance(summary, str) else json.dumps(summary))
    _refused(capsys, ["report", "--runs", str(tmp_path / "runs")], str(d / "summary.json"), says,
             "remove it to leave the run out of the table")


def test_report_of_runs_without_metrics_yet(tmp_path, capsys):
    root = tmp_path / "runs"
    empty = _report_run(root, "grpo", rows=[], summary=False)
    _refused(capsys, ["report", "--runs", str(root)], f"{empty / 'metrics.jsonl'} has no metrics rows yet",
             "run report again")
    assert not (root / "report.png").exists()
    _report_run(root, "sgt")  # a finished run beside the one just started: it is reported, the other named
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "No artists with labels" from an empty legend
        assert main(["report", "--runs", str(root)]) == 0
    out = capsys.readouterr().out
    assert "| sgt | a |" in out and f"left out (no metrics rows yet): {empty}" in out
    assert (root / "report.png").stat().st_size > 0


def test_report_without_eval_rows_draws_no_empty_legend(tmp_path, capsys):
    root = tmp_path / "runs"
    _report_run(root, rows=[{"kind": "train", "step": s, "policy": "a", "reward_mean": 0.5} for s in range(3)])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert main(["report", "--runs", str(root)]) == 0


def test_report_out_may_be_a_directory_and_the_printed_paths_are_true(tmp_path, capsys):
    root, out = tmp_path / "runs", tmp_path / "out"
    _report_run(root)
    out.mkdir()
    assert main(["report", "--runs", str(root), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"figure: {out / 'report.png'}\n" in printed and f"table: {out / 'report.md'}\n" in printed
    assert sorted(p.name for p in out.iterdir()) == ["report.md", "report.png"]
    assert "| sgt | a |" in (out / "report.md").read_text()
    fig = tmp_path / "new" / "fig.pdf"  # a figure file under a new directory: the table beside it
    assert main(["report", "--runs", str(root), "--out", str(fig)]) == 0
    assert fig.stat().st_size > 0 and (tmp_path / "new" / "fig.md").is_file()
    assert f"figure: {fig}\n" in capsys.readouterr().out


@pytest.mark.parametrize("out, says", [
    ("table.md", "neither a directory nor a figure file"),  # would overwrite the figure with the table
    ("fig", "neither a directory nor a figure file"),  # matplotlib would write fig.png, not fig
    ("sgt/summary.json/report.png", "summary.json is a file, not a directory; give a path under a directory"),
])
def test_report_refuses_an_out_it_cannot_write_as_named(tmp_path, capsys, out, says):
    root = tmp_path / "runs"
    _report_run(root)
    _refused(capsys, ["report", "--runs", str(root), "--out", str(root / out)], says)
    assert not list(root.rglob("report.*")) and not (root / "table.md").exists() and not (root / "fig.png").exists()


def test_report_runs_must_be_a_directory(tmp_path, capsys):
    (tmp_path / "f").write_text("")
    _refused(capsys, ["report", "--runs", str(tmp_path / "f")], "is a file; pass the directory")


def test_cli_turns_a_directory_error_into_one_line(monkeypatch, capsys):
    import mrl_llm.report as report

    def boom(*a, **k):
        raise IsADirectoryError(21, "Is a directory", "somewhere/report.png")

    monkeypatch.setattr(report, "make_report", boom)
    assert IsADirectoryError in cli.USER_ERRORS and NotADirectoryError in cli.USER_ERRORS
    _refused(capsys, ["report", "--runs", "x"], "somewhere/report.png: Is a directory")


def test_read_json_object_names_the_file_for_empty_and_malformed(tmp_path):
    from mrl_llm.runstate import read_json_object

    p = tmp_path / "x.json"
    for content, says in ((b"", "not JSON"), (b"[1]", "not a JSON object"), (b"\xff{}", "not JSON")):
        p.write_bytes(content)
        with pytest.raises(ValueError, match=rf"x\.json: {says}.*; restore it"):
            read_json_object(p, "restore it")
    p.write_text('{"a": 1}')
    assert read_json_object(p, "restore it") == {"a": 1}
