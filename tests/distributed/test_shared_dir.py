"""The shared-filesystem check (:mod:`mrl_llm.distributed.shared_dir`): an actor that sees the driver's run
directory answers there; one on a node with its own disk (here: another directory) does not, and the run
stops with one line saying a shared filesystem is needed; the empty and malformed answers."""

from __future__ import annotations

import pytest

from mrl_llm.distributed.actors import PolicyActor, PolicyActorSpec
from mrl_llm.distributed.shared_dir import PROBE_DIR, check_answer, probe, remove_token, write_token
from shared_interfaces.exchange import InMemoryExchange


def test_an_actor_that_sees_the_run_directory_passes(tmp_path):
    token = write_token(tmp_path)
    a = probe(tmp_path, token, "A", 1)
    assert a["ok"] and a["rank"] == 1 and (tmp_path / PROBE_DIR / f"{token}-A-1").is_file()
    check_answer(tmp_path, token, [a])
    assert not (tmp_path / PROBE_DIR / f"{token}-A-1").exists()  # answers are removed once checked
    check_answer(tmp_path, token, [])  # no actor: nothing to check
    remove_token(tmp_path, token)
    assert not (tmp_path / PROBE_DIR).exists()


def test_an_actor_on_another_disk_stops_the_run_with_one_line(tmp_path):
    token = write_token(tmp_path / "run")
    other = probe(tmp_path / "elsewhere", token, "B", 0)  # the same path on a node without the shared disk
    assert not other["ok"]
    with pytest.raises(RuntimeError, match=r"policy 'B' rank 0 on node .* cannot read and write the run directory "
                                           r".*needs a shared filesystem"):
        check_answer(tmp_path / "run", token, [other])
    lost = {**probe(tmp_path / "run", token, "C", 0)}
    (tmp_path / "run" / PROBE_DIR / f"{token}-C-0").unlink()  # the answer never reached the driver
    with pytest.raises(RuntimeError, match="policy 'C' rank 0"):
        check_answer(tmp_path / "run", token, [lost])
    (tmp_path / "run" / PROBE_DIR / token).write_text("garbled")
    assert not probe(tmp_path / "run", token, "D", 0)["ok"]


def test_the_policy_actor_probes_as_its_rank(tmp_path):
    spec = PolicyActorSpec(name="A", factory="tests.distributed.toy_worker:build", config={"good_on": 0, "n_prompts": 4},
                           seed=1, regime={"name": "grpo"}, checkpoint_dir=str(tmp_path / "ckpt"))
    actor = PolicyActor(spec, InMemoryExchange())
    token = write_token(tmp_path)
    got = actor.probe_run_dir(str(tmp_path), token)
    assert got["ok"] and got["policy"] == "A" and got["rank"] == 0


def test_a_split_policys_trainer_and_rollout_actor_answer_apart(tmp_path):
    base = dict(name="A", factory="tests.distributed.toy_worker:build", config={"good_on": 0, "n_prompts": 4}, seed=1,
                regime={"name": "grpo"}, checkpoint_dir=str(tmp_path / "ckpt"))
    token = write_token(tmp_path)
    answers = [PolicyActor(PolicyActorSpec(**base, role=role), InMemoryExchange()).probe_run_dir(str(tmp_path), token)
               for role in ("train", "rollout")]
    assert [a["rank"] for a in answers] == [0, "rollout-0"] and "policy 'A' rollout-0 on node" in answers[1]["where"]
    check_answer(tmp_path, token, answers)  # both answer files there, neither overwrote the other
