"""A worker group's dead rank on the LLM trainer over Ray (issue 15's test: "a rank killed mid-run: its policy's
group restarts from the last checkpoint, the other policies go on (gap and rejoin logged; rolled-back metric
rows marked), the run finishes"). A real local Ray cluster of 2 CPUs: policy ``a`` is one actor, policy ``b``
two FSDP2 ranks (gloo); rank 1 of ``b`` dies in step 3's training, after ``b``'s checkpoint of step 1, while
rank 0 is left in the update's collectives. Both ranks are restarted from step 1's checkpoint: the run
finishes its 5 steps with the ``gap`` and ``rejoin`` (lost steps 2 and 3; step 2's row rolled back), every
row of ``a``, and the same records, regime decisions and final weights (float tolerance) as the run in which
``b`` is one actor that dies at the same point (Ray restarts it from the same checkpoint)."""

from __future__ import annotations

import json

import pytest

from mrl_llm.contract import learner_tokenizer_dir
from mrl_llm.distributed.actors import FaultInjection
from mrl_llm.distributed.ray_trainer import train_on_ray
from mrl_llm.metrics import read_metrics
from tests.llm.helpers import local_ray
from tests.llm.test_ray import PROBLEMS, config, policy
from tests.llm.test_ray_ranks import DECISIONS, _files

pytestmark = [pytest.mark.ray, pytest.mark.slow]


@pytest.fixture(scope="module")
def ray_llm():
    with local_ray("mrl-tests-rank-restart", test_verifiers=True) as ray:
        yield ray


def _run(tmp_path, ranks: int):
    """5 steps, checkpoints after steps 1 and 3; ``b`` on ``ranks`` ranks, its last rank killed in step 3's training."""
    pols = [policy("a", "llama", "utf8-bytes", 4), {**policy("b", "qwen2", learner_tokenizer_dir(), 16), "ranks": ranks}]
    for p in pols:
        p["sampling"] = {**p["sampling"], "seeding": "sample"}  # records do not depend on b's ranks
    cfg = config(pols, steps=5, eval={"enabled": False}, checkpoint_every=2)
    d = tmp_path / f"b{ranks}"
    summary = train_on_ray(cfg, d, problems=PROBLEMS, faults={"b": FaultInjection(step=3, phase="train", rank=ranks - 1)})
    events = [json.loads(x) for x in (d / "events.jsonl").read_text().splitlines()]
    return summary, events, *_files(d)[1:]


def test_a_killed_rank_restarts_its_group_from_the_last_checkpoint_and_the_run_finishes(ray_llm, tmp_path):
    summary2, events2, rows2, recs2, w2 = _run(tmp_path, 2)
    gaps = [e for e in events2 if e["event"] == "gap"]
    rejoins = [e for e in events2 if e["event"] == "rejoin"]
    assert [(g["step"], g["policy"], g["phase"]) for g in gaps] == [(3, "b", "train")]
    assert [(r["step"], r["policy"], r["checkpoint_step"], r["version"], r["lost_steps"], r["rolled_back_steps"])
            for r in rejoins] == [(4, "b", 1, 2, [2, 3], [2])]
    assert [(e["event"], e["policy"]) for e in summary2["events"]] == [("gap", "b"), ("rejoin", "b")]
    assert sorted(rows2) == sorted([(s, "a") for s in range(5)] + [(s, "b") for s in (0, 1, 2, 4)])
    kept = read_metrics(tmp_path / "b2" / "metrics.jsonl")
    assert sorted((r["step"], r["policy"]) for r in kept) == sorted(k for k in rows2 if k != (2, "b"))
    assert rows2[(2, "b")].get("rolled_back") is True and rows2[(4, "b")]["version"] == 3
    assert rows2[(4, "a")]["peer_rows"] > 0  # b's records are back in a's batch after the rejoin
    assert {r["policy_version"] for r in recs2 if r["policy_id"] == "b" and r["step"] == 4} == {2}

    # the run where b is one actor dying at the same point: the group's restart is that actor's restart
    _, events1, rows1, recs1, w1 = _run(tmp_path, 1)
    strip = lambda es: [{k: v for k, v in e.items() if k != "error"} for e in es if e["event"] in ("gap", "rejoin")]  # noqa: E731
    assert strip(events2) == strip(events1)
    assert sorted(rows2) == sorted(rows1)
    for key, r1 in rows1.items():
        assert {k: rows2[key][k] for k in DECISIONS} == {k: r1[k] for k in DECISIONS}, key
        assert rows2[key].get("rolled_back") == r1.get("rolled_back"), key
        assert rows2[key]["loss"] == pytest.approx(r1["loss"], abs=1e-5), key
    assert [r["record_id"] for r in recs2] == [r["record_id"] for r in recs1]
    assert all(a["token_ids"] == b["token_ids"] and a["reward"] == b["reward"] for a, b in zip(recs1, recs2, strict=True))
    for n in "ab":
        assert max(float((w2[n][k] - w1[n][k]).abs().max()) for k in w1[n]) < 1e-5, n
