"""The per-step prompt cursor: deterministic, epoch-wrapping, resumable."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mrl_llm.data import DataCursor, Problem


def problems(n):
    return [Problem(f"p{i}", f"q{i}", "1", "math") for i in range(n)]


def ids(batch):
    return [p.prompt_id for p in batch]


def test_same_seed_same_batches_other_seed_other_order():
    a, b, c = (
        DataCursor(problems(20), 6, seed=1),
        DataCursor(problems(20), 6, seed=1),
        DataCursor(problems(20), 6, seed=2),
    )
    seq_a = [ids(a.next_batch()) for _ in range(10)]
    assert seq_a == [ids(b.next_batch()) for _ in range(10)]
    assert seq_a != [ids(c.next_batch()) for _ in range(10)]


def test_epochs_are_permutations_and_batches_wrap():
    cur = DataCursor(problems(10), 4, seed=0)
    flat = [pid for _ in range(5) for pid in ids(cur.next_batch())]  # 20 draws = exactly 2 epochs
    first, second = flat[:10], flat[10:]
    assert sorted(first) == sorted(second) == sorted(f"p{i}" for i in range(10))
    assert first != second  # each epoch has its own order
    assert cur.epoch == 1 and cur.position == 10


def test_no_shuffle_keeps_file_order():
    cur = DataCursor(problems(5), 3, shuffle=False)
    assert [ids(cur.next_batch()) for _ in range(3)] == [
        ["p0", "p1", "p2"],
        ["p3", "p4", "p0"],
        ["p1", "p2", "p3"],
    ]


def test_batch_larger_than_dataset():
    cur = DataCursor(problems(3), 7, seed=0)
    batch = ids(cur.next_batch())
    assert len(batch) == 7 and set(batch) == {"p0", "p1", "p2"}


@given(n=st.integers(1, 30), batch=st.integers(1, 12), k=st.integers(0, 15), seed=st.integers(0, 5))
def test_resume_continues_exactly(n, batch, k, seed):
    straight = DataCursor(problems(n), batch, seed=seed)
    expected = [ids(straight.next_batch()) for _ in range(k + 5)]
    first = DataCursor(problems(n), batch, seed=seed)
    for _ in range(k):
        first.next_batch()
    state = json.loads(json.dumps(first.state_dict()))  # it survives a JSON checkpoint
    resumed = DataCursor(problems(n), batch, seed=seed)
    resumed.load_state_dict(state)
    assert [ids(resumed.next_batch()) for _ in range(5)] == expected[k:]


def test_resume_refuses_another_dataset_or_setting():
    state = DataCursor(problems(10), 4, seed=0).state_dict()
    for other in (
        DataCursor(problems(11), 4, seed=0),
        DataCursor(problems(10), 5, seed=0),
        DataCursor(problems(10), 4, seed=1),
    ):
        with pytest.raises(ValueError, match="cannot resume"):
            other.load_state_dict(state)
    renamed = [Problem(f"x{i}", "q", "1", "math") for i in range(10)]
    with pytest.raises(ValueError, match="fingerprint"):
        DataCursor(renamed, 4, seed=0).load_state_dict(state)


def test_resume_refuses_an_edited_dataset_naming_it():
    """The fingerprint covers what the run uses of each row, not only its id (issue 13, item 4)."""
    base = [Problem(f"p{i}", f"question {i}", str(i), "mcq", choices=("a", "b")) for i in range(6)]
    state = DataCursor(base, 2, seed=0, source="data/train.jsonl").state_dict()
    edits = [
        {"question": "question 0, edited"},
        {"gold": "99"},
        {"choices": ("a", "c")},
        {"verifier": "math"},
    ]
    for edit in edits:
        rows = [replace(base[0], **edit), *base[1:]]
        with pytest.raises(ValueError, match=r"cannot resume: data/train.jsonl differs"):
            DataCursor(rows, 2, seed=0, source="data/train.jsonl").load_state_dict(state)
    DataCursor(list(base), 2, seed=0).load_state_dict(state)  # the same rows resume
    with pytest.raises(ValueError, match="version"):
        DataCursor(base, 2, seed=0).load_state_dict({**state, "version": 1})


def test_bad_arguments():
    with pytest.raises(ValueError, match="empty"):
        DataCursor([], 2)
    with pytest.raises(ValueError, match="batch_size"):
        DataCursor(problems(2), 0)
