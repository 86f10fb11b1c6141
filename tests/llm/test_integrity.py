"""Run-directory integrity pieces (issue 13): checkpoint manifests, log digests, corrupt JSON state files,
the ``--out`` checks, the clean-up of a failed new run, rolled-back metrics rows and the CLI's one-line
errors. Fast unit tests; the trainer-level ones are in ``test_resume_integrity.py``."""

from __future__ import annotations

import hashlib
import json
import os

import pytest

from mrl_llm import cli
from mrl_llm.config import config_from_mapping
from mrl_llm.metrics import mark_rolled_back, read_metrics
from mrl_llm.resume import load_run_state, record_checkpoint
from mrl_llm.rundir import check_run_dir, new_run_guard
from mrl_llm.runstate import (
    CheckpointError,
    lines_digest,
    read_json,
    verify_manifest,
    write_manifest,
)


def _step_dir(tmp_path):
    d = tmp_path / "step_3"
    (d / "model").mkdir(parents=True)
    (d / "model" / "model.safetensors").write_bytes(bytes(range(256)) * 8)
    (d / "optimizer.pt").write_bytes(b"optimizer state")
    (d / "worker.json").write_text('{"version": 4}')
    return d


def test_manifest_lists_every_file_and_verifies(tmp_path):
    d = _step_dir(tmp_path)
    write_manifest(d)
    (d / "actor.json").write_text("{}")  # written after the manifest, not listed
    man = json.loads((d / "manifest.json").read_text())
    assert sorted(man["files"]) == ["model/model.safetensors", "optimizer.pt", "worker.json"]
    want = hashlib.sha256((d / "optimizer.pt").read_bytes()).hexdigest()
    assert man["files"]["optimizer.pt"] == {"bytes": 15, "sha256": want} and man["algorithm"] == "sha256"
    verify_manifest(d)


def test_manifest_of_an_empty_step_dir(tmp_path):
    d = tmp_path / "step_0"
    d.mkdir()
    write_manifest(d)
    verify_manifest(d)
    assert json.loads((d / "manifest.json").read_text())["files"] == {}


def test_a_flipped_bit_names_the_file(tmp_path):
    d = _step_dir(tmp_path)
    write_manifest(d)
    f = d / "model" / "model.safetensors"
    data = bytearray(f.read_bytes())
    data[100] ^= 0x01
    f.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"model\.safetensors does not match its digest"):
        verify_manifest(d)


@pytest.mark.parametrize("damage", ["missing", "extra", "truncated", "manifest_json", "manifest_shape", "no_manifest"])
def test_a_damaged_checkpoint_is_an_error_naming_the_file(tmp_path, damage):
    d = _step_dir(tmp_path)
    write_manifest(d)
    if damage == "missing":
        (d / "optimizer.pt").unlink()
        match = r"optimizer\.pt is missing"
    elif damage == "extra":
        (d / "rng.pt").write_bytes(b"x")
        match = r"rng\.pt is not in"
    elif damage == "truncated":
        (d / "worker.json").write_text('{"vers')
        match = r"worker\.json does not match"
    elif damage == "manifest_json":
        (d / "manifest.json").write_text('{"version": 1, "files": {')
        match = r"manifest\.json: corrupt checkpoint manifest"
    elif damage == "manifest_shape":
        (d / "manifest.json").write_text('{"version": 1, "algorithm": "sha256", "files": {"worker.json": 3}}')
        match = r"manifest\.json: not a version-1"
    else:
        (d / "manifest.json").unlink()
        match = r"has no manifest\.json"
    with pytest.raises(CheckpointError, match=match):
        verify_manifest(d)


def test_corrupt_json_state_files_name_the_file(tmp_path):
    (tmp_path / "worker.json").write_bytes(b'{"version": 1,')
    with pytest.raises(CheckpointError, match=r"worker\.json: corrupt worker state"):
        read_json(tmp_path / "worker.json", "worker state")
    (tmp_path / "bin.json").write_bytes(b"\xff\xfe{}")
    with pytest.raises(CheckpointError, match=r"bin\.json: corrupt"):
        read_json(tmp_path / "bin.json")
    assert load_run_state(tmp_path) is None  # none yet: a new run
    record_checkpoint(tmp_path, 0, (3, "ab" * 32), "fingerprint")
    assert load_run_state(tmp_path)["steps"]["0"] == {"exchange_records": 3, "exchange_sha256": "ab" * 32}
    (tmp_path / "checkpoints" / "run_state.json").write_text("")
    with pytest.raises(CheckpointError, match=r"run_state\.json: corrupt run state"):
        load_run_state(tmp_path)
    for bad in ("[1, 2]", '{"version": 1, "step": 0, "exchange_lines": 4}'):  # the old line-count state too
        (tmp_path / "checkpoints" / "run_state.json").write_text(bad)
        with pytest.raises(CheckpointError, match=r"run_state\.json: not a version-2 run state"):
            load_run_state(tmp_path)


def test_the_in_process_exchange_digest_covers_the_records_up_to_the_step(tmp_path):
    from mrl_llm.distributed.backends import LocalBackend
    from tests.distributed.records_util import make_record

    be = LocalBackend(exchange_fsync=False)
    be.open(tmp_path)
    assert be.exchange_digest(0) == lines_digest([]) == (0, hashlib.sha256().hexdigest())  # an empty log
    be.exchange.publish([make_record(p, s, "q", k) for s in (0, 1) for p in "ab" for k in range(2)])
    be.close()
    lines = (tmp_path / "exchange.jsonl").read_bytes().split(b"\n")[:-1]
    assert be.exchange_digest(0) == lines_digest(lines[:4]) and be.exchange_digest(1) == lines_digest(lines)
    with open(tmp_path / "exchange.jsonl", "ab") as fh:  # a torn last line is not a record: not covered
        fh.write(b'{"torn')
    be2 = LocalBackend(exchange_fsync=False)
    with pytest.warns(UserWarning, match="torn last line"):
        be2.open(tmp_path)
    assert be2.exchange_digest(1) == lines_digest(lines)
    be2.close()


def _cfg():
    return config_from_mapping({"policies": [{"name": "a", "model_config": {"model_type": "llama"},
                                              "tokenizer_dir": "utf8-bytes"}]})


def test_out_into_a_non_empty_directory_that_is_not_a_run_is_refused(tmp_path):
    model = tmp_path / "hf_model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "llama"}')
    with pytest.raises(FileExistsError, match=r"is not empty \(it holds config\.json, \.\.\.\) and is not a run"):
        check_run_dir(_cfg(), model, resume=False)
    assert (model / "config.json").read_text() == '{"model_type": "llama"}'
    (tmp_path / "f").write_text("x")
    with pytest.raises(FileExistsError, match="is a file"):
        check_run_dir(_cfg(), tmp_path / "f", resume=False)
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.json").write_text("{}")
    with pytest.raises(FileExistsError, match="stopped before its first checkpoint"):  # nothing --resume could use
        check_run_dir(_cfg(), run, resume=False)
    (run / "checkpoints" / "run_state.json").write_text("{}")
    with pytest.raises(FileExistsError, match=f"pass --resume {run}"):
        check_run_dir(_cfg(), run, resume=False)
    (tmp_path / "empty").mkdir()
    check_run_dir(_cfg(), tmp_path / "empty", resume=False)  # empty or new: fine
    check_run_dir(_cfg(), tmp_path / "new" / "deeper", resume=False)


def test_a_read_only_out_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "access", lambda path, mode: False)  # tests run as root, which may write anywhere
    with pytest.raises(PermissionError, match=r"is not writable \(a read-only directory\?\)"):
        check_run_dir(_cfg(), tmp_path / "new", resume=False)


def test_a_corrupt_config_json_on_resume_names_the_file(tmp_path):
    (tmp_path / "config.json").write_text('{"seed": ')
    with pytest.raises(CheckpointError, match=r"config\.json: corrupt run config"):
        check_run_dir(_cfg(), tmp_path, resume=True)


def test_a_failed_new_run_leaves_nothing_behind(tmp_path):
    out = tmp_path / "run"
    with pytest.raises(RuntimeError), new_run_guard(out, resume=False):
        out.mkdir()
        (out / "config.json").write_text("{}")
        (out / "exchange.jsonl").write_text("")
        raise RuntimeError("model does not load")
    assert not out.exists()
    given = tmp_path / "given"
    given.mkdir()
    with pytest.raises(KeyboardInterrupt), new_run_guard(given, resume=False):
        (given / "config.json").write_text("{}")
        (given / "plan").mkdir()
        (given / "plan" / "x").write_text("")
        raise KeyboardInterrupt
    assert given.is_dir() and not any(given.iterdir())  # the user's (empty) directory stays


def test_a_failed_run_keeps_its_checkpoint_and_a_full_dir_is_never_touched(tmp_path):
    out = tmp_path / "run"
    with pytest.raises(RuntimeError), new_run_guard(out, resume=False):
        record_checkpoint(out, 0, (0, "digest"), "fingerprint")
        raise RuntimeError("crash in step 3")
    assert (out / "checkpoints" / "run_state.json").is_file()  # resumable: kept
    full = tmp_path / "full"
    full.mkdir()
    (full / "mine.txt").write_text("x")
    with pytest.raises(RuntimeError), new_run_guard(full, resume=False):
        raise RuntimeError("boom")
    assert (full / "mine.txt").read_text() == "x"
    with pytest.raises(RuntimeError), new_run_guard(tmp_path / "res", resume=True):
        (tmp_path / "res").mkdir()
        raise RuntimeError("a resume never cleans up")
    assert (tmp_path / "res").is_dir()


def _rows(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_rolled_back_rows_are_marked_and_skipped_by_readers(tmp_path):
    p = tmp_path / "metrics.jsonl"
    rows = [{"kind": k, "step": s, "policy": n, "reward_mean": 0.5} for s in range(4) for n in "ab"
            for k in ("train", "eval")]
    _rows(p, rows)
    assert mark_rolled_back(p, "b", [1, 2]) == 2
    assert mark_rolled_back(p, "b", [1, 2]) == 0  # idempotent
    assert mark_rolled_back(p, "b", []) == 0 and mark_rolled_back(tmp_path / "none.jsonl", "b", [1]) == 0
    every = read_metrics(p, rolled_back=True)
    assert len(every) == len(rows)
    assert {(r["step"], r["policy"]) for r in every if r.get("rolled_back")} == {(1, "b"), (2, "b")}
    assert all(r["kind"] == "train" for r in every if r.get("rolled_back"))
    kept = read_metrics(p)
    assert len(kept) == len(rows) - 2 and not any(r.get("rolled_back") for r in kept)


def test_read_metrics_names_a_malformed_line(tmp_path):
    p = tmp_path / "metrics.jsonl"
    p.write_text('{"kind": "train"}\n{"kind": \n')
    with pytest.raises(ValueError, match=r"metrics\.jsonl, line 2: not a JSON row"):
        read_metrics(p)
    p.write_text("")
    assert read_metrics(p) == []


def test_cli_turns_a_permission_error_into_one_line(tmp_path, monkeypatch, capsys):
    import mrl_llm.trainer as trainer

    def denied(*a, **k):
        raise PermissionError(13, "Permission denied", str(tmp_path / "ro" / "config.json"))

    monkeypatch.setattr(trainer, "train", denied)
    cfg = tmp_path / "c.yaml"
    cfg.write_text("policies: [{name: a, model_config: {model_type: llama}, tokenizer_dir: utf8-bytes}]\n")
    assert cli.main(["train", "--config", str(cfg), "--out", str(tmp_path / "ro")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "ro/config.json: Permission denied" in err[0] and "writable" in err[0]


def test_cli_names_a_corrupt_checkpoint(tmp_path, monkeypatch, capsys):
    import mrl_llm.trainer as trainer

    def corrupt(*a, **k):
        raise CheckpointError(f"checkpoint file {tmp_path}/x.safetensors does not match its digest")

    monkeypatch.setattr(trainer, "train", corrupt)
    cfg = tmp_path / "c.yaml"
    cfg.write_text("policies: [{name: a, model_config: {model_type: llama}, tokenizer_dir: utf8-bytes}]\n")
    assert cli.main(["train", "--config", str(cfg), "--resume", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "x.safetensors does not match its digest" in err[0]
