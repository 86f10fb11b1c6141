"""``python -m mrl_llm data prepare`` on bad inputs: ``--out`` is checked before the source is read (a
directory or a path under a file is a one-line error; a missing parent is made) and no failure leaves a
temporary file; a source that is not UTF-8 is named by file and line; duplicate ids and gold answers the
verifier cannot use are refused, or left out and counted under ``on_malformed: skip`` — so whatever
prepare writes loads in train."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from mrl_llm import rewards
from mrl_llm.cli import main as cli_main
from mrl_llm.data import DataConfig, load_jsonl
from mrl_llm.data.prepare import prepare


def _config(tmp_path: Path, verifier: str = "arithmetic", on_malformed: str = "error") -> Path:
    cfg = tmp_path / "exp.yaml"
    cfg.write_text("policies: [{name: a, model_dir: Qwen/Qwen2.5-Math-1.5B}]\n"
                   f"data: {{path: data/train.jsonl, verifier: {verifier}, on_malformed: {on_malformed}}}\n")
    return cfg


def _rows(*rows: dict) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


def _prepare(tmp_path: Path, src: Path, *extra: str, **cfg: str) -> int:
    cfg_file = _config(tmp_path, **cfg)
    return cli_main(["data", "prepare", "--config", str(cfg_file), "--source", str(src), *extra])


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    lines = [x for x in err.strip().splitlines() if x.startswith("mrl_llm data: ")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def _loads_in_train(path: Path, verifier: str = "arithmetic") -> list[str]:
    """The ids train's loader reads from ``path`` (every row must load: no skips)."""
    v = rewards.get_verifier(verifier)
    try:
        report = load_jsonl(DataConfig(path=str(path), verifier=verifier), check_gold=rewards.gold_checker(v))
    finally:
        rewards.close_verifier(v)
    assert report.skipped == ()
    return [p.prompt_id for p in report.problems]


def _skipping(tmp_path: Path) -> DataConfig:
    return DataConfig(path=str(tmp_path / "out.jsonl"), verifier="arithmetic", on_malformed="skip")


@pytest.fixture
def good(tmp_path: Path) -> Path:
    src = tmp_path / "good.jsonl"
    src.write_text(_rows({"question": "1+1?", "answer": "2"}, {"question": "2+2?", "answer": 4}))
    return src


# --out -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("force", [[], ["--force"]])
def test_out_a_directory_is_refused_and_nothing_is_written_beside_it(tmp_path, capsys, good, force):
    out = tmp_path / "outdir"
    out.mkdir()
    assert _prepare(tmp_path, good, "--out", str(out), *force) == 2
    assert "--out" in (line := _one_line_error(capsys)) and "is a directory; give a file path" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exp.yaml", "good.jsonl", "outdir"]
    assert list(out.iterdir()) == []


def test_out_under_a_file_is_refused_before_the_source_is_read(tmp_path, capsys):
    src = tmp_path / "latin1.jsonl"
    src.write_bytes(b'{"question": "caf\xe9?", "answer": "1"}\n')  # would fail if it were read
    assert _prepare(tmp_path, src, "--out", str(src / "x.jsonl")) == 2
    line = _one_line_error(capsys)
    assert f"{src} is a file, not a directory" in line and "UTF-8" not in line


def test_a_missing_out_directory_is_made(tmp_path, capsys, good):
    out = tmp_path / "new" / "sub" / "train.jsonl"
    assert _prepare(tmp_path, good, "--out", str(out)) == 0
    assert "wrote 2 rows" in capsys.readouterr().out
    assert _loads_in_train(out) == ["good:0", "good:1"]
    assert [p.name for p in out.parent.iterdir()] == ["train.jsonl"]


def test_a_failed_write_leaves_no_temporary_file(tmp_path, good, monkeypatch):
    out = tmp_path / "train.jsonl"

    def disk_full(self, target):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "replace", disk_full)
    with pytest.raises(OSError, match="No space left"):
        prepare(DataConfig(path=str(out), verifier="arithmetic"), str(good))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["good.jsonl"]


# encoding --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name,content,where", [
    ("src.jsonl", b'{"question": "1+1?", "answer": "2"}\n\n{"question": "caf\xe9?", "answer": "1"}\n', ":3:"),
    ("src.json", b'[\n {"question": "1+1?", "answer": "2"},\n {"question": "caf\xe9?", "answer": 1}\n]', ":3:"),
])
def test_a_source_that_is_not_utf8_is_named_by_file_and_line(tmp_path, capsys, name, content, where):
    src = tmp_path / name
    src.write_bytes(content)
    assert _prepare(tmp_path, src) == 2
    line = _one_line_error(capsys)
    assert f"{src}{where} not valid UTF-8 (byte 0xe9" in line and "save the file as UTF-8" in line
    assert not (tmp_path / "data").exists()


def test_a_byte_order_mark_is_read_as_train_reads_it(tmp_path, good):
    src = tmp_path / "bom.jsonl"
    src.write_bytes(b"\xef\xbb\xbf" + good.read_bytes())
    path, n = prepare(DataConfig(path=str(tmp_path / "out.jsonl"), verifier="arithmetic"), str(src))
    assert n == 2 and _loads_in_train(path) == ["bom:0", "bom:1"]


def test_skip_leaves_out_undecodable_lines_as_train_does(tmp_path, caplog):
    src = tmp_path / "src.jsonl"
    src.write_bytes(b'{"question": "caf\xe9?", "answer": "1"}\nnot json\n{"question": "1+1?", "answer": "2"}')
    with caplog.at_level(logging.WARNING, logger="mrl_llm.data.prepare"):
        path, n = prepare(_skipping(tmp_path), str(src))
    assert n == 1 and _loads_in_train(path) == ["src:2"]
    assert "skipped 2 of 3 rows" in caplog.text and f"{src}:1: not valid UTF-8" in caplog.text


@pytest.mark.parametrize("name,content,where", [
    ("src.jsonl", '{"question": "1+1?", "answer": "2"}\n{"question": "q", "answer": ' + "9" * 5000 + "}\n",
     "src.jsonl:2: holds a number too long to read"),
    ("src.json", '[{"question": "1+1?", "answer": ' + "9" * 5000 + "}]", "src.json: holds a number too long to read"),
    ("src.jsonl", '{"question": "1+1?", "answer": "2"}\n' + "[" * 100_000 + "]" * 100_000 + "\n",
     "src.jsonl:2: JSON nested too deeply"),
    ("src.json", "[" * 100_000 + "]" * 100_000, "src.json: JSON nested too deeply"),
])
def test_json_python_cannot_read_is_named_by_file(tmp_path, capsys, name, content, where):
    src = tmp_path / name
    src.write_text(content)
    assert _prepare(tmp_path, src) == 2
    assert where in _one_line_error(capsys)
    assert not (tmp_path / "data").exists()


# duplicate ids ---------------------------------------------------------------------------------------------


def test_duplicate_ids_are_refused_naming_the_id_and_both_lines(tmp_path, capsys):
    src = tmp_path / "dup.jsonl"
    src.write_text(_rows({"id": "p1", "question": "1+1?", "answer": "2"}, {"id": "p2", "question": "Q", "answer": 3})
                   + "\n" + _rows({"id": "p1", "question": "2+2?", "answer": 4}))
    assert _prepare(tmp_path, src) == 2
    line = _one_line_error(capsys)
    assert f"{src}:4: duplicate id 'p1' (first at {src}:1)" in line and "on_malformed: skip" in line
    assert not (tmp_path / "data").exists()


def test_an_explicit_id_equal_to_a_filled_in_one_is_a_duplicate(tmp_path, capsys):
    src = tmp_path / "dup.jsonl"
    src.write_text(_rows({"question": "1+1?", "answer": 2}, {"id": "dup:0", "question": "Q", "answer": 4}))
    assert _prepare(tmp_path, src) == 2
    assert "duplicate id 'dup:0'" in _one_line_error(capsys)


def test_skip_keeps_the_first_row_of_an_id_and_counts_the_rest(tmp_path, caplog):
    src = tmp_path / "dup.json"
    src.write_text(json.dumps([{"id": 7, "question": "1+1?", "answer": "2"},
                               {"id": "7", "question": "Q", "answer": "3"},
                               {"id": "8", "question": "2+2?", "answer": "4"}]))
    with caplog.at_level(logging.WARNING, logger="mrl_llm.data.prepare"):
        path, n = prepare(_skipping(tmp_path), str(src))
    assert n == 2 and _loads_in_train(path) == ["7", "8"]
    assert "skipped 1 of 3 rows" in caplog.text
    assert f"{src} row 1: duplicate id '7' (first at {src} row 0)" in caplog.text


# gold answers ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("verifier,answer,reason", [
    ("arithmetic", "two", "the gold 'two' is not an integer"),
    ("math", "see \\boxed{}", "no final answer"),
])
def test_a_gold_answer_the_verifier_cannot_use_is_refused(tmp_path, capsys, verifier, answer, reason):
    src = tmp_path / "src.jsonl"
    src.write_text(_rows({"question": "1+1?", "answer": "\\boxed{2}" if verifier == "math" else "2"},
                         {"question": "Q?", "answer": answer}))
    assert _prepare(tmp_path, src, verifier=verifier) == 2
    line = _one_line_error(capsys)
    assert f"{src}:2: gold answer unusable by verifier {verifier!r}: {reason}" in line
    assert "on_malformed: skip" in line and not (tmp_path / "data").exists()


def test_skip_leaves_out_unusable_gold_answers_and_reports_the_count(tmp_path, capsys, caplog):
    src = tmp_path / "src.jsonl"
    src.write_text(_rows({"question": "Q?", "answer": "two"}, {"question": "1+1?", "answer": "2"}))
    with caplog.at_level(logging.WARNING, logger="mrl_llm.data.prepare"):
        assert _prepare(tmp_path, src, on_malformed="skip") == 0
    assert "wrote 1 rows" in capsys.readouterr().out and "skipped 1 of 2 rows" in caplog.text
    assert "on_malformed: skip to leave" not in caplog.text  # no hint to set what is already set
    assert _loads_in_train(tmp_path / "data" / "train.jsonl") == ["src:1"]


# empty sources ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name,content,match", [
    ("src.jsonl", "", "has no rows; nothing written"),
    ("src.jsonl", "\n  \n\n", "has no rows; nothing written"),
    ("src.json", "[]", "has no rows; nothing written"),
    ("src.json", "", "src.json: not valid JSON (Expecting value at column 1)"),
    ("src.jsonl", _rows({"question": "Q?", "answer": "two"}), "has no usable rows (1 skipped; first: "),
])
def test_an_empty_source_writes_nothing(tmp_path, capsys, name, content, match):
    src = tmp_path / name
    src.write_text(content)
    assert _prepare(tmp_path, src, on_malformed="skip") == 2
    assert match in _one_line_error(capsys)
    assert not (tmp_path / "data").exists()
