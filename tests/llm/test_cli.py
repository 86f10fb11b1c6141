"""The command line on a config file with JSONL data and the real arithmetic verifier: train, refuse a
busy directory, resume with more steps, evaluate a saved policy, report; bad input exits 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from mrl_llm.cli import main
from mrl_llm.contract import learner_tokenizer_dir
from tests.llm.helpers import tiny

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "experiments" / "data" / "arithmetic"


def write_config(path: Path) -> Path:
    path.write_text(yaml.safe_dump({
        "name": "cli", "seed": 1, "steps": 1, "prompts_per_step": 2, "regime": {"name": "grpo"},
        "data": {"path": str(DATA / "train.jsonl"), "verifier": "arithmetic"},
        "eval": {"data": {"path": str(DATA / "eval.jsonl"), "verifier": "arithmetic"}, "k": 1, "max_prompts": 2},
        "tensorboard": False, "progress": False,
        "policies": [
            {"name": "a", "model_config": tiny("llama", vocab_size=400), "tokenizer_dir": "utf8-bytes", "group_size": 2,
             "sampling": {"max_new_tokens": 4}, "train": {"lr": 1e-3}},
            {"name": "b", "model_config": tiny("mistral", vocab_size=400), "tokenizer_dir": learner_tokenizer_dir(),
             "group_size": 2,
             "sampling": {"max_new_tokens": 4}, "train": {"lr": 1e-3}},
        ],
    }))
    return path


def test_train_resume_eval_report(tmp_path, capsys, caplog):
    import logging
    import re

    cfg = write_config(tmp_path / "cfg.yaml")
    out = tmp_path / "runs" / "grpo"
    with caplog.at_level(logging.INFO, logger="mrl_llm.runner"):  # (another test may have quietened mrl_llm)
        assert main(["train", "--config", str(cfg), "--out", str(out), "--regime", "xgrpo"]) == 0
    assert re.search(r"step 0: a reward \d\.\d\d, b reward \d\.\d\d", caplog.text)  # progress off: one line a step
    s = json.loads((out / "summary.json").read_text())
    assert s["regime"] == "xgrpo" and s["steps"] == 1 and [p["name"] for p in s["policies"]] == ["a", "b"]
    n_train = sum(1 for line in (DATA / "train.jsonl").read_text().splitlines() if line.strip())
    assert s["data"]["train"] == {"source": str(DATA / "train.jsonl"), "rows": n_train, "skipped_rows": 0,
                                  "skipped_prompts": 0, "problems": n_train}
    assert s["data"]["eval"]["source"] == str(DATA / "eval.jsonl") and s["data"]["eval"]["problems"] == 2
    assert "a: eval_accuracy=" in capsys.readouterr().out
    from shared_interfaces.success_matrix import read_success_matrix

    matrix = read_success_matrix(out / "success_matrix.json")  # every run writes its success matrix at its end
    assert matrix.policies == ("a", "b") and list(matrix.outcomes) == ["xgrpo"] and matrix.run["steps"] == 1

    assert main(["train", "--config", str(cfg), "--out", str(out)]) == 2
    assert "already holds a run" in capsys.readouterr().err
    assert main(["train", "--config", str(cfg), "--resume", str(out), "--steps", "2"]) == 2  # regime differs
    assert "['regime']" in capsys.readouterr().err
    # resumed with the run's own config.json, as the refusal above says (its default eps is written 1e-08, which
    # YAML 1.1 alone reads as a string)
    assert '"eps": 1e-08' in (out / "config.json").read_text()
    assert main(["train", "--config", str(out / "config.json"), "--resume", str(out), "--steps", "2"]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["steps"] == 2 and s["policies"][0]["compute"]["samples"] == 2 * 2 * 2
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["kind"] == "train"] == [0, 0, 1, 1]

    res = tmp_path / "eval.json"
    assert main(["eval", "--policy", str(out / "policies" / "b"), "--data", str(DATA / "eval.jsonl"), "--verifier",
                 "arithmetic", "--k", "2", "--max-prompts", "3", "--out", str(res)]) == 0
    got = json.loads(res.read_text())
    assert got["summary"]["n"] == 3 and len(got["rows"]) == 3 and all(r["samples"] == 2 for r in got["rows"])

    assert main(["report", "--runs", str(tmp_path / "runs")]) == 0
    assert "| xgrpo | a |" in capsys.readouterr().out and (tmp_path / "runs" / "report.png").is_file()


def test_bad_input_exits_2_with_a_message(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"policies": [{"name": "a", "model_dir": "x", "learning_rate": 1}]}))
    assert main(["train", "--config", str(bad), "--out", str(tmp_path / "o")]) == 2
    assert "learning_rate" in capsys.readouterr().err
    assert main(["train", "--config", str(tmp_path / "missing.yaml"), "--out", str(tmp_path / "o")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["report", "--runs", str(tmp_path / "none")]) == 2
    cfg = write_config(tmp_path / "cfg.yaml")
    assert main(["train", "--config", str(cfg), "--out", str(tmp_path / "x"), "--resume", str(tmp_path / "y")]) == 2


def test_an_out_under_a_file_and_an_empty_regime_are_refused(tmp_path, capsys):
    cfg = write_config(tmp_path / "cfg.yaml")
    assert main(["train", "--config", str(cfg), "--out", str(cfg / "run")]) == 2
    err = capsys.readouterr().err  # said "is not writable (a read-only directory?)"
    assert f"--out {cfg / 'run'}: {cfg} is a file, not a directory; choose an --out path under a directory" in err
    assert main(["train", "--config", str(cfg), "--out", str(tmp_path / "o"), "--regime", ""]) == 2
    assert "regime name must be a non-empty string" in capsys.readouterr().err  # was ignored: the config's regime ran
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("cmd, flags, says", [
    ("demo", ["--lr", "nan"], "run config.policies[0].train.lr: nan is not a finite number"),
    ("study", ["--first-seed", "-1"], "seed -1 is out of range"),
    ("study", ["--kl-coef", "-1", "--regimes", "sgt"], "loss.kl_coef must be >= 0, got -1.0 (the sgt run of seed 0)"),
])
def test_a_demo_or_study_flag_the_trainer_refuses_is_an_error_before_any_sft(tmp_path, capsys, cmd, flags, says):
    """Each was refused only when the first run started, after minutes of SFT."""
    assert main([cmd, "--out", str(tmp_path / "d"), *flags]) == 2
    err = capsys.readouterr().err
    assert says in err and "change the flag that sets it" in err and "Traceback" not in err
    assert not (tmp_path / "d").exists()


def test_the_default_demo_and_study_run_configs_pass_the_check():
    from mrl_llm.cli import check_run_configs
    from mrl_llm.demo.setup import DemoConfig, run_config
    from mrl_llm.demo.study import StudyConfig, study_run_config

    check_run_configs(DemoConfig(), run_config)
    check_run_configs(StudyConfig(seeds=3), study_run_config)


@pytest.mark.parametrize("cmd", ["demo", "study"])
def test_jobs_and_pool_size_are_checked_by_the_parser(cmd, capsys):
    for flags in (["--jobs", "-1"], ["--pool-per-family", "0"]):
        with pytest.raises(SystemExit) as exc:
            main([cmd, *flags])
        assert exc.value.code == 2 and f"argument {flags[0]}: must be >= " in capsys.readouterr().err


@pytest.mark.ray
def test_a_ray_address_with_no_cluster_is_named_at_once(tmp_path, capsys):
    """ray.init waited about a minute, with warnings, for a GCS that is not there."""
    import socket
    import time

    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        ray.shutdown()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = write_config(tmp_path / "cfg.yaml")
    t0 = time.perf_counter()
    assert main(["train", "--config", str(cfg), "--out", str(tmp_path / "o"), "--runtime", "ray", "--ray-address",
                 f"127.0.0.1:{port}"]) == 2
    assert f"127.0.0.1:{port}: no Ray cluster answers there" in capsys.readouterr().err
    assert time.perf_counter() - t0 < 30 and not ray.is_initialized() and not (tmp_path / "o").exists()


def test_module_entry_point_runs_plan(tmp_path):
    cfg = write_config(tmp_path / "cfg.yaml")
    r = subprocess.run([sys.executable, "-m", "mrl_llm", "plan", "--config", str(cfg), "--mode", "cpu"],
                       capture_output=True, text=True, cwd=REPO, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "mode=cpu" in r.stdout


@pytest.mark.ray
@pytest.mark.slow
def test_train_on_ray_from_the_command_line(tmp_path, capsys):
    """``--runtime ray`` starts a local Ray cluster itself, honours ``--leave``, writes the usual files,
    and shuts the cluster down; ``--resume`` continues the run on Ray."""
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        ray.shutdown()
    cfg = write_config(tmp_path / "cfg.yaml")
    out = tmp_path / "ray"
    assert main(["train", "--config", str(cfg), "--out", str(out), "--runtime", "ray", "--steps", "2",
                 "--leave", "b=1"]) == 0
    assert not ray.is_initialized()
    s = json.loads((out / "summary.json").read_text())
    assert s["runtime"] == "ray" and [e["event"] for e in s["events"]] == ["leave"]
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["policy"]) for r in rows if r["kind"] == "train"] == [(0, "a"), (0, "b"), (1, "a")]
    assert {r["step"] for r in rows if r["kind"] == "eval"} == {0, 2}
    assert (out / "eval.jsonl").is_file() and (out / "plan.txt").is_file()
    assert all((out / "policies" / n / "model.safetensors").is_file() for n in "ab")  # b exported as it left
    # resumed with one more step (the same config otherwise): b has left, a trains step 2
    assert main(["train", "--config", str(cfg), "--resume", str(out), "--runtime", "ray"]) == 2
    assert "the config differs from the run's in ['policies']" in capsys.readouterr().err  # --leave is config
    assert main(["train", "--config", str(cfg), "--resume", str(out), "--runtime", "ray", "--steps", "3",
                 "--leave", "b=1"]) == 0
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["policy"]) for r in rows if r["kind"] == "train"] == [(0, "a"), (0, "b"), (1, "a"), (2, "a")]
    assert {r["step"] for r in rows if r["kind"] == "eval"} == {0, 2, 3}


def test_the_final_lines_round_and_say_what_was_not_measured():
    from mrl_llm.cli import final_line

    p = {"name": "q", "eval_accuracy": 0.25, "peer_exclusive_accuracy": None, "kl_to_ref": 0.000123456,
         "entropy": 11.91653823852539}
    assert final_line(p) == "q: eval_accuracy=0.250 peer_exclusive_accuracy=n/a kl_to_ref=0.0001235 entropy=11.92"
    assert final_line({"name": "q"}) == ("q: eval_accuracy=n/a peer_exclusive_accuracy=n/a kl_to_ref=n/a "
                                         "entropy=n/a")  # nothing measured (no evaluation, no steps)


def test_a_group_of_one_under_grpo_is_warned_about(tmp_path, caplog):
    """G = 1 under own-group statistics trains on zero advantages: the run says so at its start and goes on."""
    import logging

    cfg = yaml.safe_load(write_config(tmp_path / "cfg.yaml").read_text())
    cfg["policies"][0]["group_size"] = 1
    cfg["steps"] = 0
    (tmp_path / "g1.yaml").write_text(yaml.safe_dump(cfg))
    with caplog.at_level(logging.WARNING, logger="mrl_llm.runner"):
        assert main(["train", "--config", str(tmp_path / "g1.yaml"), "--out", str(tmp_path / "run")]) == 0
    (msg,) = [r.getMessage() for r in caplog.records if "group_size 1" in r.getMessage()]
    assert msg.startswith("regime grpo: group_size 1 for ['a'] under own-group statistics")


def test_a_peer_sampling_beyond_its_tokenizer_does_not_end_a_prp_thl_run(tmp_path):
    """Policy b's model has 400 vocabulary rows, its tokenizer 320 (real models pad too): its random start
    samples ids >= 320, which THL refused ("outside the source vocabulary"), ending the run. They have no text:
    dropped, their mass unaligned, counted in thl_oov_tokens."""
    cfg = write_config(tmp_path / "cfg.yaml")
    assert main(["train", "--config", str(cfg), "--out", str(tmp_path / "run"), "--regime", "prp_thl"]) == 0
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    (a,) = [r for r in rows if r["kind"] == "train" and r["policy"] == "a"]
    assert a["thl_records"] > 0 and a["thl_oov_tokens"] > 0
