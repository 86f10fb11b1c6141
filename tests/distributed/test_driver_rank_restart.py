"""A worker group's dead rank on the Ray driver (a real local cluster, 2 CPUs, toy workers whose ranks average
their gradients over gloo, :mod:`tests.distributed.toy_group_worker`): rank 1 of B's 2 ranks dies in step 3's
training, after B's checkpoint of step 1, while rank 0 waits in the gradient all-reduce. The whole group
restarts from the checkpoint and the driver sees it as a single actor's restart: the same ``gap`` and
``rejoin`` (checkpoint step 1, lost steps 2 and 3, step 2's row rolled back), A's rows all there, and every
row and final table bit-identical to the run where B is one actor that dies at the same point. In async mode
(staleness 1) the group restarts once and the run finishes (only that is pinned there: which queued calls
land on the restarted actors is timing-dependent, for one actor as for a group)."""

from __future__ import annotations

import json

import pytest

from mrl_llm.distributed.actors import FaultInjection, PolicyActorSpec
from mrl_llm.distributed.driver import RayDriver
from mrl_llm.distributed.rank_group import RankGroup

pytestmark = [pytest.mark.ray, pytest.mark.slow]

FACTORY = "tests.distributed.toy_group_worker:build"


def spec(name: str, tmp, *, good_on: int, ranks: int = 1, fault: FaultInjection | None = None) -> PolicyActorSpec:
    # the toy samples a step's prompts from one generator per call: rank 0 samples them all (seeding: call), as the
    # single actor does, so the group's records are the actor's
    config = {"good_on": good_on, "n_prompts": 8, "policy": {"sampling": {"seeding": "call"}}}
    return PolicyActorSpec(name=name, factory=FACTORY, config=config, seed=3,
                           regime={"name": "prp_thl+sgt"}, checkpoint_dir=str(tmp / "ckpt" / name),
                           checkpoint_every=2, fault=fault, ranks=ranks)


def problems(step: int) -> list[str]:
    return [f"p{(step * 3 + i) % 8}" for i in range(4)]


def _run(tmp, ranks: int, *, mode: str = "sync", max_staleness: int = 0, steps: int = 6):
    specs = [spec("A", tmp, good_on=0),
             spec("B", tmp, good_on=1, ranks=ranks, fault=FaultInjection(step=3, phase="train", rank=ranks - 1))]
    with RayDriver(specs, problems, tmp, mode=mode, max_staleness=max_staleness) as drv:
        res = drv.run(steps)
        group = drv.actors["B"]
        restarts = group.restarts if isinstance(group, RankGroup) else None
        return res, drv.states(), restarts


def _events(res):
    return [{k: v for k, v in e.items() if k != "error"} for e in res.events if e["event"] in ("gap", "rejoin")]


def test_a_dead_rank_restarts_its_group_from_the_checkpoint_like_a_single_actor(ray_local, tmp_path) -> None:
    res1, state1, _ = _run(tmp_path / "k1", 1)
    res2, state2, restarts = _run(tmp_path / "k2", 2)
    assert restarts == 1
    gaps, rejoins = res2.events_of("gap"), res2.events_of("rejoin")
    assert [(g["step"], g["policy"], g["phase"]) for g in gaps] == [(3, "B", "train")]
    assert "RankGroupDied" in gaps[0]["error"]
    assert [(r["step"], r["policy"], r["checkpoint_step"], r["version"], r["lost_steps"], r["rolled_back_steps"])
            for r in rejoins] == [(4, "B", 1, 2, [2, 3], [2])]
    assert _events(res2) == _events(res1)  # the driver sees the group's restart as the single actor's
    rows = {(m["step"], m["policy"]): m for m in res2.metrics}
    assert sorted(rows) == sorted([(s, "A") for s in range(6)] + [(s, "B") for s in (0, 1, 2, 4, 5)])
    assert rows[(3, "A")]["peers"] == ["A", "B"]  # B generated in step 3 before its rank died in training
    assert rows[(4, "B")]["version"] == 3 and rows[(5, "B")]["version"] == 4  # from the checkpoint's weights
    logged = [json.loads(x) for x in (tmp_path / "k2" / "metrics.jsonl").read_text().splitlines()]
    assert {(r["step"], r["policy"]) for r in logged if r.get("rolled_back")} == {(2, "B")}

    def same(m):
        return {k: m[k] for k in ("step", "policy", "metrics", "peers", "version", "rolled_back") if k in m}

    assert [same(m) for m in res2.metrics] == [same(m) for m in res1.metrics]
    assert state2 == state1  # bit-identical tables: the restarted group's updates are the single actor's


def test_in_async_mode_the_group_restarts_and_the_run_finishes(ray_local, tmp_path) -> None:
    """Bounded staleness 1: the calls already queued on the dead group fail too (further gaps, as the dead
    single actor's do); the group restarts once, rejoins, trains again, and A's rows are all there."""
    res, _, restarts = _run(tmp_path, 2, mode="async", max_staleness=1, steps=7)
    assert restarts == 1
    gaps, rejoins = res.events_of("gap"), res.events_of("rejoin")
    assert (gaps[0]["step"], gaps[0]["policy"], gaps[0]["phase"]) == (3, "B", "train")
    assert rejoins and all(r["checkpoint_step"] == 1 for r in rejoins)
    rows = {(m["step"], m["policy"]): m for m in res.metrics}
    assert {(s, "A") for s in range(7)} <= set(rows)
    assert rows[(6, "B")]["version"] >= 3  # the checkpoint's version 2, then trained again after the restart
