"""The exchange as a Ray actor: exactly-once delivery from concurrent publishers, across restarts."""

from __future__ import annotations

import time

import pytest

from mrl_llm.distributed.exchange_actor import RemoteExchange, start_exchange
from shared_interfaces.exchange import InMemoryExchange
from shared_interfaces.records import ExperienceRecord, RecordValidationError

from .records_util import make_record

pytestmark = pytest.mark.ray

N_PUBLISHERS, N_RECORDS, BATCH = 4, 1000, 25


class Publisher:
    """Publishes ``N_RECORDS`` records in batches, re-sending every third batch (a duplicate)."""

    def run(self, exchange, policy: str) -> int:
        import ray

        from tests.distributed.records_util import make_record

        sent = 0
        for start in range(0, N_RECORDS, BATCH):
            lines = [make_record(policy, k // 50, f"p{k % 50}", k).to_json() for k in range(start, start + BATCH)]
            ray.get(exchange.publish.remote(lines, policy))
            if (start // BATCH) % 3 == 0:
                ray.get(exchange.publish.remote(lines, policy))
            sent += len(lines)
        return sent


def _expected() -> dict[str, str]:
    return {
        r.record_id: r.to_json()
        for i in range(N_PUBLISHERS)
        for r in (make_record(f"pub{i}", k // 50, f"p{k % 50}", k) for k in range(N_RECORDS))
    }


def test_exactly_once_from_concurrent_publishers_across_exchange_restarts(ray_local, tmp_path) -> None:
    ray = ray_local
    log = tmp_path / "see.jsonl"
    ex = start_exchange(log)
    first_pid = ray.get(ex.info.remote())["pid"]
    pubs = [ray.remote(Publisher).options(num_cpus=0).remote() for _ in range(N_PUBLISHERS)]
    runs = [p.run.remote(ex, f"pub{i}") for i, p in enumerate(pubs)]
    kills = 0
    deadline = time.monotonic() + 120
    while kills < 2 and time.monotonic() < deadline:  # kill the exchange twice mid-run
        count = ray.get(ex.count.remote())
        if count >= (kills + 1) * 1000:
            ray.kill(ex, no_restart=False)
            kills += 1
        time.sleep(0.05)
    assert ray.get(runs, timeout=300) == [N_RECORDS] * N_PUBLISHERS
    assert kills == 2
    info = ray.get(ex.info.remote())
    assert info["pid"] != first_pid and 0 < info["started_with"] < N_PUBLISHERS * N_RECORDS  # replayed

    expected = _expected()
    got = ray.get(ex.records_since.remote(0))
    assert len(got) == len(expected) == N_PUBLISHERS * N_RECORDS
    assert sorted(got) == sorted(expected.values())  # every record, bit-identical, once
    on_disk = [ExperienceRecord.from_json(line) for line in log.read_text().splitlines() if line]
    assert len(on_disk) == len({r.record_id for r in on_disk}) == len(expected)

    # a fresh exchange process on the same log (a cluster restart) replays exactly the same state
    ray.kill(ex, no_restart=True)
    ex2 = start_exchange(log)
    assert ray.get(ex2.count.remote()) == len(expected)
    assert set(ray.get(ex2.record_ids.remote())) == set(expected)
    for p in pubs:
        ray.kill(p)
    ray.kill(ex2)


def test_remote_exchange_keeps_the_see_contract_and_validates(ray_local, tmp_path) -> None:
    ray = ray_local
    remote = RemoteExchange(start_exchange(tmp_path / "see.jsonl"), producer="test")
    local = InMemoryExchange()
    recs = [make_record(p, s, "x", g) for p in ("b", "a") for s in (0, 1, 2) for g in (1, 0)]
    assert remote.publish(recs) == local.publish(recs) == len(recs)
    assert remote.publish(recs[:3]) == 0
    for kw in (dict(), dict(requester="a", include_own=False), dict(max_staleness=1)):
        assert remote.fetch_group("x", 2, **kw) == local.fetch_group("x", 2, **kw)
    for kw in (dict(), dict(requester="b", include_own=False), dict(max_staleness=2)):
        assert remote.fetch_groups(["x", "y"], 1, **kw) == local.fetch_groups(["x", "y"], 1, **kw)
    assert remote.fetch_groups(["x"], 1)["x"] == local.fetch_group("x", 1)
    assert remote.prompt_ids(0) == ["x"] and len(remote) == len(recs)
    assert list(remote.records()) == list(local.records())
    bad = recs[0].to_json().replace('"reward":1.0', '"reward":NaN').replace('"reward":0.0', '"reward":NaN')
    with pytest.raises(RecordValidationError, match="received from evil-producer"):
        ray.get(remote.handle.publish.remote([bad], "evil-producer"))
    with pytest.raises(RecordValidationError, match="expected a JSON string"):
        ray.get(remote.handle.publish.remote([recs[0].to_dict()], "dict-sender"))
    assert len(remote) == len(recs)
    ray.kill(remote.handle)


class NamedClient:
    """A restartable actor that reaches the exchange by name, as the policy actors do."""

    def __init__(self, exchange) -> None:
        self.exchange = exchange

    def publish(self, lines: list[str]) -> int:
        import ray

        return ray.get(self.exchange.handle.publish.remote(lines, self.exchange.producer))

    def pid(self) -> int:
        import os

        return os.getpid()


def test_actors_reach_the_exchange_by_name_across_their_restarts(ray_local, tmp_path, capfd) -> None:
    """No actor handle travels in a policy actor's constructor arguments (Ray does not count one for the actor's
    restarts, ray-project/ray#53727, and logs an error per actor): the client holds the exchange actor's name,
    pickles without a handle, and a restarted actor looks the name up again."""
    import cloudpickle

    ray = ray_local
    handle = start_exchange(tmp_path / "see.jsonl", name="see-by-name", namespace="mrl-tests")
    named = RemoteExchange.named("see-by-name", "mrl-tests", producer="a")
    assert named.publish([make_record("a", 0, "x", 0)]) == 1  # resolved here, on first use
    assert cloudpickle.loads(cloudpickle.dumps(named))._handle is None  # ...and not shipped
    client = ray.remote(NamedClient).options(num_cpus=0, max_restarts=-1).remote(named)
    first = ray.get(client.pid.remote())
    assert ray.get(client.publish.remote([make_record("a", 0, "x", 1).to_json()])) == 1
    ray.kill(client, no_restart=False)
    deadline, pid = time.monotonic() + 60, first
    while pid == first and time.monotonic() < deadline:  # the kill lands asynchronously
        try:
            pid = ray.get(client.pid.remote(), timeout=10)
        except ray.exceptions.RayActorError:
            pass
        time.sleep(0.2)
    assert pid != first, "the actor was not restarted within 60 s"
    assert ray.get(client.publish.remote([make_record("a", 0, "x", 2).to_json()])) == 1  # restarted, by name
    assert len(named) == 3
    assert "constructor arguments in the object store" not in capfd.readouterr().err
    ray.kill(handle)
    with pytest.raises(RuntimeError, match="the experience exchange actor 'gone' .* is gone.*--resume"):
        len(RemoteExchange.named("gone", "mrl-tests", producer="a"))
    for no_exchange in (lambda: RemoteExchange.named("", None, producer="a"), lambda: RemoteExchange(None)):
        with pytest.raises(ValueError, match="needs the exchange actor's handle .* or its name"):
            no_exchange()
