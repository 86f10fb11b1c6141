"""A run killed at its end, then resumed: after the last step's checkpoint (the final evaluation and the export
are done again, the summary counts the run's compute), while pruning with ``keep_checkpoints: 1`` (the step is
recorded before the older checkpoint goes), and in the middle of an export (never a half-written policy)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import mrl_llm.runner as runner
from mrl_llm.distributed.handles import LocalRef
from mrl_llm.trainer import train
from tests.llm.helpers import ShortAnswerVerifier, install_verifier, problems
from tests.llm.test_resume import assert_same, outputs, small_config


@pytest.fixture
def verifier(monkeypatch):
    v = ShortAnswerVerifier(max_chars=8)
    install_verifier(monkeypatch, v)
    return v


def _cut_rows(path, drop) -> int:
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    kept = [r for r in rows if not drop(r)]
    path.write_text("".join(json.dumps(r) + "\n" for r in kept))
    return len(rows) - len(kept)


def test_killed_after_the_last_checkpoint_the_resume_does_the_end_again(tmp_path, verifier):
    """As a kill after step 2's record and before the final evaluation and export leaves it: the resume runs no
    step, evaluates at step 3, exports both policies and reports the run's compute (it said 0 and kept the step-0
    evaluation as final)."""
    probs, evp = problems(5), problems(3, prefix="e")
    ref = train(small_config(3), tmp_path / "a", problems=probs, eval_problems=evp)
    b = tmp_path / "b"
    train(small_config(3), b, problems=probs, eval_problems=evp)
    shutil.rmtree(b / "policies")
    (b / "summary.json").unlink()
    assert _cut_rows(b / "eval.jsonl", lambda r: r["step"] == 3) > 0
    assert _cut_rows(b / "metrics.jsonl", lambda r: r["kind"] == "eval" and r["step"] == 3) == 2
    res = train(small_config(3), b, resume=True, problems=probs, eval_problems=evp)
    assert_same(outputs(tmp_path / "a"), outputs(b))
    assert [p["compute"] for p in res["policies"]] == [p["compute"] for p in ref["policies"]]
    assert [p["eval_accuracy"] for p in res["policies"]] == [p["eval_accuracy"] for p in ref["policies"]]
    assert res["policies"][0]["compute"]["optimizer_steps"] > 0


def test_keep_one_checkpoint_killed_right_after_pruning_resumes(tmp_path, verifier, monkeypatch):
    """``keep_checkpoints: 1``: a kill just after the older checkpoint was deleted. Pruned before step 1 was
    recorded, the only checkpoint left had no record and nothing could be resumed."""
    probs, evp = problems(5), problems(3, prefix="e")
    train(small_config(3, keep_checkpoints=1), tmp_path / "a", problems=probs, eval_problems=evp)
    real, calls = runner.prune, []

    def killed_after_pruning(policy_dir, keep):
        real(policy_dir, keep)
        calls.append(policy_dir.name)
        if len(calls) == 4:  # step 1's second policy: step_0 of both is gone
            raise KeyboardInterrupt("simulated kill")

    monkeypatch.setattr(runner, "prune", killed_after_pruning)
    with pytest.raises(KeyboardInterrupt):
        train(small_config(3, keep_checkpoints=1), tmp_path / "b", problems=probs, eval_problems=evp)
    monkeypatch.setattr(runner, "prune", real)
    assert sorted(p.name for p in (tmp_path / "b" / "checkpoints" / "bpe").glob("step_*")) == ["step_1"]
    train(small_config(3, keep_checkpoints=1), tmp_path / "b", resume=True, problems=probs, eval_problems=evp)
    assert_same(outputs(tmp_path / "a"), outputs(tmp_path / "b"))


class _Actor:
    """An actor whose export writes one file, then fails (a kill in the middle of writing a policy)."""

    class _Export:
        def __init__(self, fail: bool):
            self.fail = fail

        def remote(self, out_dir: str) -> LocalRef:
            def run():
                d = Path(out_dir)
                d.mkdir(parents=True, exist_ok=True)
                (d / "config.json").write_text("{}")
                if self.fail:
                    raise RuntimeError("killed while exporting")
                (d / "model.safetensors").write_text("new")
                return str(d)
            return LocalRef.of(run)

    def __init__(self, fail: bool):
        self.export = self._Export(fail)


def test_an_export_is_whole_or_not_there(tmp_path):
    dest = tmp_path / "policies" / "a"
    assert runner.export(_Actor(fail=False), dest) == dest  # the first export, and the empty case: no dest yet
    assert sorted(f.name for f in dest.iterdir()) == ["config.json", "model.safetensors"]
    (dest / "model.safetensors").write_text("old")
    with pytest.raises(RuntimeError, match="killed while exporting"):
        runner.export(_Actor(fail=True), dest)
    assert (dest / "model.safetensors").read_text() == "old"  # the earlier export, whole
    runner.export(_Actor(fail=False), dest)
    assert (dest / "model.safetensors").read_text() == "new" and not list(dest.parent.glob(".a.partial"))
