"""The SEE contract on both local implementations."""

from __future__ import annotations

import pytest

from shared_interfaces.exchange import DiskLogExchange, ExchangeConflictError, InMemoryExchange
from shared_interfaces.records import RecordValidationError
from tests.core.test_records import make


def recs(step=0, prompt="p"):
    out = []
    for pol in ("B", "A"):
        for g in (1, 0):
            out.append(make(record_id=f"{pol}/{step}/{prompt}/{g}", policy_id=pol, sample_index=g,
                            step=step, policy_version=step, prompt_id=prompt, reward=float(g)))
    return out


@pytest.fixture(params=["memory", "disk"])
def exchange(request, tmp_path):
    if request.param == "memory":
        return InMemoryExchange()
    return DiskLogExchange(tmp_path / "see.jsonl")


def test_fetch_canonical_order_and_own_exclusion(exchange):
    assert exchange.publish(recs()) == 4
    g = exchange.fetch_group("p", 0)
    assert [r.record_id for r in g.records] == ["A/0/p/0", "A/0/p/1", "B/0/p/0", "B/0/p/1"]
    peers = exchange.fetch_group("p", 0, requester="A", include_own=False)
    assert {r.policy_id for r in peers.records} == {"B"}
    assert exchange.fetch_group("p", 1).records == ()
    assert exchange.fetch_group("other", 0).records == ()
    with pytest.raises(ValueError, match="requester"):
        exchange.fetch_group("p", 0, include_own=False)


def test_republish_is_idempotent_and_conflicts_are_errors(exchange):
    exchange.publish(recs())
    assert exchange.publish(recs()) == 0
    assert len(exchange) == 4
    bad = make(record_id="A/0/p/0", reward=0.5)
    with pytest.raises(ExchangeConflictError, match="A/0/p/0"):
        exchange.publish([bad])
    assert len(exchange) == 4


def test_a_refused_batch_publishes_nothing(exchange, tmp_path):
    """A batch with a conflicting record (against the exchange or within the batch) or a non-record is
    refused whole: the records before the bad one are not half-added (the disk log used to hold them in
    memory but not in the log, so a retry was a no-op and a restart lost them)."""
    exchange.publish(recs()[:1])  # B/0/p/1
    fresh = make(record_id="C/0/p/0", policy_id="C")
    for batch, err in (([fresh, make(record_id="B/0/p/1", policy_id="B", sample_index=1, reward=0.0)],
                        ExchangeConflictError),
                       ([fresh, make(record_id="D/0/p/0", policy_id="D"),
                         make(record_id="D/0/p/0", policy_id="D", reward=0.0)], ExchangeConflictError),
                       ([fresh, "not a record"], TypeError)):
        with pytest.raises(err):
            exchange.publish(batch)
        assert len(exchange) == 1 and exchange.fetch_group("p", 0).policy_ids == ("B",)
    assert exchange.publish([fresh, fresh]) == 1 and exchange.publish([]) == 0
    if isinstance(exchange, DiskLogExchange):
        exchange.line("C/0/p/0")
        exchange.close()
        with DiskLogExchange(exchange.path) as again:
            assert [r.record_id for r in again.records()] == ["B/0/p/1", "C/0/p/0"]


def test_replay_names_the_log_line_of_a_conflict_or_bad_bytes(tmp_path):
    path = tmp_path / "see.jsonl"
    a, b = make(), make(reward=0.0)
    path.write_text(a.to_json() + "\n" + b.to_json() + "\n")
    with pytest.raises(ExchangeConflictError, match=r"see\.jsonl, line 2: record id 'A/0/p/0'"):
        DiskLogExchange(path)
    path.write_bytes(a.to_json().encode() + b"\n\xff\n")
    with pytest.raises(RecordValidationError, match=r"see\.jsonl, line 2: byte \d+ is not UTF-8"):
        DiskLogExchange(path)


def test_staleness_window(exchange):
    exchange.publish(recs(step=0) + recs(step=1) + recs(step=2))
    assert {r.step for r in exchange.fetch_group("p", 2).records} == {2}
    assert {r.step for r in exchange.fetch_group("p", 2, max_staleness=1).records} == {1, 2}
    assert exchange.prompt_ids(1) == ["p"]


def test_disk_log_replays_to_identical_state(tmp_path):
    path = tmp_path / "see.jsonl"
    with DiskLogExchange(path) as ex:
        ex.publish(recs(0) + recs(1, "q"))
        ex.publish(recs(0))  # duplicates are not logged twice
        before = list(ex.records())
    lines = path.read_text().splitlines()
    assert len(lines) == 8
    with DiskLogExchange(path) as ex2:
        assert list(ex2.records()) == before
        assert ex2.publish(recs(0)) == 0
        ex2.publish(recs(2))
    with DiskLogExchange(path) as ex3:
        assert len(ex3) == 12
        # each record's cached line is its canonical JSON and its line in the file, after a replay too
        assert [ex3.line(r.record_id) for r in ex3.records()] == [r.to_json() for r in ex3.records()]
        assert [ex3.line(r.record_id) for r in ex3.records()] == path.read_text().splitlines()


def test_disk_log_replays_responses_with_unicode_line_separators(tmp_path):
    """U+0085 (a byte-level model's C2 85), U+2028 and U+2029 are line breaks for str.splitlines() but
    not for JSON lines: the log must replay them inside their records."""
    path = tmp_path / "see.jsonl"
    odd = [make(record_id=f"A/0/p/{g}", sample_index=g, response_text=t, prompt_id="p")
           for g, t in enumerate(["a\x85b", "c\u2028d\u2029e", "f\x1cg\x1dh\x1ei"])]
    with DiskLogExchange(path) as ex:
        ex.publish(odd)
    with DiskLogExchange(path) as again:
        assert [r.response_text for r in again.records()] == [r.response_text for r in odd]


def test_disk_log_drops_torn_last_line(tmp_path):
    path = tmp_path / "see.jsonl"
    with DiskLogExchange(path) as ex:
        ex.publish(recs())
    with open(path, "a") as fh:
        fh.write('{"record_id": "A/9/p/0", "pol')  # a crash mid-write
    with pytest.warns(UserWarning, match="torn last line"):
        ex = DiskLogExchange(path)
    assert len(ex) == 4
    ex.publish(recs(step=1))
    ex.close()
    assert len(DiskLogExchange(path)) == 8


def test_disk_log_rejects_invalid_line(tmp_path):
    path = tmp_path / "see.jsonl"
    with DiskLogExchange(path) as ex:
        ex.publish(recs())
    text = path.read_text().replace('"reward":1.0', '"reward":NaN', 1)
    path.write_text(text)
    with pytest.raises(Exception, match="line"):
        DiskLogExchange(path)



def test_disk_log_publish_lines_logs_the_received_line(tmp_path):
    """A record received as JSON is logged as that line (not re-encoded) and replays to the same record;
    a line that would break the log (a newline inside) is replaced by the record's own JSON."""
    import json

    a, b = recs()[:2]
    spaced = json.dumps(a.to_dict(), indent=None, separators=(", ", ": "))  # valid, not canonical
    pretty = json.dumps(b.to_dict(), indent=1)
    with DiskLogExchange(tmp_path / "x.jsonl", fsync=False) as ex:
        assert ex.publish_lines([(a, spaced), (b, pretty)]) == 2
        assert ex.publish_lines([(a, a.to_json())]) == 0  # idempotent by id
        assert ex.line(a.record_id) == spaced and ex.line(b.record_id) == b.to_json()
    lines = (tmp_path / "x.jsonl").read_text().split("\n")
    assert lines == [spaced, b.to_json(), ""]
    assert list(DiskLogExchange(tmp_path / "x.jsonl").records()) == [a, b]
