"""The Ray runtime end to end on a real local cluster (2 CPUs) with small real torch workers; the reference
is the same driver over in-process actors (:class:`~mrl_llm.distributed.backends.LocalBackend`)."""

from __future__ import annotations

import json

import pytest

from mrl_llm.distributed.actors import FaultInjection, PolicyActorSpec
from mrl_llm.distributed.backends import LocalBackend
from mrl_llm.distributed.driver import Driver, Membership, RayDriver
from shared_interfaces.records import ExperienceRecord

pytestmark = [pytest.mark.ray, pytest.mark.slow]  # ~80 s: four runs of real torch actors

FACTORY = "tests.distributed.toy_worker:build"


def spec(name: str, tmp, *, good_on: int, regime: str = "prp_thl+sgt", every: int = 1,
         fault: FaultInjection | None = None) -> PolicyActorSpec:
    return PolicyActorSpec(name=name, factory=FACTORY, config={"good_on": good_on, "n_prompts": 8},
                           seed=3, regime={"name": regime}, checkpoint_dir=str(tmp / "ckpt" / name),
                           checkpoint_every=every, fault=fault)


def problems(step: int) -> list[str]:
    return [f"p{(step * 3 + i) % 8}" for i in range(4)]


def _rows(metrics):
    return {(m["step"], m["policy"]): (m["metrics"], m["peers"], m["version"]) for m in metrics}


def run_local(specs, problems_for_step, steps, out, *, mode="sync", k=0):
    """The reference: the same driver with every actor in this process."""
    with Driver(specs, problems_for_step, out, backend=LocalBackend(), mode=mode, max_staleness=k) as drv:
        res = drv.run(steps)
        return res, drv.states(), list(drv.exchange.records())


def test_two_policies_sync_equals_the_single_process_loop_and_async_k0_too(ray_local, tmp_path) -> None:
    steps = 3
    local, local_state, _ = run_local([spec("A", tmp_path / "l", good_on=0), spec("B", tmp_path / "l", good_on=1)],
                                      problems, steps, tmp_path / "l")
    runs = {}
    for mode in ("sync", "async"):
        specs = [spec("A", tmp_path / mode, good_on=0), spec("B", tmp_path / mode, good_on=1)]
        with RayDriver(specs, problems, tmp_path / mode, mode=mode, max_staleness=0) as drv:
            res = drv.run(steps)
            runs[mode] = (res, drv.states())
    for mode, (res, state) in runs.items():
        assert _rows(res.metrics) == _rows(local.metrics), mode
        assert state == local_state, mode  # bit-identical parameters
        assert res.events_of("gap") == []
    # the regime really shared experience: PRP peer rows make each learner's batch twice its own
    assert all(m["metrics"]["rows"] >= 2 * 4 * 4 for m in local.metrics)
    lines = (tmp_path / "sync" / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 2 * steps


def test_three_policies_async_bounded_staleness(ray_local, tmp_path) -> None:
    specs = [spec(n, tmp_path, good_on=i % 2, regime="sgt+xgrpo") for i, n in enumerate("ABC")]
    with RayDriver(specs, problems, tmp_path, mode="async", max_staleness=1) as drv:
        res = drv.run(4)
        recs = list(drv.exchange.records())
        state = drv.states()
    rows = _rows(res.metrics)
    assert sorted(rows) == [(s, n) for s in range(4) for n in "ABC"]
    assert all(peers == ["A", "B", "C"] for _, peers, _ in rows.values())
    assert all(m["stale_dropped"] == 0 for m in res.metrics)
    lags = {r.step - r.policy_version for r in recs}
    assert lags <= {0, 1} and 1 in lags  # generation really ran one step ahead of training
    assert all(v == s + 1 for (s, _), (_, _, v) in rows.items())
    # the in-process backend runs the same schedule: equal rows, records and weights
    local, local_state, local_recs = run_local([spec(n, tmp_path / "l", good_on=i % 2, regime="sgt+xgrpo")
                                                for i, n in enumerate("ABC")], problems, 4, tmp_path / "l",
                                               mode="async", k=1)
    assert _rows(local.metrics) == rows
    assert sorted(r.to_json() for r in local_recs) == sorted(r.to_json() for r in recs)
    assert local_state == state


def test_crashed_policy_restarts_from_its_checkpoint_and_the_run_finishes(ray_local, tmp_path) -> None:
    specs = [spec("A", tmp_path, good_on=0, every=2), spec("C", tmp_path, good_on=0, every=2),
             spec("B", tmp_path, good_on=1, every=2, fault=FaultInjection(step=3, phase="generate"))]
    with RayDriver(specs, problems, tmp_path, mode="sync") as drv:
        res = drv.run(6)
        recs = list(drv.exchange.records())
    gaps, rejoins = res.events_of("gap"), res.events_of("rejoin")
    assert [(g["step"], g["policy"], g["phase"]) for g in gaps] == [(3, "B", "generate")]
    assert len(rejoins) == 1
    rj = rejoins[0]
    # checkpoints every 2 steps: after steps 1 and 3 -> B's last one is step 1 (version 2)
    assert (rj["step"], rj["policy"], rj["checkpoint_step"], rj["version"]) == (4, "B", 1, 2)
    assert rj["lost_steps"] == [2, 3]
    rows = _rows(res.metrics)
    assert (3, "B") not in rows and {(s, "A") for s in range(6)} <= set(rows)
    assert rows[(3, "A")][1] == ["A", "C"]  # the others continued without B's records
    assert rows[(4, "A")][1] == ["A", "B", "C"]  # B rejoined at the current step
    assert rows[(4, "B")][2] == 3 and rows[(5, "B")][2] == 4  # from its checkpoint's weights
    assert not [r for r in recs if r.policy_id == "B" and r.step == 3]
    assert {r.policy_version for r in recs if r.policy_id == "B" and r.step == 4} == {2}
    events = [json.loads(x)["event"] for x in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert events.count("gap") == 1 and events.count("rejoin") == 1
    # B's update of step 2 (after its checkpoint of step 1, before it died in step 3) is gone: row marked
    assert rj["rolled_back_steps"] == [2]
    logged = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert {(r["step"], r["policy"]) for r in logged if r.get("rolled_back")} == {(2, "B")}
    assert [r for r in res.metrics if r.get("rolled_back")] == [r for r in res.metrics if (r["step"], r["policy"]) == (2, "B")]


def test_policies_added_and_removed_between_steps(ray_local, tmp_path) -> None:
    specs = [spec("A", tmp_path, good_on=0, regime="grpo"), spec("B", tmp_path, good_on=1, regime="grpo"),
             spec("C", tmp_path, good_on=0, regime="grpo")]
    with RayDriver(specs, problems, tmp_path, membership={"C": Membership(leave_step=2)}) as drv:
        drv.run(2)
        drv.remove_policy("B")
        drv.add_policy(spec("D", tmp_path, good_on=1, regime="grpo"))
        res = drv.run(4)
        recs = list(drv.exchange.records())
    rows = _rows(res.metrics)
    assert sorted(rows) == sorted([(0, "A"), (0, "B"), (0, "C"), (1, "A"), (1, "B"), (1, "C"),
                                   (2, "A"), (2, "D"), (3, "A"), (3, "D")])
    assert rows[(2, "D")][2] == 1  # joined fresh at step 2
    assert [(e["event"], e["policy"], e["step"]) for e in res.events if e["event"] != "join" or e["step"]] == [
        ("leave", "B", 2), ("leave", "C", 2), ("join", "D", 2)]
    assert {r.policy_id for r in recs if r.step >= 2} == {"A", "D"}
    assert all(isinstance(r, ExperienceRecord) for r in recs)
