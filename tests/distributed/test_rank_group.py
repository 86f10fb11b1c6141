"""A worker group's failure handling (:mod:`mrl_llm.distributed.rank_group`) on a real local Ray cluster, with
small rank actors instead of policy workers: a dead rank fails the group's call at once even while another
rank hangs (as a survivor hangs in a collective), or after another rank's error (as a survivor fails out of
one); a plain error is raised as it is; the next call restarts every rank (the hung survivor is killed) and
answers from the new ranks; a rank that fails to start is an error naming it, not a restart. The combining runs
on one long-lived actor (:func:`combiner`), not a task per call."""

from __future__ import annotations

import os
import time

import pytest

from mrl_llm.distributed.rank_group import RankGroup, RankGroupDied, combined, combiner, is_rank_failure

pytestmark = pytest.mark.ray


class Rank:
    """A rank: ``train(plan)`` does what ``plan[rank]`` says (default: answer)."""

    def __init__(self, rank: int, boot: int, fail_init: bool = False) -> None:
        if fail_init:
            raise ValueError(f"rank {rank} cannot load its checkpoint")
        self.rank, self.boot = rank, boot

    def train(self, plan: dict[int, str]) -> dict[str, int]:
        what = plan.get(self.rank, "answer")
        if what == "die":
            os._exit(17)
        if what == "hang":
            time.sleep(600)
        if what == "raise":
            raise ValueError(f"rank {self.rank} failed")
        return {"rank": self.rank, "boot": self.boot}

    def status(self) -> dict[str, int]:
        return {"rank": self.rank, "boot": self.boot, "pid": os.getpid()}


def _starter(ray, k: int = 2, *, fail_init_on: int | None = None):
    boots = []

    def start():
        boots.append(len(boots))
        return [ray.remote(Rank).options(num_cpus=0, max_restarts=0).remote(r, boots[-1], r == fail_init_on)
                for r in range(k)]

    return start, boots


def _gathered(ray, actors, plan, grace_s=20.0):
    return combiner().gather.remote("b", "train", [a.train.remote(plan) for a in actors], grace_s)


def test_a_dead_rank_fails_the_call_at_once_and_errors_are_told_apart(ray_local):
    ray = ray_local
    start, _ = _starter(ray)
    actors = start()
    assert ray.get(_gathered(ray, actors, {})) == {"rank": 0, "boot": 0}  # rank 0's answer
    t0 = time.monotonic()
    with pytest.raises(RankGroupDied, match=r"policy 'b': rank 1 of 2 died during 'train' \(ActorDiedError\); "
                                            "its worker group restarts from its last checkpoint") as err:
        ray.get(_gathered(ray, actors, {0: "hang", 1: "die"}, grace_s=300.0))
    assert time.monotonic() - t0 < 60  # the hung rank 0 was not waited for
    assert is_rank_failure(err.value)
    for a in actors:
        ray.kill(a)

    actors = start()  # an error on rank 0, rank 1 dead: the error waits for the others and becomes a rank failure
    with pytest.raises(RankGroupDied, match="rank 1 of 2 died"):
        ray.get(_gathered(ray, actors, {0: "raise", 1: "die"}))
    for a in actors:
        ray.kill(a)

    actors = start()  # an error with every other rank alive is raised as it is
    with pytest.raises(ValueError, match="rank 1 failed") as err:
        ray.get(_gathered(ray, actors, {1: "raise"}))
    assert not is_rank_failure(err.value)
    with pytest.raises(ValueError, match="rank 0 failed"):  # a rank that hangs past the grace is not waited for
        ray.get(_gathered(ray, actors, {0: "raise", 1: "hang"}, grace_s=1.0))
    for a in actors:
        ray.kill(a)


def test_the_group_restarts_every_rank_after_a_death_and_not_before(ray_local):
    ray = ray_local
    start, boots = _starter(ray)
    g = RankGroup(start(), policy="b", start=start, grace_s=20.0)
    assert ray.get(g.train.remote({})) == {"rank": 0, "boot": 0}
    assert not g.failed() and g.restarts == 0
    old = list(g.actors)
    with pytest.raises(RankGroupDied):
        ray.get(g.train.remote({0: "hang", 1: "die"}))
    assert g.failed()
    st = ray.get(g.status.remote())  # the next call restarts the whole group first
    assert (st["boot"], g.restarts, len(boots)) == (1, 1, 2)
    assert all(a not in old for a in g.actors)
    with pytest.raises(ray.exceptions.RayActorError):  # the hung survivor was killed, not waited for
        ray.get(old[0].status.remote(), timeout=60)
    assert ray.get(g.train.remote({})) == {"rank": 0, "boot": 1}
    with pytest.raises(ValueError, match="rank 0 failed"):  # a plain error does not restart the group
        ray.get(g.train.remote({0: "raise"}))
    assert not g.failed() and ray.get(g.status.remote())["boot"] == 1 and g.restarts == 1
    g.kill()


def test_a_rank_that_fails_to_start_is_named_and_a_broken_group_closes_by_kill(ray_local):
    ray = ray_local
    start, _ = _starter(ray, fail_init_on=1)
    g = RankGroup(start(), policy="b", start=start)
    with pytest.raises(RuntimeError, match="policy 'b': rank 1 of its worker group failed to start: .*"
                                           "rank 1 cannot load its checkpoint") as err:
        ray.get(g.status.remote())
    assert not is_rank_failure(err.value) and not g.failed()
    g.kill()

    start, _ = _starter(ray)
    g = RankGroup(start(), policy="b", start=start)
    with pytest.raises(RankGroupDied):
        ray.get(g.train.remote({1: "die"}))
    assert ray.get(g.close.remote()) is None and g.restarts == 0  # closing a broken group does not restart it
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(g.actors[0].status.remote(), timeout=60)
    empty = RankGroup(start(), policy="b")  # no start function: a dead rank cannot be replaced
    with pytest.raises(RankGroupDied):
        ray.get(empty.train.remote({0: "die"}))
    with pytest.raises(RankGroupDied, match="cannot be restarted"):
        empty.status.remote()
    empty.kill()


def _pid() -> int:
    return os.getpid()


def _tagged(*values, tag=None):
    return {"values": list(values), "tag": tag}


def test_combined_answers_come_from_one_long_lived_actor(ray_local):
    ray = ray_local
    start, _ = _starter(ray)
    actors = start()
    assert combiner() is combiner()  # one per cluster, started once
    pids = {ray.get(combined(_pid)) for _ in range(3)}  # no answers at all: fn() on the combiner
    assert len(pids) == 1 and pids != {os.getpid()}
    st = [a.status.remote() for a in actors]
    got = ray.get(combined(_tagged, *st, tag=st[1]))
    assert [v["rank"] for v in got["values"]] == [0, 1] and got["tag"]["rank"] == 1
    g = RankGroup(actors, policy="b")
    for _ in range(3):  # a rank group's calls are gathered there too: no process per call
        assert ray.get(g.train.remote({})) == {"rank": 0, "boot": 0}
    assert {ray.get(combined(_pid))} == pids
    with pytest.raises(ray.exceptions.RayActorError) as err:  # a dead actor's answer fails the combination
        ray.get(combined(_tagged, actors[0].status.remote(), tag=actors[1].train.remote({1: "die"})))
    assert is_rank_failure(err.value)
    g.kill()
