"""``mrl_llm eval``'s inputs: a bad flag, ``--out``, dataset or ``mrl_policy.json`` exits 2 with one line on stderr
that names what to change, and everything cheap is checked before the model is built."""

from __future__ import annotations

import json
import shutil

import pytest

from mrl_llm.cli import main
from mrl_llm.config import config_from_mapping
from shared_interfaces.config_io import ConfigError
from tests.llm.helpers import tiny

ROWS = [{"question": "What is 1+1?", "answer": "2"}, {"question": "What is 2+2?", "answer": "4"}]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A tiny saved policy directory with the ``mrl_policy.json`` that ``train`` writes."""
    from mrl_llm.byte_tokenizer import byte_tokenizer
    from mrl_llm.config import PolicyConfig
    from mrl_llm.models import build_model, save_policy
    from shared_interfaces.config_io import to_mapping

    tok = byte_tokenizer()
    pol = PolicyConfig(name="a", model_config=tiny("llama", num_hidden_layers=1))
    meta = {"name": "a", "template": to_mapping(pol.template), "dtype": "fp32", "weights_dtype": "fp32",
            "sampling": to_mapping(pol.sampling), "version": 0, "tokenizer_id": "utf8-bytes"}
    return save_policy(build_model(pol, tok, seed=0), tok, tmp_path_factory.mktemp("saved") / "a", meta)


@pytest.fixture
def policy(saved, tmp_path):
    """A copy of the saved policy that a test may edit."""
    return shutil.copytree(saved, tmp_path / "policies" / "a")


@pytest.fixture
def data(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return path


@pytest.fixture
def no_model(monkeypatch):
    """Building the policy's model fails the test: the input under test must be refused first."""
    import mrl_llm.worker

    def built(*args, **kwargs):
        raise AssertionError("the model was built before the bad input was refused")

    monkeypatch.setattr(mrl_llm.worker, "LLMPolicyWorker", built)


def eval_error(capsys, policy, data, *flags: str) -> str:
    """Run ``mrl_llm eval`` on ``policy`` and ``data``; it must exit 2 with one ``mrl_llm eval:`` line on stderr."""
    assert main(["eval", "--policy", str(policy), "--data", str(data), "--verifier", "arithmetic", *flags]) == 2
    err = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert len(err) == 1 and err[0].startswith("mrl_llm eval: "), err
    return err[0]


def rewrite_meta(policy, change) -> None:
    path = policy / "mrl_policy.json"
    if isinstance(change, str):
        path.write_text(change)
        return
    meta = json.loads(path.read_text())
    change(meta)
    path.write_text(json.dumps(meta))


# ---- mrl_policy.json ----------------------------------------------------------------------------------------------
BAD_META = [
    (lambda m: m["sampling"].update(beam_width=2), ["sampling: unknown key(s) ['beam_width']"]),
    (lambda m: m["sampling"].update(temperature="hot"), ["sampling.temperature", "'hot'"]),
    (lambda m: m["sampling"].update(temperature=0), ["sampling.temperature must be > 0"]),
    (lambda m: m["template"].update(style="x"), ["template: unknown key(s) ['style']"]),
    (lambda m: m.update(sampling=[1]), ["sampling: expected a mapping"]),
    (lambda m: m.update(dtype="fp64"), ["dtype 'fp64' is not one of", "'fp32'"]),
    (lambda m: m.update(version="three"), ["version must be an integer >= 0, got 'three'"]),
    (lambda m: m.update(name=["a"]), ["name must be a string"]),
    ("[1, 2]", ["must hold a JSON object, got a list"]),
    ('{"name": "a",', ["is not valid JSON"]),
    ("", ["is not valid JSON"]),  # an empty file
    (b"\xff\xfe{}", ["is not valid JSON"]),
]


@pytest.mark.parametrize(("change", "expect"), BAD_META)
def test_a_bad_policy_meta_is_one_line_naming_the_file_before_the_model_loads(
        capsys, policy, data, no_model, change, expect):
    if isinstance(change, bytes):
        (policy / "mrl_policy.json").write_bytes(change)
    else:
        rewrite_meta(policy, change)
    line = eval_error(capsys, policy, data)
    assert str(policy / "mrl_policy.json") in line and "fix the file, or delete it" in line
    assert all(e in line for e in expect), line


def test_load_policy_checks_the_meta_too(policy):
    from mrl_llm.models import load_policy

    rewrite_meta(policy, lambda m: m.update(dtype="fp64"))
    with pytest.raises(ConfigError, match=r"mrl_policy\.json: dtype 'fp64'"):
        load_policy(policy)
    rewrite_meta(policy, "[1, 2]")
    with pytest.raises(ConfigError, match="must hold a JSON object"):
        load_policy(policy)


def test_a_policy_saved_with_an_old_style_name_evaluates(capsys, policy, data):
    rewrite_meta(policy, lambda m: m.update(name="my policy"))  # allowed before names had a rule
    assert main(["eval", "--policy", str(policy), "--data", str(data), "--verifier", "arithmetic", "--k", "0",
                 "--max-new-tokens", "2"]) == 0
    assert json.loads(capsys.readouterr().out)["n"] == 2


# ---- flags ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("flags", "expect"), [
    (["--k", "-1"], "--k must be an integer >= 0 (samples per prompt for pass@k; 0: greedy only), got -1"),
    (["--max-new-tokens", "0"], "--max-new-tokens must be an integer >= 1"),
    (["--max-new-tokens", "-5"], "got -5"),
    (["--max-prompts", "0"], "--max-prompts must be an integer >= 1"),
    (["--temperature", "0"], "--temperature must be a finite number > 0"),
    (["--temperature", "nan"], "--temperature must be a finite number > 0"),
])
def test_out_of_range_numbers_are_refused_naming_the_flag(capsys, policy, data, no_model, flags, expect):
    assert expect in eval_error(capsys, policy, data, *flags)


def test_eval_max_new_tokens_in_a_config_is_at_least_one_or_null():
    base = {"policies": [{"name": "a", "model_config": tiny("llama"), "tokenizer_dir": "utf8-bytes"}]}
    for bad in (0, -1):
        with pytest.raises(ConfigError, match=r"eval.max_new_tokens must be >= 1, or null .*got " + str(bad)):
            config_from_mapping({**base, "eval": {"max_new_tokens": bad}})
    assert config_from_mapping({**base, "eval": {"max_new_tokens": None}}).eval.max_new_tokens is None
    assert config_from_mapping({**base, "eval": {"max_new_tokens": 8}}).eval.max_new_tokens == 8


# ---- --out --------------------------------------------------------------------------------------------------------
def test_out_that_is_a_directory_or_under_a_file_is_refused_before_the_model_loads(
        capsys, policy, data, no_model, tmp_path):
    line = eval_error(capsys, policy, data, "--out", str(tmp_path))
    assert f"--out {tmp_path} is a directory; give a file path" in line
    line = eval_error(capsys, policy, data, "--out", str(data / "x.json"))
    assert f"{data} is a file, not a directory" in line


def test_out_in_missing_directories_makes_them(capsys, policy, data, tmp_path):
    out = tmp_path / "new" / "deeper" / "eval.json"
    assert main(["eval", "--policy", str(policy), "--data", str(data), "--verifier", "arithmetic", "--k", "1",
                 "--max-new-tokens", "2", "--out", str(out)]) == 0
    got = json.loads(out.read_text())
    assert got["policy"] == "a" and len(got["rows"]) == 2


# ---- the dataset -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("flags", "expect"), [
    (["--question-field", "problem"], "no question field 'problem'"),
    (["--answer-field", "solution"], "no answer field 'solution'"),
    (["--question-field", ""], "--question-field and --answer-field must name row keys"),
])
def test_data_errors_name_the_eval_flags_and_come_before_the_model(capsys, policy, data, no_model, flags, expect):
    line = eval_error(capsys, policy, data, *flags)
    assert expect in line and "data." not in line.replace(str(data), ""), line
    assert (flags[0] + " to the key") in line or expect.startswith("--")


def test_a_malformed_row_or_unknown_verifier_fails_before_the_model(capsys, policy, data, no_model, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "What is 1+1?", "answer": "2"}\n{"question": "x"\n')
    assert f"{bad}:2: not valid JSON" in eval_error(capsys, policy, bad)
    assert "unknown verifier 'nope'" in eval_error(capsys, policy, data, "--verifier", "nope")
