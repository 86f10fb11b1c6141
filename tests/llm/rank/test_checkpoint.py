"""A rank's checkpoint files (:mod:`mrl_llm.rank.checkpoint`) alone: RNG states, ``worker.json`` checks,
and which rank writes. The full save/resume round trip is pinned by ``tests/llm/test_resume.py``."""

from __future__ import annotations

import json
import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from mrl_llm.rank.checkpoint import read_state, restore_rng_state, save_checkpoint, save_rng_state
from mrl_llm.runstate import CheckpointError


def draws() -> tuple:
    return torch.rand(3).tolist(), random.random(), np.random.rand(2).tolist()


def test_rng_states_round_trip(tmp_path):
    save_rng_state(tmp_path / "rng.pt")
    first = draws()
    restore_rng_state(tmp_path / "rng.pt")
    assert draws() == first


def write(d, obj) -> None:
    (d / "worker.json").write_text(obj if isinstance(obj, str) else json.dumps(obj))


def test_worker_state_is_checked_before_anything_loads(tmp_path):
    good = {"version": 3, "nan_streak": 0, "counters": {"samples": 4}, "tokenizer_id": "t"}
    write(tmp_path, good)
    assert read_state(tmp_path, "t") == good
    with pytest.raises(ValueError, match="written with tokenizer 't', this policy uses 'u'; resume with the same"):
        read_state(tmp_path, "u")
    for bad in ({}, [], {"version": 3, "counters": {}, "tokenizer_id": "t"}):  # empty, not a mapping, a key missing
        write(tmp_path, bad)
        with pytest.raises(CheckpointError, match="expected the keys version, nan_streak, counters, tokenizer_id"):
            read_state(tmp_path, "t")
    write(tmp_path, "{not json")
    with pytest.raises(CheckpointError, match="corrupt worker state"):
        read_state(tmp_path, "t")


def fake_model(rank: int, calls: list) -> SimpleNamespace:
    return SimpleNamespace(group=SimpleNamespace(rank=rank),
                           optimizer_state=lambda: calls.append("gather") or {"state": {}, "param_groups": []})


def test_every_rank_exports_and_gathers_and_only_rank_0_writes(tmp_path):
    state = {"version": 1, "nan_streak": 0, "counters": {"samples": 2}, "tokenizer_id": "t"}
    for rank in (1, 0):
        d = tmp_path / f"rank{rank}"
        d.mkdir()
        calls = []
        save_checkpoint(d, fake_model(rank, calls), export=lambda p, calls=calls: calls.append(("export", p.name)),
                        state=state)
        assert calls == [("export", "model"), "gather"]  # both collectives on every rank, export first
        files = sorted(p.name for p in d.iterdir())
        assert files == ([] if rank else ["optimizer.pt", "rng.pt", "worker.json"])
    assert (tmp_path / "rank0" / "worker.json").read_text() == json.dumps(state)
