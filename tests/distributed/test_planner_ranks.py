"""Worker groups in the MWRA plan (``policies[].ranks``): CPU mode plans one CPU slot per rank, splits the
policy's CPUs over them (fractional on 2 CPUs), shards the training estimate over the ranks, prints each
rank's role; split pools on CPUs plan trainer and rollout slots per rank; a malformed ``ranks`` is refused
naming the policy."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from mrl_llm.config import PolicyConfig
from mrl_llm.distributed.cluster import ClusterSpec, NodeSpec
from mrl_llm.distributed.memory import PolicyFootprint, checkpoint_host_bytes
from mrl_llm.distributed.plan_cli import footprints_from_config
from mrl_llm.distributed.planner import HINTS, hints, plan_placement
from shared_interfaces.config_io import ConfigError
from shared_interfaces.mwra import AllocationError

from .specs import cpu_demo

TWO_CPUS = ClusterSpec("two", (NodeSpec(gpus=0, gpu_memory_gib=0.0, cpus=2, ram_gib=16.0),))
EIGHT_CPUS = ClusterSpec("eight", (NodeSpec(gpus=0, gpu_memory_gib=0.0, cpus=8, ram_gib=16.0),))


def test_cpu_mode_plans_one_slot_per_rank():
    fps = [replace(f, ranks=2) for f in cpu_demo()]
    plan = plan_placement(fps, TWO_CPUS, mode="cpu")
    for p in plan.policies:
        assert len(p.bundles) == 2 and p.bundle_roles == ("cpu", "cpu") and p.threads == 1
        assert all(0 < b["CPU"] < 1 for b in p.bundles)  # 4 ranks on 2 CPUs: fractions
    assert math.isclose(sum(b["CPU"] for p in plan.policies for b in p.bundles), 2.0)
    text = plan.render()
    for p in plan.policies:
        for r in range(2):
            assert f"{p.policy} rank {r}/2: train + rollout (CPU) on node0/ram" in text
    whole = plan_placement(fps, EIGHT_CPUS, mode="cpu")
    assert all(b["CPU"] == int(b["CPU"]) >= 1 for p in whole.policies for b in p.bundles)
    assert sum(b["CPU"] for p in whole.policies for b in p.bundles) == 8


def test_ranks_shard_the_training_estimate_and_one_rank_is_the_old_plan():
    one = plan_placement(cpu_demo(), TWO_CPUS, mode="cpu")
    assert [len(p.bundles) for p in one.policies] == [1, 1]
    assert [p.rank_roles() for p in one.policies][0][0].startswith("qwen-tiny rank 0/1: train + rollout (CPU)")
    two = plan_placement([replace(f, ranks=2) for f in cpu_demo()], TWO_CPUS, mode="cpu")
    per_rank = {(part.policy): part.memory for load in two.devices for part in load.parts}
    whole = {(part.policy): part.memory for load in one.devices for part in load.parts}
    for name in per_rank:
        assert per_rank[name].optimizer == pytest.approx(whole[name].optimizer / 2)  # AdamW moments sharded
        assert per_rank[name].weights > whole[name].weights  # the shards, a gathered layer and the rollout copy
    replicas = plan_placement([replace(f, ranks=2, fsdp_unit="none") for f in cpu_demo()], TWO_CPUS, mode="cpu")
    per_replica = {(part.policy): part.memory for load in replicas.devices for part in load.parts}
    for name in per_replica:  # each rank the whole training state, as one rank; no rollout copy beside it
        got, one_rank = per_replica[name], whole[name]
        assert (got.weights, got.gradients, got.optimizer) == (one_rank.weights, one_rank.gradients, one_rank.optimizer)


def test_the_plan_says_how_each_policy_trains():
    """One line per policy under its ranks: one process, FSDP2 (its unit and when gradients sync) or replicas;
    a split policy counts its trainer ranks only."""
    one = plan_placement(cpu_demo(), TWO_CPUS, mode="cpu")
    assert all(p.training == "in one process (no sharding)" for p in one.policies)
    fps = cpu_demo()
    mixed = [replace(fps[0], ranks=2, grad_sync="mini_batch"), replace(fps[1], ranks=2, fsdp_unit="none")]
    text = plan_placement(mixed, TWO_CPUS, mode="cpu").render()
    assert (f"{fps[0].name} trains FSDP2-sharded over 2 ranks (a unit per decoder layer; kept gathered through a "
            "mini-batch, gradients reduce-scattered once a mini-batch)") in text
    assert f"{fps[1].name} trains as 2 whole replicas (gradients all-reduced once a mini-batch)" in text
    model = plan_placement([replace(fps[0], ranks=2, fsdp_unit="model")], TWO_CPUS, mode="cpu").policies[0]
    assert model.training == ("FSDP2-sharded over 2 ranks (the whole model one unit; gradients reduce-scattered "
                              "every micro-batch)")
    split = plan_placement([replace(f, ranks=4) for f in cpu_demo()], EIGHT_CPUS, mode="split").policies[0]
    assert split.bundle_roles == ("train",) * 4 + ("rollout",) * 4 and "over 4 ranks" in split.training


def test_malformed_ranks_are_refused_naming_the_policy():
    with pytest.raises(ConfigError, match=r"policy 'a': ranks must be an integer >= 1 .* got 0"):
        PolicyConfig(name="a", model_config={"model_type": "llama"}, ranks=0)
    with pytest.raises(ConfigError, match=r"policy 'a': ranks must be an integer >= 1 .* got True"):
        PolicyConfig(name="a", model_config={"model_type": "llama"}, ranks=True)
    with pytest.raises(ValueError, match="policy 'x': ranks must be >= 1, got 0"):
        replace(cpu_demo()[0], name="x", ranks=0)
    mc = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
          "num_attention_heads": 4, "vocab_size": 300}
    fps = footprints_from_config({"policies": [{"name": "a", "model_config": mc, "ranks": 3}, {"name": "b", "model_config": mc}]})
    assert [f.ranks for f in fps] == [3, 1] and [f.fsdp_unit for f in fps] == ["layer", "layer"]
    fps = footprints_from_config({"policies": [{"name": "a", "model_config": mc, "ranks": 2,
                                                "train": {"fsdp_unit": "model"}}]})
    assert (fps[0].fsdp_unit, fps[0].grad_sync) == ("model", "micro_batch")
    fps = footprints_from_config({"policies": [{"name": "a", "model_config": mc, "ranks": 2,
                                                "train": {"grad_sync": "mini_batch"}}]})
    assert (fps[0].fsdp_unit, fps[0].grad_sync) == ("layer", "mini_batch")
    assert isinstance(fps[0], PolicyFootprint)


def test_split_on_cpus_plans_trainer_and_rollout_slots_per_rank():
    fps = [replace(f, ranks=2) for f in cpu_demo()]
    plan = plan_placement(fps, EIGHT_CPUS, mode="split")
    assert plan.mode == "split"
    for p in plan.policies:
        assert p.bundle_roles == ("train", "train", "rollout", "rollout") and p.num_gpus == 0
        assert all(b["CPU"] == 1 for b in p.bundles) and p.threads == 1  # 8 slots on 8 CPUs
        assert len(p.train_devices) == len(p.rollout_devices) == 2
    text = plan.render()
    assert "qwen-tiny rank 0/4: train (CPU) on node0/ram" in text and "rank 3/4: rollout (CPU) on node0/ram" in text
    parts = {(part.policy, part.role): part.memory for load in plan.devices for part in load.parts}
    name = plan.policies[0].policy
    assert parts[(name, "train")].kv_cache == 0 and parts[(name, "rollout")].optimizer == 0  # each pool its own state
    cpu = plan_placement(fps, EIGHT_CPUS, mode="cpu")
    rank0, rank1 = [part for load in cpu.devices for part in load.parts if part.policy == name]
    assert parts[(name, "train")].optimizer == pytest.approx(rank1.memory.optimizer)  # the same 2-way sharding
    # rank 0 alone also holds the AdamW state a checkpoint gathers there (8 N bytes), in both layouts
    fp = fps[0]
    assert rank0.memory.optimizer - rank1.memory.optimizer == pytest.approx(checkpoint_host_bytes(fp, 2))
    assert checkpoint_host_bytes(fp, 2) == 8 * fp.n_params
    trains = [part for load in plan.devices for part in load.parts if part.policy == name and part.role == "train"]
    assert [t.memory.optimizer for t in trains] == [rank0.memory.optimizer, rank1.memory.optimizer]
    small = plan_placement(cpu_demo(), TWO_CPUS, mode="split")  # 4 slots on 2 CPUs: fractions, one thread
    assert [p.bundle_roles for p in small.policies] == [("train", "rollout")] * 2
    assert math.isclose(sum(b["CPU"] for p in small.policies for b in p.bundles), 2.0)


def test_colocated_on_a_cpu_cluster_is_refused_pointing_at_cpu_or_split():
    from shared_interfaces.mwra import AllocationError

    with pytest.raises(AllocationError, match=r"needs GPUs.*use --mode cpu or split"):
        plan_placement(cpu_demo(), TWO_CPUS, mode="colocated")
    with pytest.raises(AllocationError, match="no policies to place"):
        plan_placement([], TWO_CPUS, mode="split")


def test_a_plan_that_does_not_fit_names_the_layout_settings_that_cost_less():
    """Beside the general hints, each policy on the device that does not fit gets the layout setting that would
    cost less memory there; a one-rank policy and per-layer shards synced every micro-batch get none."""
    a, b = cpu_demo()
    assert hints([]) == HINTS and hints([(a, 1), (replace(a, fsdp_unit="none"), 1), (b, 2)]) == HINTS
    assert hints([(replace(a, fsdp_unit="none"), 2), (replace(b, grad_sync="mini_batch"), 2)]) == (
        f"{HINTS}; or train.fsdp_unit: layer for {a.name} (FSDP2 shards, not 2 whole replicas)"
        f"; or train.grad_sync: micro_batch for {b.name} (its units resharded after each pass)")
    assert hints([(replace(a, fsdp_unit="model"), 3)]).endswith(
        f"; or train.fsdp_unit: layer for {a.name} (one layer gathered at a time)")
    tiny = ClusterSpec("tiny", (NodeSpec(gpus=0, gpu_memory_gib=0.0, cpus=2, ram_gib=0.001),))
    with pytest.raises(AllocationError, match=rf"does not fit: .*train\.grad_sync: micro_batch for {a.name}"):
        plan_placement([replace(a, ranks=2, grad_sync="mini_batch")], tiny, mode="cpu")
