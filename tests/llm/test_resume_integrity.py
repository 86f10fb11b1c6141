"""Resume refuses an edited run directory, naming the file (issue 13, items 3-5, 9, 11), and a failed new run
leaves nothing behind (item 7); ``--out`` into a model directory is refused (item 1). The single-process
runtime on tiny models; the Ray runtime's resume checks are in ``test_ray.py``."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace

import pytest

from mrl_llm import cli
from mrl_llm.runstate import CheckpointError
from mrl_llm.trainer import train
from shared_interfaces.config_io import ConfigError
from tests.llm.helpers import ShortAnswerVerifier, install_verifier, problems
from tests.llm.test_resume import small_config


@pytest.fixture
def verifier(monkeypatch):
    v = ShortAnswerVerifier(max_chars=8)
    install_verifier(monkeypatch, v)
    return v


@pytest.fixture(scope="module")
def one_step_run(tmp_path_factory):
    """A finished 1-step run (checkpointed at step 0) trained from a dataset file; copied per test."""
    mp = pytest.MonkeyPatch()
    install_verifier(mp, ShortAnswerVerifier(max_chars=8))
    root = tmp_path_factory.mktemp("integrity")
    data = root / "train.jsonl"
    data.write_text("".join(json.dumps({"id": p.prompt_id, "question": p.question, "answer": p.gold}) + "\n"
                            for p in problems(4)))
    cfg = small_config(1, data={"path": str(data), "verifier": "short"}, eval={"enabled": False})
    train(cfg, root / "run")
    mp.undo()
    return cfg, root / "run", data


def _copy(src, tmp_path):
    dst = tmp_path / "run"
    shutil.copytree(src, dst)
    return dst


def _snapshot(d):
    return {p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def _steps(cfg, n):
    return replace(cfg, steps=n)


def _resume_fails(cfg, run, err, match):
    before = _snapshot(run)
    with pytest.raises(err, match=match):
        train(_steps(cfg, 2), run, resume=True)
    assert _snapshot(run) == before  # a refused resume changes nothing


def test_the_unedited_run_resumes(one_step_run, tmp_path, verifier):
    cfg, src, _ = one_step_run
    run = _copy(src, tmp_path)
    state = json.loads((run / "checkpoints" / "run_state.json").read_text())
    assert len(state["steps"]["0"]["exchange_sha256"]) == 64 and state["steps"]["0"]["exchange_records"] > 0
    assert (run / "checkpoints" / "bpe" / "step_0" / "manifest.json").is_file()
    train(_steps(cfg, 2), run, resume=True)
    assert sorted(json.loads((run / "checkpoints" / "run_state.json").read_text())["steps"]) == ["0", "1"]


@pytest.mark.parametrize("edit", ["byte", "insert", "delete"])
def test_resume_detects_an_edited_exchange_log(one_step_run, tmp_path, verifier, edit):
    cfg, src, _ = one_step_run
    run = _copy(src, tmp_path)
    ex = run / "exchange.jsonl"
    lines = ex.read_text().split("\n")[:-1]
    rec = json.loads(lines[1])
    if edit == "byte":  # a wrong answer claimed correct, same length
        old, new = ('"reward":0.0', '"reward":1.0') if rec["reward"] == 0.0 else ('"reward":1.0', '"reward":0.0')
        lines[1] = lines[1].replace(old, new)
        assert lines[1] != ex.read_text().split("\n")[1]
    elif edit == "insert":
        lines.insert(1, lines[1].replace(rec["record_id"], rec["record_id"] + "x"))
    else:
        del lines[1]
    ex.write_text("".join(x + "\n" for x in lines))
    _resume_fails(cfg, run, CheckpointError, r"exchange\.jsonl was edited")


def test_resume_detects_a_flipped_bit_in_a_checkpoint_file(one_step_run, tmp_path, verifier):
    cfg, src, _ = one_step_run
    run = _copy(src, tmp_path)
    f = run / "checkpoints" / "bytes" / "step_0" / "model" / "model.safetensors"
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0x10
    f.write_bytes(bytes(data))
    _resume_fails(cfg, run, CheckpointError, r"bytes/step_0/model/model\.safetensors does not match its digest")


@pytest.mark.parametrize("name", ["run_state.json", "bpe/step_0/worker.json", "bpe/step_0/actor.json",
                                  "bytes/step_0/manifest.json"])
def test_resume_names_a_corrupt_json_state_file(one_step_run, tmp_path, verifier, name):
    cfg, src, _ = one_step_run
    run = _copy(src, tmp_path)
    f = run / "checkpoints" / name
    f.write_text(f.read_text()[:-7])
    _resume_fails(cfg, run, CheckpointError, name.replace(".", r"\."))


def test_resume_refuses_an_edited_dataset_naming_it(one_step_run, tmp_path, verifier):
    cfg, src, data = one_step_run
    run = _copy(src, tmp_path)
    rows = [json.loads(x) for x in data.read_text().splitlines()]
    rows[2]["answer"] = "12345"  # same ids, another gold answer
    edited = tmp_path / "train.jsonl"
    edited.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg2 = replace(cfg, data=replace(cfg.data, path=str(edited)))
    saved = json.loads((run / "config.json").read_text())
    (run / "config.json").write_text(json.dumps({**saved, "data": {**saved["data"], "path": str(edited)}}))
    _resume_fails(cfg2, run, ValueError, f"cannot resume: {edited} differs from the dataset")


def test_a_new_run_that_fails_to_start_leaves_nothing(tmp_path, verifier):
    good = small_config(1, eval={"enabled": False})
    bad = replace(good, policies=(good.policies[0], replace(good.policies[1], tokenizer_dir=str(tmp_path / "nope"))))
    with pytest.raises(Exception, match="nope"):
        train(bad, tmp_path / "run", problems=problems(4))
    assert not (tmp_path / "run").exists()
    (tmp_path / "empty").mkdir()
    with pytest.raises(Exception, match="nope"):
        train(bad, tmp_path / "empty", problems=problems(4))
    assert (tmp_path / "empty").is_dir() and not any((tmp_path / "empty").iterdir())
    train(good, tmp_path / "run", problems=problems(4))  # the same directory, rerun: works


def test_cli_out_into_a_model_directory_is_refused_and_keeps_its_files(tmp_path, capsys):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "qwen2"}')
    (model / "model.safetensors").write_bytes(b"weights")
    cfg = tmp_path / "c.yaml"
    cfg.write_text("policies: [{name: a, model_config: {model_type: llama}, tokenizer_dir: utf8-bytes}]\n"
                   "data: {path: nowhere.jsonl, verifier: math}\n")
    assert cli.main(["train", "--config", str(cfg), "--out", str(model)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is not empty" in err[0] and "not a run directory" in err[0]
    assert (model / "config.json").read_text() == '{"model_type": "qwen2"}'
    assert sorted(p.name for p in model.iterdir()) == ["config.json", "model.safetensors"]


@pytest.fixture(scope="module")
def two_step_run(tmp_path_factory):
    """A finished 2-step run (checkpoints of steps 0 and 1, evaluations at 0 and 2); copied per test."""
    mp = pytest.MonkeyPatch()
    install_verifier(mp, ShortAnswerVerifier(max_chars=8))
    root = tmp_path_factory.mktemp("two")
    probs, evp = problems(5), problems(3, prefix="e")
    train(small_config(2), root / "run", problems=probs, eval_problems=evp)
    mp.undo()
    return root / "run", probs, evp


def _lines(path):
    return path.read_text().splitlines(keepends=True)


def test_a_torn_row_of_a_checkpointed_step_is_refused(two_step_run, tmp_path, verifier):
    """Rows of steps <= S are written before S is recorded: only an edit tears one. It was dropped silently."""
    src, probs, evp = two_step_run
    run = _copy(src, tmp_path)
    m = run / "metrics.jsonl"
    rows = _lines(m)
    train_rows = [x for x in rows if json.loads(x)["kind"] == "train"]
    m.write_text("".join(rows[: rows.index(train_rows[-1])]) + train_rows[-1][: len(train_rows[-1]) // 2])
    before = _snapshot(run)
    with pytest.raises(CheckpointError, match=r"metrics\.jsonl, line \d+: a row of step 1 cut off mid-write"):
        train(small_config(3), run, resume=True, problems=probs, eval_problems=evp)
    assert _snapshot(run) == before


def test_a_torn_evaluation_row_after_the_checkpoint_is_done_again(two_step_run, tmp_path, verifier):
    """Killed while logging the evaluation after the last checkpoint (step 2): that evaluation is dropped from
    both logs and done again, so no policy's row of it is missing."""
    src, probs, evp = two_step_run
    run = _copy(src, tmp_path)
    e = run / "eval.jsonl"
    rows = _lines(e)
    assert json.loads(rows[-1])["step"] == 2
    e.write_text("".join(rows[:-1]) + rows[-1][:40])
    shutil.rmtree(run / "policies")
    train(small_config(2), run, resume=True, problems=probs, eval_problems=evp)
    assert _lines(e) == rows
    evals = lambda d: [{k: v for k, v in json.loads(x).items() if not k.endswith("_s")}  # noqa: E731
                       for x in _lines(d / "metrics.jsonl") if json.loads(x)["kind"] == "eval"]
    assert evals(run) == evals(src)


def test_resume_with_fewer_steps_than_trained_is_refused(two_step_run, tmp_path, verifier):
    src, probs, evp = two_step_run
    run = _copy(src, tmp_path)
    before = _snapshot(run)
    with pytest.raises(ConfigError, match=r"the run has trained 2 steps .* more than steps 1; give --steps 2 or more"):
        train(small_config(1), run, resume=True, problems=probs, eval_problems=evp)
    assert _snapshot(run) == before


def test_a_damaged_checkpoint_says_how_to_resume_from_the_one_before(two_step_run, tmp_path, verifier):
    src, probs, evp = two_step_run
    run = _copy(src, tmp_path)
    (run / "checkpoints" / "bpe" / "step_1" / "optimizer.pt").unlink()
    with pytest.raises(CheckpointError, match=r"optimizer\.pt is missing .* remove \S+bpe/step_1 to resume from the "
                                              r"checkpoint before it"):
        train(small_config(3), run, resume=True, problems=probs, eval_problems=evp)
    shutil.rmtree(run / "checkpoints" / "bpe" / "step_1")  # as it says
    res = train(small_config(3), run, resume=True, problems=probs, eval_problems=evp)
    assert res["steps"] == 3 and (run / "policies" / "bpe" / "model.safetensors").is_file()
