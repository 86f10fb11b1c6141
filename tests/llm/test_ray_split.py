"""``runtime.placement: split`` on a real local Ray cluster of 2 CPUs (:mod:`mrl_llm.distributed.split_group`):
two tiny policies, each a trainer actor and a rollout actor on their own bundles (4 actors), equal the
colocated run of the same seed — records, regime decisions, loss and final weights — in sync mode and in
bounded-staleness async mode (the trainers' weights reach the rollout actor before its next generate, as they
would in one colocated actor); the plan and the log give each actor's role; 2 trainer ranks (one FSDP2 group)
with 2 rollout actors equal the colocated 2-rank run; both count the same samples, tokens and FLOPs (rows,
cumulative counts, ``summary.json``); the trainers build no engine (vLLM under split:
``tests/llm/test_ray_ranks_vllm.py``)."""

from __future__ import annotations

import json
import logging

import pytest

from mrl_llm.contract import learner_tokenizer_dir
from mrl_llm.distributed.actors import PolicyActorSpec
from mrl_llm.trainer import train
from tests.llm.helpers import local_ray
from tests.llm.test_ray import PROBLEMS, config, policy
from tests.llm.test_ray_ranks import _files, assert_same_compute

DECISIONS = ("reward_mean", "success_rate", "own_rows", "peer_rows", "sgt_rows", "sgt_activations", "version",
             "train_tokens", "stale_dropped")


@pytest.fixture(scope="module")
def ray_llm():
    with local_ray("mrl-tests-split", test_verifiers=True) as ray:
        yield ray


def _config(placement: str, mode: str, transfer: str = "auto"):
    pols = [policy("a", "llama", "utf8-bytes", 4), policy("b", "qwen2", learner_tokenizer_dir(), 16)]
    runtime = {"backend": "ray", "placement": placement, "mode": mode, "max_staleness": 1 if mode == "async" else 0,
               "weight_transfer": transfer}
    return config(pols, steps=3, eval={"enabled": False}, runtime=runtime)


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.parametrize("mode, transfer", [("sync", "auto"), ("async", "auto"), ("sync", "collective")])
def test_split_placement_equals_colocated(ray_llm, tmp_path, caplog, mode, transfer):
    """``auto`` on CPUs hands the weights over through Ray's object store; ``collective`` broadcasts them over the
    policy's gloo weight bus (the row counts the broadcasts: a header, the trainers' drift-probe log-probs and one bucket)."""
    caplog.set_level(logging.INFO, logger="mrl_llm.ray_trainer")
    train(_config("cpu", mode), tmp_path / "colocated", problems=PROBLEMS)
    train(_config("split", mode, transfer), tmp_path / "split", problems=PROBLEMS)
    _, rows1, recs1, w1 = _files(tmp_path / "colocated")
    _, rows2, recs2, w2 = _files(tmp_path / "split")
    assert len(recs2) == len(recs1) > 0
    for a, b in zip(recs1, recs2, strict=True):  # the versions too: the rollout actor took the trainer's
        assert {k: v for k, v in b.items() if k != "token_logprobs"} == {k: v for k, v in a.items() if k != "token_logprobs"}
        assert b["token_logprobs"] == pytest.approx(a["token_logprobs"], abs=1e-5)
    assert sorted(rows2) == sorted(rows1) and len(rows1) == 6
    assert_same_compute(tmp_path / "colocated", rows1, tmp_path / "split", rows2, every_row=mode == "sync")
    for key, r1 in rows1.items():
        assert {k: rows2[key].get(k) for k in DECISIONS} == {k: r1.get(k) for k in DECISIONS}, key
        assert rows2[key]["loss"] == pytest.approx(r1["loss"], abs=1e-5)
    assert any(r["peer_rows"] > 0 for r in rows2.values())  # experience really crossed
    assert {r["policy_version"] for r in recs2 if r["step"] == 2} != {0}  # step 2 sampled from updated weights
    # collective: the header, the trainers' drift-probe log-probs and one bucket
    assert {r.get("weight_broadcasts") for r in rows2.values()} == ({3.0} if transfer == "collective" else {None})
    # the rollout actors' reload check against the trainers passed at every load (issue 38 item 5)
    assert all(r["drift_reload_exceeded"] == 0.0 and r["drift_reload_err"] <= 1e-6 for r in rows2.values())
    for n in "ab":
        assert max(float((w2[n][k] - w1[n][k]).abs().max()) for k in w1[n]) < 1e-5, n
    plan = (tmp_path / "split" / "plan.txt").read_text()
    for n in "ab":
        assert f"{n} rank 0/2: train (CPU) on node0/ram" in plan and f"{n} rank 1/2: rollout (CPU) on node0/ram" in plan
        assert any(f"{n} rank 1/2: rollout (CPU)" in m for m in caplog.messages)


def test_split_trainers_build_no_engine_and_loads_are_folded_into_the_train_answer():
    """A split policy's trainer (``rollout_engine: false``) starts no engine, even for ``engine: vllm``: it
    refuses to sample, and its weight sync only gathers; the train answer gets the rollout actors' loads."""
    from mrl_llm.distributed.split_group import trained
    from mrl_llm.rollout import SamplingConfig
    from tests.llm.parallel_ranks import policy_worker

    w = policy_worker(None, engine="vllm", rollout_engine=False)
    try:
        assert w.engine is None and w.drift_metrics() == {}
        with pytest.raises(RuntimeError, match="this rank has no rollout engine"):
            w.sampler.sample([[1, 2]], 1, SamplingConfig(max_new_tokens=2))
        w.sync_engine()  # nothing to sync into
    finally:
        w.close()
    res = {"version": 1, "metrics": {"loss": 0.5, "sync_s": 0.25}}
    assert trained(res) == res  # no rollout actors: the trainers' answer as it is
    loads = [{"version": 1, "metrics": {"sync_s": 1.0, "drift_mean_abs": 1e-4, "drift_exceeded": 0.0}},
             {"version": 1, "metrics": {"sync_s": 2.0, "drift_mean_abs": 3e-4, "drift_exceeded": 0.0}},
             {"version": 1}]  # a load without metrics (a worker without a drift check) counts as 0 s
    m = trained(res, *loads)["metrics"]
    assert m == {"loss": 0.5, "sync_s": 2.25, "drift_mean_abs": 3e-4, "drift_exceeded": 0.0}
    assert res["metrics"]["sync_s"] == 0.25  # the trainers' answer itself is left alone
    pushed = trained(res, *loads[:1], pushed={"broadcasts": 3, "push_s": 0.1})["metrics"]
    assert pushed["weight_broadcasts"] == 3.0 and pushed["sync_s"] == 1.25


def test_actor_spec_roles_are_validated():
    base = dict(name="p", factory="m:f", config={}, seed=0, regime={}, checkpoint_dir="/tmp/x")
    with pytest.raises(ValueError, match=r"policy 'p': actor role must be one of .* got 'both'"):
        PolicyActorSpec(**base, role="both")
    with pytest.raises(ValueError, match=r"rollout_rank 2 is not in \[0, 2\)"):
        PolicyActorSpec(**base, role="rollout", rollouts=2, rollout_rank=2)


@pytest.mark.ray
@pytest.mark.slow
def test_a_dead_rollout_actor_restarts_its_split_policy_from_the_last_checkpoint(ray_llm, tmp_path):
    """b's rollout actor dies in step 3's generate, after b's checkpoint of step 1: b's trainer and rollout actor
    restart from it (gap at 3, rejoin at 4: lost steps 2 and 3, step 2's row rolled back), a goes on, the run
    finishes — with the same events, rows, records and weights as the colocated run whose b dies at that point."""
    from mrl_llm.distributed.actors import FaultInjection
    from mrl_llm.distributed.ray_trainer import train_on_ray

    def run(placement: str):
        pols = [policy("a", "llama", "utf8-bytes", 4), policy("b", "qwen2", learner_tokenizer_dir(), 16)]
        cfg = config(pols, steps=5, eval={"enabled": False}, checkpoint_every=2,
                     runtime={"backend": "ray", "placement": placement})
        d = tmp_path / placement
        train_on_ray(cfg, d, problems=PROBLEMS, faults={"b": FaultInjection(step=3, phase="generate")})
        events = [json.loads(x) for x in (d / "events.jsonl").read_text().splitlines()]
        return [{k: v for k, v in e.items() if k != "error"} for e in events if e["event"] in ("gap", "rejoin")], *_files(d)[1:]

    ev2, rows2, recs2, w2 = run("split")
    assert [(e["event"], e["step"], e["policy"]) for e in ev2] == [("gap", 3, "b"), ("rejoin", 4, "b")]
    assert ev2[1]["checkpoint_step"] == 1 and ev2[1]["lost_steps"] == [2, 3] and ev2[1]["rolled_back_steps"] == [2]
    assert rows2[(2, "b")].get("rolled_back") is True and all((s, "a") in rows2 for s in range(5))
    assert {r["policy_version"] for r in recs2 if r["policy_id"] == "b" and r["step"] == 4} == {2}
    ev1, rows1, recs1, w1 = run("cpu")
    assert ev2 == ev1 and sorted(rows2) == sorted(rows1)
    for key, r1 in rows1.items():
        assert {k: rows2[key].get(k) for k in DECISIONS} == {k: r1.get(k) for k in DECISIONS}, key
    assert [r["record_id"] for r in recs2] == [r["record_id"] for r in recs1]
    for n in "ab":
        assert max(float((w2[n][k] - w1[n][k]).abs().max()) for k in w1[n]) < 1e-5, n


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.parametrize("transfer, unit", [("object_store", "layer"), ("collective", "layer"), ("object_store", "none")])
def test_split_with_two_trainer_ranks_equals_colocated(ray_llm, tmp_path, caplog, transfer, unit):
    """``a`` with ``ranks: 2`` under ``placement: split``: 2 FSDP2 trainer ranks (one gloo group) and 2 rollout
    actors that share the step's prompts (per-sample seeds) and take the gathered weights after each update
    (through the object store, or broadcast by trainer rank 0 over a weight bus of 3 members);
    ``b`` one trainer and one rollout actor (6 actors). It equals the colocated run with the same ranks; so do 2 trainer
    ranks that are whole replicas (``fsdp_unit: none``: trainer rank 0's own model is what the rollout actors get)."""
    caplog.set_level(logging.INFO, logger="mrl_llm.ray_trainer")

    def cfg(placement: str):
        pols = [{**policy("a", "llama", "utf8-bytes", 4), "ranks": 2}, policy("b", "qwen2", learner_tokenizer_dir(), 16)]
        pols[0]["train"] = {**pols[0].get("train", {}), "fsdp_unit": unit}
        for p in pols:
            p["sampling"] = {**p["sampling"], "seeding": "sample"}
        return config(pols, steps=2, eval={"enabled": False},
                      runtime={"backend": "ray", "placement": placement, "weight_transfer": transfer})

    train(cfg("cpu"), tmp_path / "colocated", problems=PROBLEMS)
    train(cfg("split"), tmp_path / "split", problems=PROBLEMS)
    _, rows1, recs1, w1 = _files(tmp_path / "colocated")
    _, rows2, recs2, w2 = _files(tmp_path / "split")
    assert len(recs2) == len(recs1) > 0
    for a, b in zip(recs1, recs2, strict=True):
        assert {k: v for k, v in b.items() if k != "token_logprobs"} == {k: v for k, v in a.items() if k != "token_logprobs"}
        assert b["token_logprobs"] == pytest.approx(a["token_logprobs"], abs=1e-5)
    assert sorted(rows2) == sorted(rows1) == [(0, "a"), (0, "b"), (1, "a"), (1, "b")]
    assert_same_compute(tmp_path / "colocated", rows1, tmp_path / "split", rows2)
    for key, r1 in rows1.items():
        assert {k: rows2[key].get(k) for k in DECISIONS} == {k: r1.get(k) for k in DECISIONS}, key
        assert rows2[key]["loss"] == pytest.approx(r1["loss"], abs=1e-5)
    assert {r["policy_version"] for r in recs2 if r["policy_id"] == "a" and r["step"] == 1} == {1}
    for n in "ab":
        assert max(float((w2[n][k] - w1[n][k]).abs().max()) for k in w1[n]) < 1e-5, n
    plan = (tmp_path / "split" / "plan.txt").read_text()
    for r, role in enumerate(("train", "train", "rollout", "rollout")):
        assert f"a rank {r}/4: {role} (CPU) on node0/ram" in plan
