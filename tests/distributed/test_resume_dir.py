"""Resuming a run directory (both backends): the resume step comes from the checkpoints; the logs are cut back to it."""

from __future__ import annotations

import json

import pytest

from mrl_llm.config import config_from_mapping
from mrl_llm.resume import record_checkpoint, restore_run_dir, resume_step

from .records_util import make_record


def _config(**c):
    pol = {"model_config": {"model_type": "llama"}, "tokenizer_dir": "utf8-bytes"}
    return config_from_mapping({"steps": 5, "runtime": {"backend": "ray"}, "policies": [
        {"name": "a", **pol}, {"name": "b", **pol}, {"name": "c", **pol, "join_step": 3, **c}]})


def _checkpoint(out, policy, step, complete=True):
    d = out / "checkpoints" / policy / f"step_{step}"
    d.mkdir(parents=True)
    (d / "worker.json").write_text("{}")
    if complete:
        (d / "actor.json").write_text(json.dumps({"step": step, "version": step + 1}))
    (out / "checkpoints" / policy / "LATEST").write_text(d.name)
    record_checkpoint(out, step, (0, "digest"), "fingerprint")


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_resume_step_is_the_newest_step_every_active_policy_saved(tmp_path):
    cfg = _config()
    for s in (0, 1, 2):
        _checkpoint(tmp_path, "a", s)
    _checkpoint(tmp_path, "b", 0)
    _checkpoint(tmp_path, "b", 1)
    _checkpoint(tmp_path, "b", 2, complete=False)  # b died while saving step 2
    assert resume_step(cfg, tmp_path) == 1
    _checkpoint(tmp_path, "c", 3)  # c is not active before step 3: it does not hold back step 1
    for p in "ab":
        (tmp_path / "checkpoints" / p / "step_3").mkdir()
    assert resume_step(cfg, tmp_path) == 1  # step 3 is incomplete for a and b


def test_no_complete_checkpoint_is_an_error_that_says_what_to_do(tmp_path):
    _checkpoint(tmp_path, "a", 0)
    with pytest.raises(FileNotFoundError, match="nothing to resume"):
        resume_step(_config(), tmp_path)


def test_restore_cuts_checkpoints_and_logs_back_to_the_step(tmp_path):
    cfg = _config()
    for p, steps in (("a", (1, 2)), ("b", (1,)), ("c", (3,))):
        for s in steps:
            _checkpoint(tmp_path, p, s)
    recs = [make_record(p, s, "q", k) for s in range(3) for p in "ab" for k in range(2)]
    (tmp_path / "exchange.jsonl").write_text("".join(r.to_json() + "\n" for r in recs) + '{"torn')
    _jsonl(tmp_path / "metrics.jsonl", [{"kind": k, "step": s, "policy": "a"} for s in range(4) for k in ("train", "eval")])
    _jsonl(tmp_path / "eval.jsonl", [{"step": s, "policy": "a", "prompt_id": "q"} for s in range(4)])
    _jsonl(tmp_path / "events.jsonl", [{"event": "gap", "step": 2, "policy": "b"}, {"event": "join", "step": 0, "policy": "a"}])
    (tmp_path / "summary.json").write_text("{}")

    kept = restore_run_dir(cfg, tmp_path, resume_step(cfg, tmp_path))
    assert kept == {"exchange_records": 8, "metrics_rows": 5, "eval_rows": 3, "events": 1}
    assert [json.loads(x)["step"] for x in (tmp_path / "exchange.jsonl").read_text().splitlines()] == [0] * 4 + [1] * 4
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert {(r["kind"], r["step"]) for r in rows} == {("train", 0), ("eval", 0), ("train", 1), ("eval", 1), ("eval", 2)}
    ck = tmp_path / "checkpoints"
    assert (ck / "a" / "LATEST").read_text() == "step_1" and not (ck / "a" / "step_2").exists()
    assert (ck / "b" / "LATEST").read_text() == "step_1"
    assert not (ck / "c" / "LATEST").exists() and not (ck / "c" / "step_3").exists()  # c joins later, afresh
    events = [json.loads(x) for x in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events] == ["join", "resume"] and events[-1]["checkpoint_step"] == 1
    assert not (tmp_path / "summary.json").exists()


def test_a_corrupt_log_line_is_named_and_nothing_is_changed(tmp_path):
    from mrl_llm.runstate import CheckpointError

    cfg = _config()
    for p in "ab":
        _checkpoint(tmp_path, p, 0)
        _checkpoint(tmp_path, p, 1)
    _jsonl(tmp_path / "exchange.jsonl", [])
    (tmp_path / "metrics.jsonl").write_text('{"kind": "train", "step": 0, "policy": "a"}\n{"kind": "tr\n')
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    with pytest.raises(CheckpointError, match=r"metrics\.jsonl, line 2: not a JSON row"):
        restore_run_dir(cfg, tmp_path, 0)
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before  # step_1 dirs kept too


def test_torn_and_empty_logs_when_restoring(tmp_path):
    """Empty logs restore to empty; a torn tail whose step cannot be read is dropped, and evaluation S + 1 with it
    (it may be one of its rows: it is done again); a torn row of a later train step is dropped alone."""
    cfg = _config()
    for p in "ab":
        _checkpoint(tmp_path, p, 1)
    for name in ("exchange.jsonl", "metrics.jsonl", "eval.jsonl", "events.jsonl"):
        (tmp_path / name).write_text("")
    kept = restore_run_dir(cfg, tmp_path, 1)
    assert (kept["metrics_rows"], kept["eval_rows"], kept["exchange_records"]) == (0, 0, 0)
    rows = [{"kind": "train", "step": 1, "policy": "a"}, {"kind": "eval", "step": 2, "policy": "a"}]
    _jsonl(tmp_path / "metrics.jsonl", rows)
    _jsonl(tmp_path / "eval.jsonl", [{"step": 2, "policy": "a"}])
    with open(tmp_path / "metrics.jsonl", "a") as fh:
        fh.write('{"ki')  # torn before its step
    kept = restore_run_dir(cfg, tmp_path, 1)
    assert (kept["metrics_rows"], kept["eval_rows"]) == (1, 0)  # evaluation 2 is dropped to be done again
    _jsonl(tmp_path / "metrics.jsonl", rows)
    _jsonl(tmp_path / "eval.jsonl", [{"step": 2, "policy": "a"}])
    with open(tmp_path / "metrics.jsonl", "a") as fh:
        fh.write('{"kind": "train", "step": 3, "pol')  # a later step's row: dropped, evaluation 2 kept
    kept = restore_run_dir(cfg, tmp_path, 1)
    assert (kept["metrics_rows"], kept["eval_rows"]) == (2, 1)
