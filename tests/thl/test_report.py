"""``python -m mrl_llm.thl report``: statistics of a pair on a JSONL file, and its errors."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from mrl_llm.thl.report import main, pair_report
from tests.thl.conftest import REPO_ROOT

ROWS = [{"answer": "We have $x^2 = 4$.\n\nSo $x = 2$."}, {"answer": "café 😀 — done  "}, {"answer": ""}]


@pytest.fixture(scope="module")
def saved(tmp_path_factory, tiny_tokenizers):
    root = tmp_path_factory.mktemp("thl_report")
    for name in ("tiny_bl", "tiny_sp_bpe"):
        tiny_tokenizers[name].save_pretrained(root / name)
    data = root / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS), encoding="utf-8")
    return root


def test_report_prints_the_pair_statistics(saved, capsys):
    assert main(["report", "--source", str(saved / "tiny_bl"), "--target", str(saved / "tiny_sp_bpe"), "--data", str(saved / "data.jsonl"), "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["sequences"] == 3 and stats["eos_counterparts"] == 3
    assert stats["source"]["kind"] == "byte_level" and stats["target"]["kind"] == "metaspace"
    assert stats["peer_text_equal"] == 3 and stats["learner_text_equal_normalised"] == 3
    assert stats["unaligned_mass"] == 0.0 and stats["mass_identity_max_error"] < 1e-9
    assert stats["words"] == 9 + 5 + 0  # trailing whitespace is a word of its own


def test_report_on_real_pair_counts_qwen_boundary_tokens(real_tokenizers):
    texts = ["Thus $x=1$.\n\nTherefore $y=2$.\n\nDone."]
    stats = pair_report(real_tokenizers["llama2"], real_tokenizers["qwen1.5"], texts)
    assert stats["boundary_conflicts"] >= 2  # Qwen's '.\n\n' tokens cross into the next word
    assert stats["moved_mass_fraction"] > 0 and stats["word_mass_error_max"] > 0


def test_report_module_entry_point(saved):
    run = [sys.executable, "-m", "mrl_llm.thl", "report", "--source", str(saved / "tiny_sp_bpe"), "--target", str(saved / "tiny_bl")]
    out = subprocess.run([*run, "--data", str(saved / "data.jsonl")], capture_output=True, text=True, cwd=REPO_ROOT, check=True).stdout
    assert "THL report" in out and "EOS counterparts: 3/3" in out and "unaligned mass: 0" in out


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"--data": "missing.jsonl"}, "data file .* not found; pass --data"),
        ({"--source": "nope"}, "tokenizer dir .* not found; pass --source"),
        ({"--target": "nope"}, "tokenizer dir .* not found; pass --target"),
        ({"--field": "question"}, "no text field question; pass --field"),
        ({"--source": "empty_dir"}, "--source: .*empty_dir holds no tokenizer files .* save_pretrained"),
    ],
)
def test_report_errors_say_what_to_do(saved, change, message, capsys):
    (saved / "empty_dir").mkdir(exist_ok=True)
    args = {"--source": "tiny_sp_bpe", "--target": "tiny_bl", "--data": "data.jsonl", **change}
    argv = ["report"] + [x for k, v in args.items() for x in (k, v if k == "--field" else str(saved / v))]
    assert main(argv) == 2  # a user error: one line, exit 2, as the other CLIs
    err = capsys.readouterr().err
    assert re.search(message, err) and err.count("\n") == 1


@pytest.mark.parametrize(("flag", "value", "message"), [("--limit", "0", "must be >= 1, got 0"),
                                                         ("--limit", "-3", "must be >= 1, got -3"),
                                                         ("--seed", "-1", "must be >= 0, got -1")])
def test_report_refuses_a_limit_below_one_and_a_negative_seed(saved, capsys, flag, value, message):
    with pytest.raises(SystemExit) as exc:
        main(["report", "--source", str(saved / "tiny_sp_bpe"), "--target", str(saved / "tiny_bl"), "--data",
              str(saved / "data.jsonl"), flag, value])
    assert exc.value.code == 2 and f"{flag}: {message}" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b'{"answer": "ok"}\n{"answer": "caf\xe9"}\n', r"bad\.jsonl:2: not valid UTF-8"),
        (b'{"answer": "ok"}\n{"answer": \n', r"bad\.jsonl:2: not valid JSON"),
        (b'{"answer": "ok"}\n[1, 2]\n', r"bad\.jsonl:2: .*JSON object"),
        (b"\n\n", r"bad\.jsonl has no text rows"),
    ],
)
def test_report_names_file_and_line_of_bad_rows(saved, tmp_path, content, message, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(content)
    assert main(["report", "--source", str(saved / "tiny_sp_bpe"), "--target", str(saved / "tiny_bl"), "--data",
                 str(bad)]) == 2
    assert re.search(message, capsys.readouterr().err)
