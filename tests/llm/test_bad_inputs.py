"""Bad configs, model configs and datasets through the command line: exit status 2 and one line on stderr
that names the policy and the file or key, never a traceback (issue 13, items 2, 8-12)."""

from __future__ import annotations

import copy
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from mrl_llm.cli import main
from mrl_llm.config import load_config
from shared_interfaces.config_io import ConfigError
from tests.core.test_config_io_limits import BOMB
from tests.llm.helpers import tiny

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "experiments" / "data" / "arithmetic"

BASE: dict[str, Any] = {
    "name": "bad", "seed": 1, "steps": 1, "prompts_per_step": 2, "regime": {"name": "grpo"},
    "data": {"path": str(DATA / "train.jsonl"), "verifier": "arithmetic"},
    "eval": {"enabled": False}, "tensorboard": False, "progress": False,
    "policies": [
        {"name": "a", "model_config": tiny("llama", vocab_size=400), "tokenizer_dir": "utf8-bytes", "group_size": 2,
         "sampling": {"max_new_tokens": 4}, "train": {"lr": 1e-3}},
    ],
}


def config_with(tmp_path: Path, change) -> Path:
    data = copy.deepcopy(BASE)
    change(data)
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def one_line_error(capsys, argv: list[str]) -> str:
    """Run the CLI; it must exit 2 with one ``mrl_llm train:`` line on stderr and no traceback."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [x for x in err.splitlines() if x.startswith("mrl_llm train:")]
    assert len(lines) == 1, err
    return lines[0]


def pol(**kw: Any):
    def change(d: dict[str, Any]) -> None:
        d["policies"][0].update(kw)
    return change


def model_cfg(**kw: Any):
    def change(d: dict[str, Any]) -> None:
        d["policies"][0]["model_config"].update(kw)
    return change


# ---- item 2: policy names -------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["..", ".", "a\nb", "a\x00", "a/b", "", " a", "-a", "a b", "x" * 65, "é"])
def test_policy_names_outside_the_character_set_are_refused(tmp_path, capsys, name):
    cfg = config_with(tmp_path, pol(name=name))
    line = one_line_error(capsys, ["train", "--config", str(cfg), "--out", str(tmp_path / "o")])
    assert "cfg.yaml" in line and "policies[].name" in line and "[A-Za-z0-9][A-Za-z0-9._-]{0,63}" in line
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("name", ["a", "qwen2.5-math_1.5B", "A" * 64, "0..x"])
def test_policy_names_inside_the_character_set_load(tmp_path, name):
    assert load_config(config_with(tmp_path, pol(name=name))).policies[0].name == name


def test_a_saved_policy_with_an_old_style_name_still_loads(tmp_path):
    from mrl_llm.byte_tokenizer import byte_tokenizer
    from mrl_llm.config import PolicyConfig
    from mrl_llm.models import build_model, load_policy, save_policy

    tok = byte_tokenizer()
    model = build_model(PolicyConfig(name="a", model_config=tiny("llama", num_hidden_layers=1)), tok, seed=0)
    save_policy(model, tok, tmp_path / "p", {"name": "my policy"})  # allowed before names had a rule
    _, _, meta = load_policy(tmp_path / "p")
    assert meta["name"] == "my policy"


# ---- item 8: alias bomb ----------------------------------------------------------------------------------
def test_alias_bomb_config_is_refused_naming_the_file(tmp_path, capsys):
    cfg = tmp_path / "bomb.yaml"
    cfg.write_text(BOMB)
    line = one_line_error(capsys, ["train", "--config", str(cfg), "--out", str(tmp_path / "o")])
    assert "bomb.yaml:1" in line and "alias" in line


# ---- item 9: model and tokenizer directories, model_config -------------------------------------------------
@pytest.mark.parametrize(
    ("change", "expect"),
    [
        (model_cfg(hidden_size=-64), ["policy 'a'", "model_config.hidden_size", "-64"]),
        (model_cfg(num_hidden_layers=0), ["policy 'a'", "model_config.num_hidden_layers", ">= 1"]),
        (model_cfg(num_attention_heads=2.5), ["policy 'a'", "model_config.num_attention_heads"]),
        (model_cfg(rms_norm_eps=math.inf), ["policy 'a'", "model_config.rms_norm_eps", "finite"]),
    ],
)
def test_cheap_model_config_checks_at_config_load(tmp_path, capsys, change, expect):
    cfg = config_with(tmp_path, change)
    with pytest.raises(ConfigError) as err:
        load_config(cfg)
    assert all(e in str(err.value) for e in expect), str(err.value)
    line = one_line_error(capsys, ["train", "--config", str(cfg), "--out", str(tmp_path / "o")])
    assert all(e in line for e in expect) and "cfg.yaml" in line


@pytest.mark.parametrize(
    ("change", "expect"),
    [
        (model_cfg(vocab_size=10), ["policy 'a'", "model_config.vocab_size", "10", "tokenizer"]),
        (model_cfg(hiden_size=64), ["policy 'a'", "model_config", "'hiden_size'", "llama"]),
        (model_cfg(model_type="no-such-arch"), ["policy 'a'", "model_config.model_type", "no-such-arch"]),
        (pol(tokenizer_dir="nowhere/local/tok"), ["policy 'a'", "nowhere/local/tok", "not found"]),  # owner/name is a hub id
        # owner/name is a hub id: not in the hub cache and not on the hub (no network here): named before any build
        (lambda d: d["policies"][0].update(model_config=None, model_dir="nowhere/model", tokenizer_dir=None),
         ["policy 'a'", "nowhere/model", "the hub did not give it", "check the id"]),
        (lambda d: d["policies"][0].update(model_config=None, model_dir="nowhere/model"),
         ["policy 'a'", "nowhere/model", "the hub did not give it", "check the id"]),
    ],
)
def test_model_errors_are_one_line_before_any_model_is_built(tmp_path, capsys, monkeypatch, change, expect):
    import mrl_llm.preflight
    import mrl_llm.rank.model

    def no_build(*a, **k):
        raise AssertionError("a model was built before the inputs were checked")

    monkeypatch.setattr(mrl_llm.rank.model, "build_model", no_build)
    monkeypatch.setattr(mrl_llm.preflight, "download_file", lambda *a, **k: None)  # the hub, unreachable here, says no
    cfg = config_with(tmp_path, change)
    line = one_line_error(capsys, ["train", "--config", str(cfg), "--out", str(tmp_path / "o")])
    assert all(e in line for e in expect), line


def test_model_config_errors_from_the_module_entry_point_have_no_traceback(tmp_path):
    cfg = config_with(tmp_path, model_cfg(hiden_size=64))
    res = subprocess.run([sys.executable, "-m", "mrl_llm", "train", "--config", str(cfg), "--out", str(tmp_path / "o")],
                         capture_output=True, text=True, cwd=REPO, timeout=300)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    errors = [x for x in res.stderr.splitlines() if not x.startswith(("INFO ", "WARNING "))]
    assert len(errors) == 1 and errors[0].startswith("mrl_llm train:") and "hiden_size" in errors[0], res.stderr


# ---- item 10: seeds and non-finite numbers ---------------------------------------------------------------
def test_seed_out_of_range_names_the_key_and_range(tmp_path, capsys):
    big = 1180591620717411303424
    cfg = config_with(tmp_path, lambda d: d.update(seed=big))
    line = one_line_error(capsys, ["train", "--config", str(cfg), "--out", str(tmp_path / "o")])
    assert "seed" in line and "2**63" in line and str(big) in line
    cfg = config_with(tmp_path, lambda d: d.update(seed=-1))
    assert "seed" in one_line_error(capsys, ["train", "--config", str(cfg), "--out", str(tmp_path / "o")])
    cfg = config_with(tmp_path, pol(init_seed=2**63))
    assert "init_seed" in one_line_error(capsys, ["train", "--config", str(cfg), "--out", str(tmp_path / "o")])
    cfg = config_with(tmp_path, lambda d: None)
    line = one_line_error(capsys, ["train", "--config", str(cfg), "--out", str(tmp_path / "o"), "--seed", str(big)])
    assert "seed" in line and "2**63" in line


@pytest.mark.parametrize(
    ("change", "key"),
    [
        (pol(sampling={"temperature": math.inf}), "policies[0].sampling.temperature"),
        (pol(sampling={"temperature": math.nan}), "policies[0].sampling.temperature"),
        (pol(train={"lr": math.inf}), "policies[0].train.lr"),
        (lambda d: d.update(loss={"kl_coef": math.nan}), "loss.kl_coef"),
        (lambda d: d.update(regime={"name": "prp_thl", "prp": {"ratio_cap": math.inf}}), "regime.prp.ratio_cap"),
    ],
)
def test_non_finite_numbers_are_refused(tmp_path, capsys, change, key):
    cfg = config_with(tmp_path, change)
    line = one_line_error(capsys, ["train", "--config", str(cfg), "--out", str(tmp_path / "o")])
    assert key in line and "finite" in line


# ---- item 11: non-UTF-8 dataset -----------------------------------------------------------------------------
def test_non_utf8_dataset_names_file_and_line(tmp_path, capsys):
    data = tmp_path / "train.jsonl"
    data.write_bytes(b'{"question": "What is 1+1?", "answer": "2"}\n{"question": "caf\xe9 1+2?", "answer": "3"}\n')
    cfg = config_with(tmp_path, lambda d: d["data"].update(path=str(data)))
    line = one_line_error(capsys, ["train", "--config", str(cfg), "--out", str(tmp_path / "o")])
    assert f"{data}:2" in line and "UTF-8" in line


# ---- item 12: prompts longer than max_prompt_len ---------------------------------------------------------
def test_too_long_prompt_found_before_models_load(tmp_path, capsys, monkeypatch):
    import mrl_llm.preflight
    import mrl_llm.rank.model

    def no_build(*a, **k):
        raise AssertionError("a model was built before the prompts were checked")

    monkeypatch.setattr(mrl_llm.rank.model, "build_model", no_build)
    data = tmp_path / "train.jsonl"
    rows = [{"id": f"p{i}", "question": f"What is {i}+1?", "answer": str(i + 1)} for i in range(5)]
    rows.insert(3, {"id": "long", "question": "What is " + "1+" * 40 + "1?", "answer": "41"})
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = config_with(tmp_path, lambda d: (d["data"].update(path=str(data)), d["policies"][0].update(max_prompt_len=60)))
    line = one_line_error(capsys, ["train", "--config", str(cfg), "--out", str(tmp_path / "o")])
    assert "policy 'a'" in line and "'long'" in line and "max_prompt_len 60" in line and "on_malformed: skip" in line
