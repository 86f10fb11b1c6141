"""A split policy's actor roles in-process (:mod:`mrl_llm.distributed.actors`, ``spec.role``): a trainer renders
and samples nothing; rollout actor ``r`` of ``m`` samples prompts ``r, r + m, ...`` with per-sample seeds, else
rollout 0 samples all; only a rollout actor takes weights."""

from __future__ import annotations

import pytest

from mrl_llm.distributed.actors import PolicyActor, PolicyActorSpec
from shared_interfaces.exchange import InMemoryExchange

PROMPTS = ["p0", "p1", "p2", "p3", "p4"]


def _actor(tmp_path, *, seeding: str | None = "call", config_group: dict | None = None, **kw) -> PolicyActor:
    """``seeding=None``: the config leaves ``sampling.seeding`` to its default."""
    cfg = {"good_on": 0, "n_prompts": 6, "policy": {"sampling": {} if seeding is None else {"seeding": seeding}}}
    if config_group is not None:  # the rank this actor believes it is (no process group is joined here)
        cfg["group"] = config_group
    spec = PolicyActorSpec(name="A", factory="tests.distributed.toy_worker:build", config=cfg, seed=1,
                           regime={"name": "grpo"}, checkpoint_dir=str(tmp_path / "ckpt"), **kw)
    return PolicyActor(spec, InMemoryExchange())


def _sampled(actor: PolicyActor) -> list[str]:
    got = actor.generate(PROMPTS, 0)
    return sorted({r.prompt_id for r in actor._own[0]}) if got["records"] else []


@pytest.mark.parametrize("seeding,want", [("sample", [["p0", "p2", "p4"], ["p1", "p3"]]),
                                          (None, [["p0", "p2", "p4"], ["p1", "p3"]]),  # the default: sample
                                          ("call", [PROMPTS, []])])
def test_rollout_actors_share_the_prompts(tmp_path, seeding, want):
    got = [_sampled(_actor(tmp_path / str(r), seeding=seeding, role="rollout", rollouts=2, rollout_rank=r))
           for r in range(2)]
    assert got == want


def test_a_trainer_samples_nothing_and_only_rollout_actors_take_weights(tmp_path):
    trainer = _actor(tmp_path / "t", role="train")
    assert trainer.generate(PROMPTS, 0)["records"] == 0 and 0 not in trainer._own
    assert _sampled(_actor(tmp_path / "one", role="rollout")) == PROMPTS  # one rollout actor samples all
    with pytest.raises(RuntimeError, match="load_weights is for rollout actors, this one is train"):
        trainer.load_weights({"state": {}, "version": 1})
    assert trainer.generate([], 1)["records"] == 0  # empty step


def test_the_weight_bus_calls_need_a_joined_bus_and_the_right_role(tmp_path):
    trainer, rollout = _actor(tmp_path / "t", role="train"), _actor(tmp_path / "r", role="rollout")
    with pytest.raises(RuntimeError, match="pull_weights is for rollout actors, this one is train"):
        trainer.pull_weights()
    with pytest.raises(RuntimeError, match="push_weights needs the weight bus; join_bus first"):
        trainer.push_weights()
    with pytest.raises(RuntimeError, match="pull_weights needs the weight bus; join_bus first"):
        rollout.pull_weights()
    rank1 = _actor(tmp_path / "t1", role="train", ranks=2, config_group={"rank": 1, "world_size": 2})
    assert rank1.push_weights() is None and rank1.join_bus({"rank": 0, "world_size": 2, "port": 1}) is False


def test_a_split_plan_without_both_pools_or_with_other_trainer_counts_is_refused():
    from mrl_llm.distributed.split_group import start_split_group

    spec = PolicyActorSpec(name="A", factory="m:f", config={}, seed=0, regime={}, checkpoint_dir="/tmp/x")
    for roles in ([], ["train"], ["rollout"], ["train", "cpu"]):
        with pytest.raises(ValueError, match=r"policy 'A': a split plan needs train and rollout bundles only"):
            start_split_group(spec, lambda: None, lambda b: {}, roles, gpu=False)
    with pytest.raises(ValueError, match="has 1 trainer ranks but its plan 2 train bundles"):
        start_split_group(spec, lambda: None, lambda b: {}, ["train", "train", "rollout"], gpu=False)
    with pytest.raises(ValueError, match=r"policy 'A': weight transfer 'nccl' is not one of \['auto', 'object_store', "
                                         r"'collective'\]"):
        start_split_group(spec, lambda: None, lambda b: {}, ["train", "rollout"], gpu=False, transfer="nccl")


def test_a_trainer_counts_its_rollout_actors_samples_and_a_split_group_hands_each_step_over_once():
    """``count_generated`` adds a ``generate`` answer's samples, tokens and FLOPs to a worker's counters (nothing
    for an empty answer or a worker without counters); a split group keeps each step's generate answer for that
    step's ``train`` only, and forgets earlier ones."""
    from mrl_llm.distributed.actors import count_generated
    from mrl_llm.distributed.rank_group import RankGroup
    from mrl_llm.distributed.split_group import SplitGroup

    c = {"samples": 4.0, "flops": 1.0, "train_tokens": 7.0}
    count_generated(c, {"samples": 8.0, "gen_tokens": 20.0, "prompt_tokens": 12.0, "gen_flops": 64.0,
                        "generation_s": 3.0, "skipped_samples": 1.0})
    assert c == {"samples": 12.0, "gen_tokens": 20.0, "prompt_tokens": 12.0, "flops": 65.0, "train_tokens": 7.0}
    count_generated(c, {})
    count_generated(c, None)
    count_generated(None, {"samples": 1.0})
    assert c["samples"] == 12.0
    g = SplitGroup(lambda: (RankGroup([]), []), policy="A")
    assert g.take_generated(0) is None  # none asked for: the train call gets no rollouts=
    g.generated.update({1: "gen1", 2: "gen2", 3: "gen3"})
    assert g.take_generated(2) == "gen2" and g.generated == {3: "gen3"}  # step 1's (a gap) forgotten
    assert g.take_generated(2) is None
