"""Collectives that survive a long rollout (issue 38, item 3): the timeouts are settings
(``runtime.collective_timeout_s``, ``runtime.weight_bus_timeout_s``), a worker group's ranks wait for rank 0's
rollout outside any collective (:meth:`mrl_llm.parallel.group.WorkerGroup.wait_for_ranks`), a policy that keeps
failing stops after ``runtime.max_restarts`` restarts with one line, and the rendezvous address is one another
node can reach (:func:`mrl_llm.parallel.group.node_address`)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import torch

from mrl_llm.distributed.actors import PolicyActor, PolicyActorSpec
from mrl_llm.distributed.backends import LocalBackend
from mrl_llm.distributed.driver import Driver, RestartLimit
from mrl_llm.distributed.handles import LocalRef
from mrl_llm.distributed.rank_group import RankGroupDied
from mrl_llm.parallel.group import GroupSpec, WorkerGroup, node_address, rendezvous
from shared_interfaces.config_io import ConfigError
from shared_interfaces.exchange import InMemoryExchange
from tests.llm.parallel_ranks import rank_done, rank_process
from tests.llm.test_runtime_config import cfg

SAMPLE_S = 4.0


# -- settings ---------------------------------------------------------------------------------------
def test_runtime_timeouts_and_restarts_are_settings_with_long_defaults():
    rt = cfg().runtime
    assert (rt.collective_timeout_s, rt.weight_bus_timeout_s, rt.max_restarts) == (1800.0, 1800.0, 3)
    assert GroupSpec(rank=0, world_size=1).timeout_s == 1800.0
    got = cfg({"backend": "ray", "collective_timeout_s": 2, "weight_bus_timeout_s": 60, "max_restarts": 0}).runtime
    assert (got.collective_timeout_s, got.weight_bus_timeout_s, got.max_restarts) == (2, 60, 0)
    for key, bad in (("collective_timeout_s", 0), ("weight_bus_timeout_s", -1), ("collective_timeout_s", "long"),
                     ("collective_timeout_s", True)):
        with pytest.raises(ConfigError, match=rf"runtime\.{key}"):
            cfg({"backend": "ray", key: bad})
    for bad in (-1, 1.5, True):
        with pytest.raises(ConfigError, match=r"runtime\.max_restarts"):
            cfg({"backend": "ray", "max_restarts": bad})
    with pytest.raises(ValueError, match="timeout_s must be a number of seconds > 0"):
        GroupSpec(rank=0, world_size=1, timeout_s=0)


# -- the rendezvous address -------------------------------------------------------------------------
def test_node_address_skips_loopback_and_falls_back_to_localhost():
    none, debian, lan, ray_ip = (lambda: None), (lambda: "127.0.1.1"), (lambda: "10.1.2.3"), (lambda: "192.168.0.7")
    assert node_address((ray_ip, lan, debian)) == "192.168.0.7"  # Ray's node address first
    assert node_address((none, debian, lan)) == "10.1.2.3"  # 127.0.1.1 (Debian's host name) is loopback
    assert node_address((none, lambda: "0.0.0.0", debian)) == "127.0.0.1"  # one node: every rank is local
    assert node_address(()) == "127.0.0.1"
    addr, port = rendezvous()  # this machine: an address it can listen on
    assert addr == node_address() and 0 < port < 65536


# -- a rank samples longer than the collective timeout ------------------------------------------------
class SlowRankWorker:
    """A worker whose rank 0 samples for :data:`SAMPLE_S` seconds (``sampling.seeding: call``: rank 0 samples the
    whole step) while the other ranks have nothing to sample."""

    def __init__(self, name: str, config: dict[str, Any], seed: int) -> None:
        self.group = WorkerGroup.join(GroupSpec(**config["group"]))
        self.version = 0

    def prepare(self, problems: list[Any]) -> None:
        pass

    def generate(self, problems: list[Any], step: int) -> list[Any]:
        if self.group.rank == 0:
            time.sleep(SAMPLE_S)
        return []


def build_slow(name: str, config: dict[str, Any], seed: int) -> SlowRankWorker:
    return SlowRankWorker(name, config, seed)


def slow_main(rank: int, spec: GroupSpec, out: str) -> None:
    rank_process()
    from shared_interfaces.config_io import to_mapping

    aspec = PolicyActorSpec(name="a", factory="tests.llm.test_collective_timeouts:build_slow",
                            config={"group": to_mapping(spec.for_rank(rank)), "policy": {"sampling": {}}}, seed=0,
                            regime={"name": "grpo"}, checkpoint_dir=str(Path(out) / "ck"), ranks=spec.world_size)
    actor = PolicyActor(aspec, InMemoryExchange())
    t0 = time.perf_counter()
    for step in range(2):
        actor.generate(["p0", "p1"], step)
    took = time.perf_counter() - t0
    actor.worker.group.close()
    torch.save({"took": took}, Path(out) / f"{rank}.pt")
    rank_done()


def test_a_rank_waits_out_rank_0s_rollout_longer_than_the_collective_timeout(tmp_path):
    """``collective_timeout_s: 2`` and rank 0 samples for 4 s, twice: the other rank waits at the store barrier,
    not in the all-gather (which would fail after 2 s), and both finish."""
    import torch.multiprocessing as mp

    addr, port = rendezvous("127.0.0.1")
    spec = GroupSpec(rank=0, world_size=2, addr=addr, port=port, backend="gloo", timeout_s=2)
    mp.spawn(slow_main, args=(spec, str(tmp_path)), nprocs=2, join=True)
    took = [torch.load(tmp_path / f"{r}.pt")["took"] for r in range(2)]
    assert all(t >= 2 * SAMPLE_S for t in took), took


def test_wait_for_ranks_in_a_group_of_one_returns_at_once():
    WorkerGroup(GroupSpec(rank=0, world_size=1)).wait_for_ranks("generate/0", wait_s=0.001)


# -- a policy that keeps failing ---------------------------------------------------------------------
class AlwaysDies:
    """A worker group's handle whose every ``generate`` loses a rank; ``status`` restarts it (as
    :meth:`~mrl_llm.distributed.rank_group.RankGroup.ensure_up` does) and counts the restarts."""

    def __init__(self, name: str) -> None:
        self.name, self.restarts, self.broken = name, 0, False

    def __getattr__(self, method: str) -> Any:
        if method.startswith("_"):
            raise AttributeError(method)
        return _Method(self, method)


class _Method:
    def __init__(self, g: AlwaysDies, method: str) -> None:
        self.g, self.method = g, method

    def remote(self, *args: Any, **kwargs: Any) -> LocalRef:
        g = self.g
        if self.method == "status":
            if g.broken:
                g.restarts, g.broken = g.restarts + 1, False
            return LocalRef({"policy": g.name, "version": 0, "restored_step": None, "counters": {}})
        if self.method == "generate":
            g.broken = True
            return LocalRef(error=RankGroupDied(f"policy {g.name!r}: rank 1 of 2 died during 'generate' "
                                                "(ActorDiedError); its worker group restarts from its last checkpoint"))
        return LocalRef(None)


class DyingBackend(LocalBackend):
    def __init__(self) -> None:
        super().__init__(exchange_fsync=False)
        self.handles: list[AlwaysDies] = []

    def start(self, spec: PolicyActorSpec) -> AlwaysDies:
        self.handles.append(AlwaysDies(spec.name))
        return self.handles[-1]

    def stop(self, handle: Any, name: str | None = None) -> None:
        pass


@pytest.mark.parametrize("max_restarts", [0, 2])
def test_a_group_that_always_fails_stops_after_max_restarts_with_one_line(tmp_path, max_restarts):
    spec = PolicyActorSpec(name="b", factory="x:y", config={}, seed=0, regime={"name": "grpo"},
                           checkpoint_dir=str(tmp_path / "ck"))
    backend = DyingBackend()
    drv = Driver([spec], lambda s: [], tmp_path, backend=backend, max_restarts=max_restarts)
    with pytest.raises(RestartLimit) as err:
        drv.run(10)
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith(f"policy 'b' failed at step {max_restarts} (generate: RankGroupDied: policy 'b': rank 1 "
                          f"of 2 died during 'generate'")
    assert f"after {max_restarts} restart(s) without finishing a step (runtime.max_restarts: {max_restarts})" in msg
    assert backend.handles[0].restarts == max_restarts
    assert [e["event"] for e in drv.result.events] == ["join"] + ["gap", "rejoin"] * max_restarts + ["gap"]
