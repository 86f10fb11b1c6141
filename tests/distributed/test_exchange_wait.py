"""Pipelined publishing: a fetch with ``expect`` waits in the exchange service for the peers' records."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time

import pytest

from mrl_llm.distributed.exchange_actor import ExchangeService
from shared_interfaces.exchange import ExchangeConflictError
from shared_interfaces.records import RecordValidationError

from .records_util import make_record


def _lines(policy: str, step: int, n: int) -> list[str]:
    return [make_record(policy, step, f"p{k % 2}", k).to_json() for k in range(n)]


def _fetch_in_thread(svc: ExchangeService, expect: dict[str, int], step: int = 0) -> tuple[threading.Thread, dict]:
    out: dict = {}

    def run() -> None:
        out["groups"] = svc.fetch_groups(["p0", "p1"], step, 0, "B", False, expect)
        out["at"] = time.monotonic()

    t = threading.Thread(target=run)
    t.start()
    return t, out


def test_fetch_waits_until_the_expected_records_are_in(tmp_path):
    svc = ExchangeService(str(tmp_path / "x.jsonl"), fsync=False)
    t, out = _fetch_in_thread(svc, {"A": 4, "C": 2})
    time.sleep(0.2)
    svc.publish(_lines("A", 0, 4), "A", 0)
    time.sleep(0.2)
    assert t.is_alive() and "groups" not in out  # C's records are not in yet
    published = time.monotonic()
    svc.publish(_lines("C", 0, 2), "C", 0)
    t.join(5)
    assert not t.is_alive() and out["at"] >= published
    assert sum(len(v) for v in out["groups"].values()) == 6
    assert svc.count("A", 0) == 4 and svc.count("C", 0) == 2 and svc.count() == 6
    svc.publish(_lines("A", 0, 4), "A", 0)  # a re-sent publish (Ray's retry) counts nothing twice
    assert svc.count("A", 0) == 4


def test_a_refused_publish_releases_the_waiting_fetch(tmp_path):
    svc = ExchangeService(str(tmp_path / "x.jsonl"), fsync=False)
    t, out = _fetch_in_thread(svc, {"A": 2})
    with pytest.raises(RecordValidationError, match="from A"):
        svc.publish(["{not json"], "A", 0)
    t.join(5)
    assert not t.is_alive() and out["groups"] == {"p0": [], "p1": []}


def test_a_peer_that_never_delivers_is_given_up_after_the_timeout(tmp_path, caplog):
    svc = ExchangeService(str(tmp_path / "x.jsonl"), fsync=False, wait_timeout_s=0.3)
    svc.publish(_lines("A", 0, 2), "A", 0)
    t0 = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="mrl_llm.exchange"):
        got = svc.fetch_groups(["p0", "p1"], 0, 0, "B", False, {"A": 2, "D": 3})
    assert 0.25 <= time.monotonic() - t0 < 5
    assert sum(len(v) for v in got.values()) == 2 and "'D': 3" in caplog.text


def test_counts_are_rebuilt_when_the_service_restarts(tmp_path):
    svc = ExchangeService(str(tmp_path / "x.jsonl"), fsync=False)
    svc.publish(_lines("A", 3, 5), "A", 3)
    again = ExchangeService(str(tmp_path / "x.jsonl"), fsync=False, wait_timeout_s=0.1)
    assert again.count("A", 3) == 5 and again.started_with == 5
    t0 = time.monotonic()
    assert sum(map(len, again.fetch_groups(["p0", "p1"], 3, 0, "B", False, {"A": 5}).values())) == 5
    assert time.monotonic() - t0 < 0.1  # no wait: the replayed records count


def test_a_conflicting_publish_releases_the_waiting_fetch(tmp_path):
    """A record id already held with other contents refuses the publish, and the fetch waiting for that
    producer's step goes on at once (it waited out the whole timeout)."""
    svc = ExchangeService(str(tmp_path / "x.jsonl"), fsync=False, wait_timeout_s=30)
    svc.publish(_lines("A", 0, 1), "A", 0)
    t, out = _fetch_in_thread(svc, {"A": 2})
    changed = make_record("A", 0, "p0", 0, reward=0.5).to_json()
    with pytest.raises(ExchangeConflictError, match="different contents"):
        svc.publish([changed, make_record("A", 0, "p1", 1).to_json()], "A", 0)
    t.join(5)
    assert not t.is_alive() and sum(len(v) for v in out["groups"].values()) == 1
    assert svc.count("A", 0) == 1  # the refused batch added nothing


@pytest.mark.parametrize("policy, step", [("C", 0), ("A", 1)])
def test_a_publish_of_another_policys_or_steps_records_is_refused(tmp_path, policy, step):
    svc = ExchangeService(str(tmp_path / "x.jsonl"), fsync=False, wait_timeout_s=30)
    t, out = _fetch_in_thread(svc, {"A": 1})
    with pytest.raises(RecordValidationError, match="publishes only its own records"):
        svc.publish([make_record(policy, step, "p0", 0).to_json()], "A", 0)
    t.join(5)
    assert not t.is_alive() and svc.count() == 0


def test_a_record_id_that_is_not_canonical_is_refused(tmp_path):
    """One sample under a second id would be counted twice in a peer's pooled statistics."""
    svc = ExchangeService(str(tmp_path / "x.jsonl"), fsync=False)
    svc.publish(_lines("A", 0, 1), "A", 0)
    again = dataclasses.replace(make_record("A", 0, "p0", 0), record_id="A/0/p0/0-again")
    with pytest.raises(RecordValidationError, match="not the canonical 'A/0/p0/0'"):
        svc.publish([again.to_json()], "A", 0)
    assert svc.count() == 1


def test_an_empty_publish_of_a_step_adds_nothing_and_refuses_nothing(tmp_path):
    svc = ExchangeService(str(tmp_path / "x.jsonl"), fsync=False)
    assert svc.publish([], "A", 0) == 0 and svc.publish([], "A") == 0
    assert svc.count() == 0
    svc.publish(_lines("A", 0, 2), "A", 0)  # the step is not marked refused: its records still go in
    assert svc.count("A", 0) == 2
