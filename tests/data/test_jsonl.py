"""JSONL datasets: schema, field mapping, clear errors naming file and line, nothing dropped silently."""

from __future__ import annotations

import json
import logging

import pytest

from mrl_llm.data import DataConfig, DataError, FieldMap, Problem, ProblemError, load_jsonl, write_jsonl
from mrl_llm.rewards import gold_checker
from mrl_llm.rewards.arithmetic import ArithmeticVerifier
from mrl_llm.rewards.mcq import MCQVerifier


def write(tmp_path, lines, name="d.jsonl"):
    path = tmp_path / name
    path.write_text(
        "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines),
        encoding="utf-8",
    )
    return path


def test_math_style_rows_default_schema(tmp_path):
    path = write(
        tmp_path,
        [
            {"question": "1+1?", "answer": r"It is $\boxed{2}$."},
            "",
            {"question": "2+2?", "answer": 4, "source": "x"},
        ],
    )
    rep = load_jsonl(DataConfig(path=str(path)))
    assert [p.prompt_id for p in rep.problems] == ["d:1", "d:3"]  # file stem and line number
    assert rep.problems[1].gold == "4" and rep.problems[1].meta == {"source": "x"}
    assert (rep.n_rows, rep.n_blank, rep.skipped) == (2, 1, ())
    assert rep.problems[0].verifier == "math"


def test_field_mapping_and_multiple_choice_rows(tmp_path):
    path = write(
        tmp_path,
        [
            {
                "uid": "q1",
                "prompt": "Capital of France?",
                "label": "B",
                "options": ["London", "Paris"],
                "subject": "geo",
            },
            {"uid": 7, "prompt": "Largest planet?", "label": "A", "options": {"A": "Jupiter", "B": "Mars"}},
        ],
    )
    fields = FieldMap(question="prompt", answer="label", id="uid", choices="options", family="subject")
    rep = load_jsonl(DataConfig(path=str(path), verifier="mcq", fields=fields))
    q1, q2 = rep.problems
    assert (q1.prompt_id, q1.choices, q1.family, q1.verifier) == ("q1", ("London", "Paris"), "geo", "mcq")
    assert (q2.prompt_id, q2.choices, q2.family) == ("7", ("Jupiter", "Mars"), None)
    assert q1.choice_letters == "AB" and q1.formatted_choices() == "A. London\nB. Paris"


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"question": "q", "answer": ', "not valid JSON"),
        ('["q", "a"]', "must be a JSON object"),
        ('{"answer": "1"}', "no question field 'question'"),
        ('{"question": "   ", "answer": "1"}', r"the question \('question'\) is empty"),
        ('{"question": 5, "answer": "1"}', "empty or not a string"),
        ('{"question": "q"}', "no answer field 'answer'"),
        ('{"question": "q", "answer": ""}', r"the answer \('answer'\) is empty"),
        ('{"question": "q", "answer": null}', r"the answer \('answer'\) is empty"),
        ('{"question": "q", "answer": "A", "choices": []}', "choices must be a non-empty list"),
        ('{"question": "q", "answer": "A", "choices": ["x", ""]}', r"choices\[1\]"),
        ('{"question": "q", "answer": "A", "choices": {"B": "x"}}', "must be the letters"),
        ('{"question": "q", "answer": "1", "family": 3}', "family"),
        ('{"question": "q", "answer": NaN}', r"the answer \('answer'\) is empty or not a string or finite number: nan"),
        ('{"question": "q", "answer": -Infinity}', "not a string or finite number: -inf"),  # was the gold "-inf"
        ('{"question": "q", "answer": 1e400}', "not a string or finite number: inf"),
        ('{"id": NaN, "question": "q", "answer": "1"}', r"id \('id'\) = nan must be"),
        ('{"question": "q", "answer": "1", "answer": "2"}', "key 'answer' is given twice in one object; keep one"),
        ('{"question": "q", "answer": "1", "meta": {"a": 1, "a": 2}}', "key 'a' is given twice"),  # was a: 2
    ],
)
def test_malformed_rows_name_file_and_line(tmp_path, line, message):
    path = write(tmp_path, ['{"question": "ok", "answer": "1"}', line])
    with pytest.raises(DataError, match=message) as err:
        load_jsonl(DataConfig(path=str(path)))
    assert f"{path}:2:" in str(err.value)


UNREADABLE_JSON = [  # JSON that json.loads fails on with other errors than JSONDecodeError
    ('{"question": "q", "answer": ' + "9" * 5000 + "}", "a number too long to read"),  # ValueError: digit limit
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),  # RecursionError
]


@pytest.mark.parametrize(("line", "message"), UNREADABLE_JSON)
def test_json_python_cannot_read_is_a_malformed_row(tmp_path, caplog, line, message):
    path = write(tmp_path, ['{"question": "ok", "answer": "1"}', line])
    with pytest.raises(DataError, match=message) as err:
        load_jsonl(DataConfig(path=str(path)))
    assert f"{path}:2:" in str(err.value)
    with caplog.at_level(logging.WARNING):
        rep = load_jsonl(DataConfig(path=str(path), on_malformed="skip"))
    assert [p.question for p in rep.problems] == ["ok"] and [s.line for s in rep.skipped] == [2]


def test_duplicate_ids_are_errors(tmp_path):
    path = write(
        tmp_path, [{"id": "a", "question": "q", "answer": "1"}, {"id": "a", "question": "r", "answer": "2"}]
    )
    with pytest.raises(DataError, match="duplicate id 'a' \\(first on line 1\\)"):
        load_jsonl(DataConfig(path=str(path)))


def test_skip_mode_counts_and_reports_every_bad_row(tmp_path, caplog):
    path = write(
        tmp_path,
        [
            {"question": "q1", "answer": "1"},
            "{oops",
            {"question": "", "answer": "1"},
            {"question": "q4", "answer": "4"},
        ],
    )
    with caplog.at_level(logging.WARNING):
        rep = load_jsonl(DataConfig(path=str(path), on_malformed="skip"))
    assert [p.question for p in rep.problems] == ["q1", "q4"]
    assert [s.line for s in rep.skipped] == [2, 3] and rep.n_rows == 4
    assert "2 skipped" in rep.summary()
    assert sum("skipping malformed row" in r.getMessage() for r in caplog.records) == 2


def test_unusable_golds_are_skipped_and_reported(tmp_path):
    path = write(tmp_path, [{"question": "1+1", "answer": "2"}, {"question": "2+2", "answer": "four"}])
    rep = load_jsonl(
        DataConfig(path=str(path), verifier="arithmetic"), check_gold=gold_checker(ArithmeticVerifier())
    )
    assert [p.gold for p in rep.problems] == ["2"]
    assert rep.skipped[0].line == 2 and "not an integer" in rep.skipped[0].reason
    mcq = write(tmp_path, [{"question": "q", "answer": "Z", "choices": ["a", "b"]}], name="m.jsonl")
    with pytest.raises(DataError, match="no usable problems"):
        load_jsonl(DataConfig(path=str(mcq), verifier="mcq"), check_gold=gold_checker(MCQVerifier()))


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(DataError, match="not found; check data.path"):
        load_jsonl(DataConfig(path=str(tmp_path / "nope.jsonl")))
    with pytest.raises(DataError, match=f"dataset path {tmp_path} is a directory; set data.path to a .jsonl file"):
        load_jsonl(DataConfig(path=str(tmp_path)))  # said "not found"
    empty = write(tmp_path, ["", "  "])
    with pytest.raises(DataError, match="no usable problems"):
        load_jsonl(DataConfig(path=str(empty)))


def test_an_unreadable_file_is_named_as_unreadable(tmp_path, monkeypatch):
    """The CLI turned the bare PermissionError into "choose a writable location" (tests run as root, so the
    refusal is simulated)."""
    from mrl_llm.data import jsonl

    path = write(tmp_path, [{"question": "q", "answer": "1"}])

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(jsonl, "open", refuse, raising=False)
    with pytest.raises(DataError, match=rf"cannot read dataset file {path} \(Permission denied\); check data.path"):
        load_jsonl(DataConfig(path=str(path)))


def test_config_validation():
    with pytest.raises(DataError, match="two roles"):
        FieldMap(question="text", answer="text")
    with pytest.raises(DataError, match="on_malformed"):
        DataConfig(path="x", on_malformed="ignore")
    with pytest.raises(DataError, match="limit"):
        DataConfig(path="x", limit=0)
    with pytest.raises(ProblemError, match="question"):
        Problem("p", "", "1", "math")


def test_limit_and_round_trip(tmp_path):
    problems = [
        Problem("a:1", "What is 1+0?", "1", "arithmetic", family="add", meta={"a": 1}),
        Problem("m:2", "Pick one", "B", "arithmetic", choices=("x", "y")),
        Problem("a:3", "What is 3+0?", "3", "arithmetic"),
    ]
    path = write_jsonl(problems, tmp_path / "sub" / "rt.jsonl")
    assert load_jsonl(DataConfig(path=str(path), verifier="arithmetic")).problems == tuple(problems)
    assert load_jsonl(DataConfig(path=str(path), verifier="arithmetic")).problems[0].meta == {"a": 1}
    assert len(load_jsonl(DataConfig(path=str(path), verifier="arithmetic", limit=2)).problems) == 2


def test_config_from_yaml_mapping():
    from shared_interfaces.config_io import ConfigError, from_mapping

    cfg = from_mapping(
        DataConfig, {"path": "x.jsonl", "verifier": "mcq", "fields": {"question": "prompt", "choices": None}}
    )
    assert cfg.fields.question == "prompt" and cfg.fields.choices is None and cfg.fields.answer == "answer"
    with pytest.raises(ConfigError, match="unknown key"):
        from_mapping(DataConfig, {"path": "x.jsonl", "fields": {"quesiton": "prompt"}})


def test_non_utf8_bytes_name_file_and_line(tmp_path, caplog):
    path = tmp_path / "d.jsonl"
    path.write_bytes(b'{"question": "q1", "answer": "1"}\n\n{"question": "caf\xe9?", "answer": "2"}\n'
                     b'{"question": "q4", "answer": "4"}\n')
    with pytest.raises(DataError, match=rf"{path}:3: not valid UTF-8 \(byte 0xe9 at column 18\)"):
        load_jsonl(DataConfig(path=str(path)))
    with caplog.at_level(logging.WARNING):
        rep = load_jsonl(DataConfig(path=str(path), on_malformed="skip"))
    assert [p.question for p in rep.problems] == ["q1", "q4"] and [s.line for s in rep.skipped] == [3]
    assert "UTF-8" in rep.skipped[0].reason and (rep.n_rows, rep.n_blank) == (3, 1)
    bom = tmp_path / "bom.jsonl"
    bom.write_bytes(b'\xef\xbb\xbf{"question": "q", "answer": "1"}\n')  # a UTF-8 byte-order mark is allowed
    assert [p.question for p in load_jsonl(DataConfig(path=str(bom))).problems] == ["q"]
