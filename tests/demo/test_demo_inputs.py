"""``demo`` / ``study`` inputs checked before any work: ``--out`` follows ``train --out``'s rules (a user's files in a
directory that is not a demo's were overwritten: its ``tokenizers/bytebpe/tokenizer.json``), and every flag is
checked before the SFTs (``--group-size 100000000``, ``--eval-k 0`` and ``--regimes ,`` failed or ran on only after
minutes of SFT)."""

from __future__ import annotations

import json

import pytest

import mrl_llm.demo.run as run_mod
from mrl_llm.cli import main
from mrl_llm.demo.run import DIR_MARKER, _claim, check_out_dir
from mrl_llm.demo.setup import MAX_ROLLOUTS_PER_STEP, DemoConfig
from mrl_llm.demo.study import StudyConfig
from shared_interfaces.config_io import ConfigError


@pytest.fixture
def no_sft(monkeypatch):
    """Any SFT or tokenizer training started is a failure: the checks must come first."""
    def started(*a, **k):
        raise AssertionError("the demo started working before its inputs were checked")

    monkeypatch.setattr(run_mod, "sft_job", started)
    import mrl_llm.demo.tokenizers as toks

    monkeypatch.setattr(toks, "save_demo_tokenizers", started)


def _users_dir(tmp_path):
    d = tmp_path / "mine"
    (d / "tokenizers" / "bytebpe").mkdir(parents=True)
    (d / "tokenizers" / "bytebpe" / "tokenizer.json").write_text('{"mine": true}')
    return d


@pytest.mark.parametrize("cmd", ["demo", "study"])
def test_out_that_is_not_a_demos_directory_is_refused_and_left_alone(tmp_path, capsys, no_sft, cmd):
    d = _users_dir(tmp_path)
    assert main([cmd, "--out", str(d), "--jobs", "0", "--steps", "1", "--sft-steps", "1"]) == 2
    err = capsys.readouterr().err
    assert f"--out {d} is not empty (it holds tokenizers, ...) and is not a {cmd} directory" in err, err
    assert err.count("\n") == 1
    assert (d / "tokenizers" / "bytebpe" / "tokenizer.json").read_text() == '{"mine": true}'
    assert sorted(p.name for p in d.rglob("*")) == ["bytebpe", "tokenizer.json", "tokenizers"]
    (tmp_path / "afile").write_text("x")
    assert main([cmd, "--out", str(tmp_path / "afile"), "--jobs", "0"]) == 2
    assert "is a file, not a directory" in capsys.readouterr().err
    assert main([cmd, "--out", str(tmp_path / "afile" / "sub"), "--jobs", "0"]) == 2
    assert "is a file, not a directory" in capsys.readouterr().err
    assert main([cmd, "--out", "", "--jobs", "0"]) == 2
    assert "--out is empty" in capsys.readouterr().err


def test_run_demo_itself_checks_its_directory_first(tmp_path, no_sft):
    d = _users_dir(tmp_path)
    with pytest.raises(ConfigError, match="is not a demo directory"):
        run_mod.run_demo(DemoConfig(), d, jobs=0)
    assert not (d / DIR_MARKER).exists()


def test_a_demos_own_directory_is_accepted_and_another_kinds_is_not(tmp_path):
    assert check_out_dir(tmp_path / "new") == tmp_path / "new" and not (tmp_path / "new").exists()
    (tmp_path / "empty").mkdir()
    assert check_out_dir(tmp_path / "empty", "study") == tmp_path / "empty"
    _claim(tmp_path / "d", "demo")
    (tmp_path / "d" / "seed0").mkdir()
    assert json.loads((tmp_path / "d" / DIR_MARKER).read_text()) == {"kind": "demo"}
    assert check_out_dir(tmp_path / "d", "demo") == tmp_path / "d"
    with pytest.raises(ConfigError, match="is a demo directory .*not a study's"):
        check_out_dir(tmp_path / "d", "study")
    (tmp_path / "d" / DIR_MARKER).write_text("[")
    with pytest.raises(ConfigError, match="is an unreadable directory"):
        check_out_dir(tmp_path / "d", "demo")
    old = tmp_path / "old"  # a demo directory from before the marker: its results.json
    (old / "seed0").mkdir(parents=True)
    (old / "results.json").write_text("{}")
    assert check_out_dir(old, "demo") == old
    with pytest.raises(ConfigError, match="not a study directory"):
        check_out_dir(old, "study")


@pytest.mark.parametrize(("flags", "msg"), [
    (["--group-size", "100000000", "--prompts-per-step", "16"], f"x --group-size 100000000 = 1600000000 rollouts per step and policy, more than "
                                    f"this CPU demo runs ({MAX_ROLLOUTS_PER_STEP})"),
    (["--eval-k", "0"], "--eval-k must be an integer >= 1, got 0"),
    (["--regimes", ","], "--regimes names no regime"),
    (["--regimes", "sgt+xgrpo,xgrpo+sgt"], "--regimes lists ['sgt+xgrpo'] more than once"),
    (["--seeds", "100000000000000000000"], "--seeds 100000000000000000000 is more than 1000"),
    (["--prompts-per-step", "0"], "--prompts-per-step must be an integer >= 1, got 0"),
    (["--eval-every", "-1"], "--eval-every must be an integer >= 0, got -1"),
])
@pytest.mark.parametrize("cmd", ["demo", "study"])
def test_every_flag_is_checked_before_any_sft(tmp_path, capsys, no_sft, cmd, flags, msg):
    assert main([cmd, "--out", str(tmp_path / "d"), "--jobs", "0", *flags]) == 2
    err = capsys.readouterr().err
    assert msg.replace("demo", cmd) in err and err.count("\n") == 1, err
    assert not (tmp_path / "d").exists()


def test_the_configs_check_the_same_bounds():
    for cls in (DemoConfig, StudyConfig):
        with pytest.raises(ValueError, match="--eval-k must be an integer >= 1"):
            cls(eval_k=0)
        with pytest.raises(ValueError, match="--regimes names no regime"):
            cls(regimes=())
        assert cls(prompts_per_step=MAX_ROLLOUTS_PER_STEP, group_size=1).group_size == 1
