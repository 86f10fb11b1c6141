"""The driver's one schedule over in-process actors (no Ray): handles that run calls at once, sync equal to
async with k = 0, bounded staleness really pipelined, and an in-process error raised as itself."""

from __future__ import annotations

import pytest

from mrl_llm.distributed.actors import PolicyActorSpec
from mrl_llm.distributed.backends import LocalBackend
from mrl_llm.distributed.driver import Driver
from mrl_llm.distributed.handles import LocalHandle, LocalRef, resolve
from tests.distributed.toy_worker import ToyWorker

FACTORY = "tests.distributed.toy_worker:build"


def spec(name: str, tmp, *, good_on: int, factory: str = FACTORY) -> PolicyActorSpec:
    return PolicyActorSpec(name=name, factory=factory, config={"good_on": good_on, "n_prompts": 8}, seed=3,
                           regime={"name": "sgt+xgrpo"}, checkpoint_dir=str(tmp / "ckpt" / name), checkpoint_every=0)


def problems(step: int) -> list[str]:
    return [f"p{(step * 3 + i) % 8}" for i in range(4)]


def run(tmp, *, mode: str = "sync", k: int = 0, steps: int = 3, names: str = "AB"):
    specs = [spec(n, tmp, good_on=i % 2) for i, n in enumerate(names)]
    with Driver(specs, problems, tmp, backend=LocalBackend(exchange_fsync=False), mode=mode, max_staleness=k) as drv:
        res = drv.run(steps)
        return res, drv.states(), list(drv.exchange.records())


def _rows(metrics):
    return {(m["step"], m["policy"]): (m["metrics"], m["peers"], m["version"]) for m in metrics}


class Counter:
    def __init__(self) -> None:
        self.calls: list[str] = []
        self.size = 3

    def add(self, x: int, *, times: int = 1) -> int:
        self.calls.append(f"add {x}")
        return x * times

    def fail(self) -> None:
        self.calls.append("fail")
        raise KeyError("the call's own error")


def test_a_local_handle_runs_each_call_at_once_in_order():
    c = Counter()
    h = LocalHandle(c)
    refs = [h.add.remote(2, times=3), h.fail.remote(), h.add.remote(5)]
    assert c.calls == ["add 2", "fail", "add 5"]  # ran when sent, in order, before anything was resolved
    assert resolve(refs[0]) == 6 and resolve(refs[2]) == 5
    with pytest.raises(KeyError, match="the call's own error"):  # re-raised as itself, each time
        resolve(refs[1])
    with pytest.raises(KeyError):
        refs[1].get()
    assert LocalRef().get() is None  # the empty ref: a call that returned nothing


def test_a_local_handle_refuses_what_is_not_a_method():
    h = LocalHandle(Counter())
    with pytest.raises(AttributeError, match="missing"):
        h.missing.remote()
    with pytest.raises(AttributeError, match="size is not a method"):
        h.size.remote()
    with pytest.raises(AttributeError):
        h._private  # noqa: B018 - private names are not forwarded


def test_sync_equals_async_with_k0_in_process(tmp_path):
    sync, sync_state, sync_recs = run(tmp_path / "s")
    async0, async_state, async_recs = run(tmp_path / "a", mode="async", k=0)
    assert _rows(sync.metrics) == _rows(async0.metrics) and sync_state == async_state
    assert [r.to_json() for r in sync_recs] == [r.to_json() for r in async_recs]
    assert sorted(_rows(sync.metrics)) == [(s, n) for s in range(3) for n in "AB"]
    assert (tmp_path / "s" / "exchange.jsonl").read_text() == (tmp_path / "a" / "exchange.jsonl").read_text()


def test_bounded_staleness_in_process_runs_generation_ahead(tmp_path):
    res, _, recs = run(tmp_path, mode="async", k=1, steps=4, names="ABC")
    rows = _rows(res.metrics)
    assert sorted(rows) == [(s, n) for s in range(4) for n in "ABC"]
    assert {r.step - r.policy_version for r in recs} == {0, 1}  # step 0 at version 0, then one update behind
    assert all(m["stale_dropped"] == 0 for m in res.metrics)
    assert all(v == s + 1 for (s, _), (_, _, v) in rows.items())


class Broken(ToyWorker):
    def train_step(self, rows):
        if self.version == 1:
            raise ValueError("a bug in the worker's update")
        return super().train_step(rows)


def build_broken(name, config, seed):
    return Broken(name, config, seed)


def test_an_in_process_error_is_raised_as_itself_not_a_gap(tmp_path):
    specs = [spec("A", tmp_path, good_on=0), spec("B", tmp_path, good_on=1, factory=f"{__name__}:build_broken")]
    with Driver(specs, problems, tmp_path, backend=LocalBackend(exchange_fsync=False)) as drv:
        with pytest.raises(ValueError, match="a bug in the worker's update"):
            drv.run(3)
        assert drv.result.events_of("gap") == [] and drv.next_step == 1
    assert sorted((r["step"], r["policy"]) for r in drv.result.metrics) == [(0, "A"), (0, "B")]
