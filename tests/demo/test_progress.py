"""The demo's progress lines: steps read from a run's metrics.jsonl while it writes, and printed while runs run."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import mrl_llm.demo.run as demo_run
import mrl_llm.demo.tokenizers as demo_toks
from mrl_llm.demo.progress import progress_line, steps_done
from mrl_llm.demo.setup import DemoConfig


def _rows(path, rows, tail=""):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + tail)


def test_steps_done_counts_distinct_train_steps(tmp_path):
    _rows(tmp_path / "metrics.jsonl", [
        {"kind": "eval", "step": 0},
        {"kind": "train", "step": 0, "policy": "a"}, {"kind": "train", "step": 0, "policy": "b"},
        {"kind": "train", "step": 1, "policy": "a"},
    ])
    assert steps_done(tmp_path) == 2


def test_steps_done_empty_and_malformed(tmp_path):
    assert steps_done(tmp_path / "missing") == 0  # not started yet
    (tmp_path / "metrics.jsonl").write_text("")
    assert steps_done(tmp_path) == 0
    # a line being written, a non-object and a row without an int step are skipped
    _rows(tmp_path / "metrics.jsonl", [{"kind": "train", "step": 0}, [1, 2], {"kind": "train", "step": "x"}],
          tail='{"kind": "train", "st')
    assert steps_done(tmp_path) == 1


def test_progress_line(tmp_path):
    (tmp_path / "r").mkdir()
    _rows(tmp_path / "r" / "metrics.jsonl", [{"kind": "train", "step": s} for s in range(3)])
    line = progress_line({"seed0/grpo": tmp_path / "r", "seed0/sgt": tmp_path / "none"}, 10, 12.4)
    assert line == "progress after 12 s: seed0/grpo 3/10, seed0/sgt 0/10"
    assert progress_line({}, 10, 1.0) == "progress after 1 s: nothing in flight"
    assert progress_line({}, 10, 1.0, sfts=["seed0/a"]) == "progress after 1 s: SFT running: seed0/a"
    assert progress_line({"seed0/grpo": tmp_path / "r"}, 10, 1.0, sfts=["seed1/a"]) == (
        "progress after 1 s: SFT running: seed1/a; seed0/grpo 3/10")


def test_run_demo_says_progress_while_runs_are_in_flight(tmp_path, monkeypatch):
    """Jobs replaced by slow fakes on a thread pool: the driver prints progress lines while they run."""
    def fake_sft(cfg, pol, seed, tok_dir, out_dir):
        return {"accuracy": {}, "train_s": 0.0}

    def fake_run(cfg, regime, seed, dirs, out_dir):
        from pathlib import Path

        d = Path(out_dir)
        d.mkdir(parents=True, exist_ok=True)
        for s in range(3):
            with (d / "metrics.jsonl").open("a") as f:
                f.write(json.dumps({"kind": "train", "step": s}) + "\n")
            time.sleep(0.15)
        return {"wall_s": 0.45}

    monkeypatch.setattr(demo_toks, "save_demo_tokenizers", lambda d, task, kinds=(): {"bytebpe": d, "spbpe": d})
    monkeypatch.setattr(demo_run, "sft_job", fake_sft)
    monkeypatch.setattr(demo_run, "run_job", fake_run)
    monkeypatch.setattr(demo_run, "_pool", lambda jobs: ThreadPoolExecutor(max_workers=jobs))
    monkeypatch.setattr(demo_run, "finish", lambda cfg, out, **kw: {})
    said: list[str] = []
    demo_run.run_demo(DemoConfig(steps=3, regimes=("grpo", "sgt")), tmp_path, jobs=2, say=said.append,
                      progress_every=0.1)
    prog = [s for s in said if s.startswith("progress after")]
    assert prog and all("seed0/grpo" in s or "seed0/sgt" in s for s in prog)
    assert any("/3" in s for s in prog)
