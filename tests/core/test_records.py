"""Records: validation names the field and producer; JSON round trip is lossless; views are right."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared_interfaces.records import (
    LOGPROB_FLOOR,
    ExperienceRecord,
    PromptGroup,
    RecordValidationError,
    RewardStats,
    TraceCache,
    dump_jsonl,
    load_jsonl,
    make_record_id,
    verified_successes,
)


def make(**kw) -> ExperienceRecord:
    base = dict(
        record_id="A/0/p/0", policy_id="A", policy_version=0, step=0, prompt_id="p", sample_index=0,
        prompt_text="Q", response_text="ans", token_ids=(1, 2, 3), token_logprobs=(-0.5, -1.0, 0.0),
        tokenizer_id="tok", reward=1.0, verified=True, verifier="math", finish_reason="stop",
    )
    base.update(kw)
    return ExperienceRecord(**base)


@pytest.mark.parametrize(
    "kw, field",
    [
        (dict(reward=float("nan")), "reward"),
        (dict(reward=float("inf")), "reward"),
        (dict(token_logprobs=(-0.5, 0.1, -1.0)), "token_logprobs"),
        (dict(token_logprobs=(-0.5, float("nan"), -1.0)), "token_logprobs"),
        (dict(token_logprobs=(-0.5, -1.0)), "token_logprobs"),
        (dict(token_logprobs=(-0.5, -1e308, -1.0)), "token_logprobs"),  # finite, but below LOGPROB_FLOOR
        (dict(token_ids=(1, -2, 3)), "token_ids"),
        (dict(schema_version=99), "schema_version"),
        (dict(finish_reason="eos"), "finish_reason"),
        (dict(policy_version=-1), "policy_version"),
        (dict(policy_id=""), "policy_id"),
        (dict(advantage=float("nan")), "advantage"),
        (dict(advantage="0.5"), "advantage"),
        (dict(prompt_text=["Q"]), "prompt_text"),
        (dict(response_text=None), "response_text"),
        (dict(verifier=1), "verifier"),
    ],
)
def test_invalid_records_are_rejected_naming_field_and_producer(kw, field):
    producer = kw.get("policy_id", "A")
    with pytest.raises(RecordValidationError) as err:
        make(**kw)
    msg = str(err.value)
    assert f"'{field}'" in msg
    assert repr(producer) in msg


@pytest.mark.parametrize(
    "kw, field",
    [
        (dict(token_ids=[1.7, 2.2, 3.0]), "token_ids"),  # was truncated to (1, 2, 3)
        (dict(token_ids=["1", "2", "3"]), "token_ids"),  # was parsed
        (dict(token_ids="123"), "token_ids"),  # was (1, 2, 3)
        (dict(token_ids={1: 0, 2: 0, 3: 0}), "token_ids"),  # was its keys
        (dict(token_ids=[True, False, True]), "token_ids"),
        (dict(token_ids=None), "token_ids"),  # was a TypeError
        (dict(token_ids=[[1], [2], [3]]), "token_ids"),
        (dict(token_logprobs=["-0.5", "-1", "0"]), "token_logprobs"),
        (dict(token_logprobs=[False, False, False]), "token_logprobs"),
        (dict(token_logprobs=[None, -1.0, 0.0]), "token_logprobs"),
        (dict(token_logprobs=[-10**400, -1.0, 0.0]), "token_logprobs"),  # was an OverflowError
        (dict(reward="1.0"), "reward"),
        (dict(reward=True), "reward"),
        (dict(reward=None), "reward"),
        (dict(reward=10**400), "reward"),
        (dict(advantage=10**400), "advantage"),
        (dict(schema_version=[1]), "schema_version"),  # was "unhashable type"
        (dict(schema_version=True), "schema_version"),
        (dict(schema_version=1.0), "schema_version"),
    ],
)
def test_odd_types_are_refused_not_coerced(kw, field):
    """A peer's record with a field of the wrong type is refused naming the field (a RecordValidationError,
    which the exchange reports with the producer), never coerced (``int(1.7)``, ``float("1")``) nor
    raised as a bare TypeError / OverflowError; the same through from_dict and from_json."""
    with pytest.raises(RecordValidationError, match=f"'{field}'"):
        make(**kw)
    d = {**make().to_dict(), **kw}
    with pytest.raises(RecordValidationError, match=f"'{field}'"):
        ExperienceRecord.from_dict(d)
    try:
        line = json.dumps(d)
    except TypeError:  # not JSON (a tuple key): the dict paths above are the test
        return
    with pytest.raises(RecordValidationError, match=f"'{field}'"):
        ExperienceRecord.from_json(line)


@pytest.mark.parametrize("orjson", [True, False])
def test_lines_that_are_not_json_records_are_validation_errors(monkeypatch, orjson):
    import shared_interfaces.records as records

    if not orjson:
        monkeypatch.setattr(records, "_orjson", None)
    for line in ["[" * 100_000, '{"record_id": ' + "[" * 5000 + "]" * 5000 + "}", b"\xff\xfe{}", ""]:
        with pytest.raises(RecordValidationError, match="not valid JSON"):
            ExperienceRecord.from_json(line)
    with pytest.raises(RecordValidationError, match="JSON object"):
        ExperienceRecord.from_dict([1, 2])  # type: ignore[arg-type]
    assert ExperienceRecord.from_json(make(token_ids=(), token_logprobs=()).to_json()).token_ids == ()


def test_records_are_frozen_and_hashable():
    r = make()
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.reward = 0.0  # type: ignore[misc]
    assert hash(r) == hash(make())


finite_logprob = st.floats(min_value=LOGPROB_FLOOR, max_value=0.0, allow_nan=False, allow_infinity=False)


@given(
    n=st.integers(0, 20).flatmap(
        lambda n: st.tuples(st.lists(st.integers(0, 2**31), min_size=n, max_size=n),
                            st.lists(finite_logprob, min_size=n, max_size=n))
    ),
    reward=st.floats(allow_nan=False, allow_infinity=False),
    text=st.text(),
    adv=st.one_of(st.none(), st.floats(allow_nan=False, allow_infinity=False)),
)
def test_json_round_trip_is_lossless(n, reward, text, adv):
    ids, lps = n
    r = make(token_ids=tuple(ids), token_logprobs=tuple(lps), reward=reward, response_text=text, advantage=adv)
    back = ExperienceRecord.from_json(r.to_json())
    assert back == r
    assert all(math.copysign(1, a) == math.copysign(1, b) for a, b in zip(back.token_logprobs, lps, strict=True))
    assert load_jsonl(dump_jsonl([r, r])) == [r, r]


@pytest.mark.parametrize("text", ["ans", "x\u2028y\u0085z\n", "lone \ud800 surrogate", "é ∑ 🙂"])
def test_both_json_codecs_write_lines_the_other_reads(monkeypatch, text):
    """orjson (when installed) and the stdlib fallback write and read each other's lines."""
    import shared_interfaces.records as records

    r = make(response_text=text, token_logprobs=(-0.1, -1e-300, -0.0), advantage=-2.5e-7)
    fast = r.to_json()
    monkeypatch.setattr(records, "_orjson", None)
    slow = r.to_json()
    assert ExperienceRecord.from_json(fast) == r and ExperienceRecord.from_json(slow) == r
    monkeypatch.undo()
    assert ExperienceRecord.from_json(fast) == r and ExperienceRecord.from_json(slow) == r
    assert "\n" not in fast and "\n" not in slow  # one line each


_ODD_VALUES = st.sampled_from([1, 1.0, 1.5, -1, True, "1", None, [], [1, -2], [1.0], [True], ["1"], [-0.5, 0.0],
                                [-0.5, 1], [float("nan")], (1, 2)])


@given(field=st.sampled_from(sorted(make().to_dict())), value=_ODD_VALUES,
       ids=st.lists(st.integers(0, 2**40), max_size=5), lps=st.lists(st.one_of(finite_logprob, st.integers(-3, 0)), max_size=5))
def test_from_dict_fast_path_equals_the_constructor(field, value, ids, lps):
    """from_dict's fast path (JSON lists filled in directly) gives exactly what ``ExperienceRecord(**d)``
    gives, record or error, for well-typed dicts and for any field replaced by an odd value."""
    d = {**make().to_dict(), "token_ids": ids, "token_logprobs": lps[: len(ids)] + [-1.0] * (len(ids) - len(lps))}
    for data in (d, {**d, field: value}):
        try:
            want: object = ExperienceRecord(**data)
        except Exception as err:  # noqa: BLE001 - the same error type is what is compared
            want = type(err)
        try:
            got: object = ExperienceRecord.from_dict(dict(data))
        except Exception as err:  # noqa: BLE001
            got = type(err)
        assert got == want
        if isinstance(got, ExperienceRecord):
            assert type(got.token_ids) is tuple and type(got.token_logprobs) is tuple and type(got.reward) is float
            assert all(type(x) is float for x in got.token_logprobs) and hash(got) == hash(want)


def test_from_json_rejects_unknown_and_missing_fields():
    d = make().to_dict()
    with pytest.raises(RecordValidationError, match="unknown field"):
        ExperienceRecord.from_dict({**d, "evil": "__import__('os')"})
    del d["reward"]
    with pytest.raises(RecordValidationError, match="missing field"):
        ExperienceRecord.from_dict(d)
    with pytest.raises(RecordValidationError, match="not valid JSON"):
        ExperienceRecord.from_json("{not json")
    with pytest.raises(RecordValidationError, match="JSON object"):
        ExperienceRecord.from_json(json.dumps([1, 2]))


def test_views_reward_stats_and_verified_successes():
    recs = [
        make(record_id=make_record_id("B", 0, "p", 1), policy_id="B", sample_index=1, reward=1.0),
        make(record_id=make_record_id("A", 0, "p", 0), reward=0.0),
        make(record_id=make_record_id("A", 0, "p", 1), sample_index=1, reward=1.0, verified=False),
        make(record_id=make_record_id("B", 0, "p", 0), policy_id="B", reward=1.0),
    ]
    s = RewardStats.of(recs)
    assert (s.n, s.mean, s.n_success, s.n_verified_success) == (4, 0.75, 3, 2)
    assert s.std == pytest.approx(0.5)
    assert RewardStats.of([]).n == 0 and RewardStats.of(recs[:1]).std == 0.0
    assert [r.record_id for r in verified_successes(recs)] == ["B/0/p/0", "B/0/p/1"]
    g = PromptGroup("p", 0, tuple(recs))
    assert [r.record_id for r in g.records] == ["A/0/p/0", "A/0/p/1", "B/0/p/0", "B/0/p/1"]
    assert g.policy_ids == ("A", "B")
    assert g.reward_stats("A").mean == 0.5
    assert g.verified_successes(exclude_policy="B") == []


def test_trace_cache_keys_by_record_and_tokenizer():
    calls = []
    cache = TraceCache(max_entries=2)
    f = lambda: calls.append(1) or len(calls)  # noqa: E731
    assert cache.get_or_compute("r1", "llama", f) == 1
    assert cache.get_or_compute("r1", "llama", f) == 1
    assert cache.get_or_compute("r1", "qwen", f) == 2
    assert (cache.hits, cache.misses) == (1, 2)
    cache.get_or_compute("r2", "qwen", f)
    assert len(cache) == 2  # LRU bound
