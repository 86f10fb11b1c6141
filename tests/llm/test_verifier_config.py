"""The MATH verifier's options in a config (``data.answer_format``, ``data.verifier_workers``): read and
checked at load, handed to every policy's worker, and used by the verifier the worker builds."""

from __future__ import annotations

import pytest

from mrl_llm.config import config_from_mapping
from mrl_llm.rank.scoring import Scorer
from mrl_llm.trainer import train, verifier_options, worker_config
from shared_interfaces.config_io import ConfigError
from tests.llm.helpers import tiny


def cfg(data=None, eval_data=None):
    out = {"policies": [{"name": "a", "model_config": tiny("llama"), "tokenizer_dir": "utf8-bytes"}]}
    if data is not None:
        out["data"] = {"path": "x.jsonl", **data}
    if eval_data is not None:
        out["eval"] = {"data": {"path": "y.jsonl", **eval_data}}
    return config_from_mapping(out)


def test_answer_format_and_pool_size_reach_the_workers_config():
    c = cfg({"answer_format": "boxed_or_answer_line", "verifier_workers": 3})
    assert verifier_options(c) == {"math": {"answer_format": "boxed_or_answer_line", "n_workers": 3}}
    assert worker_config(c, "a")["verifier_options"] == verifier_options(c)
    assert verifier_options(cfg({})) == {"math": {"answer_format": "boxed", "n_workers": 2}}  # the defaults
    assert verifier_options(cfg()) == {}  # no data section (problems given in code): the verifiers' defaults
    assert verifier_options(cfg({"verifier": "mcq"})) == {"mcq": {}}


@pytest.mark.parametrize(("data", "match"), [
    ({"answer_format": "last_line"}, "data.answer_format"),
    ({"verifier": "mcq", "answer_format": "boxed_or_answer_line"}, "math verifier only"),
    ({"verifier_workers": 0}, "verifier_workers must be an integer from 1 to 64"),
    ({"verifier_workers": 1.5}, "verifier_workers"),
    ({"verifier_workers": True}, "verifier_workers"),
])
def test_bad_verifier_options_are_errors_naming_the_key(data, match):
    with pytest.raises(ConfigError, match=match):
        cfg(data)


def test_eval_data_may_not_score_differently_from_the_training_data():
    c = cfg({"answer_format": "boxed_or_answer_line"}, {"answer_format": "boxed"})
    with pytest.raises(ConfigError, match=r"eval.data configures verifier 'math' with \['answer_format'\]"):
        verifier_options(c)
    assert verifier_options(cfg({"verifier_workers": 3}, {"verifier_workers": 3}))["math"]["n_workers"] == 3


def test_a_conflicting_verifier_setting_fails_before_the_run_directory_is_made(tmp_path):
    c = cfg({"answer_format": "boxed_or_answer_line"}, {"answer_format": "boxed"})
    with pytest.raises(ConfigError, match="eval.data configures verifier 'math'"):
        train(c, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_the_worker_builds_its_verifier_with_the_runs_options():
    scorer = Scorer({"math": {"answer_format": "boxed_or_answer_line", "n_workers": 1}})  # the worker's part
    v = scorer.verifier("math")
    try:
        assert (v.answer_format, v.n_workers) == ("boxed_or_answer_line", 1)
        assert scorer.verifier("math") is v  # built once
        assert v.score("The answer is: 4", "4").correct
    finally:
        v.close()


def test_eval_cli_takes_the_answer_format_and_refuses_it_for_other_verifiers(tmp_path, capsys):
    from mrl_llm.cli import main

    data = tmp_path / "d.jsonl"
    data.write_text('{"question": "1+1", "answer": "2"}\n')
    args = ["eval", "--policy", str(tmp_path / "no-policy"), "--data", str(data)]
    assert main([*args, "--verifier", "mcq", "--answer-format", "boxed_or_answer_line"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--answer-format applies to the math verifier only" in err[0]  # the flag, not data.
    assert "(remove --answer-format)" in err[0]
    with pytest.raises(SystemExit):  # argparse: not one of the choices
        main([*args, "--answer-format", "last_line"])


def test_eval_cli_names_a_missing_policy_or_data_file_before_loading_anything(tmp_path, capsys):
    """An empty or missing policy directory and a missing data file: one line saying what to pass (it was the
    tokenizer loader's advice to install sentencepiece, and 'check data.path in the config' after the model loaded)."""
    from mrl_llm.cli import main

    data = tmp_path / "d.jsonl"
    data.write_text('{"question": "1+1", "answer": "2"}\n')
    (tmp_path / "empty").mkdir()
    for policy in (tmp_path / "empty", tmp_path / "missing"):
        assert main(["eval", "--policy", str(policy), "--data", str(data), "--verifier", "arithmetic"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [f"mrl_llm eval: {policy} is not a saved policy (no {policy / 'config.json'}); pass a run's "
                       "DIR/policies/<name>, or any HF model directory with its tokenizer"]
    (tmp_path / "empty" / "config.json").write_text("{}")  # the data is checked before the model is loaded
    assert main(["eval", "--policy", str(tmp_path / "empty"), "--data", str(tmp_path / "no.jsonl")]) == 2
    assert capsys.readouterr().err.strip() == (f"mrl_llm eval: evaluation data {tmp_path / 'no.jsonl'} is not a file; "
                                               "pass a JSONL file of question/answer rows")


def test_eval_cli_refuses_an_empty_data_file_naming_it(tmp_path, capsys):
    from mrl_llm.byte_tokenizer import byte_tokenizer
    from mrl_llm.cli import main
    from mrl_llm.config import PolicyConfig
    from mrl_llm.models import build_model, save_policy
    from tests.llm.helpers import tiny

    tok = byte_tokenizer()
    model = build_model(PolicyConfig(name="a", model_config=tiny("llama", num_hidden_layers=1)), tok, seed=0)
    save_policy(model, tok, tmp_path / "p", {"name": "a"})
    (tmp_path / "empty.jsonl").write_text("")
    assert main(["eval", "--policy", str(tmp_path / "p"), "--data", str(tmp_path / "empty.jsonl"),
                 "--verifier", "arithmetic"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"mrl_llm eval: dataset {tmp_path / 'empty.jsonl'} has no usable problems (0 rows")
