"""MWRA placement: the issue's four planning cases, plus split pools, fractional CPUs and KV scaling."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from mrl_llm.distributed.cluster import ClusterSpec, NodeSpec, load_cluster
from mrl_llm.distributed.memory import (
    GiB,
    full_model_bytes,
    kv_bytes_per_sequence,
    rollout_bytes,
    sync_copy_bytes,
    training_bytes,
)
from mrl_llm.distributed.planner import PlacementPlan, apportion, plan_placement
from shared_interfaces.config_io import ConfigError
from shared_interfaces.mwra import AllocationError, AllocationPlan

from .specs import CLUSTERS, cpu_demo, paper_pair


def _check_consistent(plan: PlacementPlan) -> None:
    """Every device fits, every policy is placed, and the core's AllocationPlan agrees."""
    for load in plan.devices:
        assert 0 < load.used_bytes <= load.usable_bytes, load.device.name
    alloc = plan.allocation()
    assert isinstance(alloc, AllocationPlan) and alloc.mode == plan.mode
    assert [a.policy for a in alloc.allocations] == [p.policy for p in plan.policies]
    assert math.isclose(sum(p.share for p in plan.policies), 1.0)
    for p in plan.policies:
        assert p.rollout_concurrency >= 1
        assert p.rollout_waves * p.rollout_concurrency * len(p.rollout_devices) >= p.rollouts_per_step
        assert math.isclose(sum(b.get("GPU", 0.0) for b in p.bundles), p.num_gpus)
        assert math.isclose(sum(b["CPU"] for b in p.bundles), p.num_cpus)


def test_paper_pair_on_8xA100_80GB() -> None:
    cluster = load_cluster(CLUSTERS / "8xA100-80GB.yaml")
    plan = plan_placement(paper_pair(), cluster)
    _check_consistent(plan)
    assert plan.mode == "colocated"
    gpus = [p.num_gpus for p in plan.policies]
    assert sum(gpus) == 8 and all(g >= 1 and g == int(g) for g in gpus)
    # The larger Qwen3 (more parameters, same workload) gets at least as many GPUs.
    assert gpus[1] >= gpus[0]
    used = sorted(d for p in plan.policies for d in p.train_devices)
    assert used == sorted(f"node0/gpu{i}" for i in range(8))
    # Each GPU's estimate is the sum of the documented parts for that policy and its shard count.
    fp = paper_pair()[0]
    k = int(gpus[0])
    load = next(ld for ld in plan.devices if ld.device.name == "node0/gpu0")
    c = plan.policies[0].rollout_concurrency
    expect = (training_bytes(fp, k).total + rollout_bytes(fp, c, own_weights=True).total
              + cluster.memory_model.process_overhead_gib * GiB)
    assert k > 1  # ... so each rank also holds the whole rollout copy the gathered weights land in
    # ... and the bf16 state dict a sync to the bf16 vLLM engine makes from it
    assert fp.engine == "vllm" and sync_copy_bytes(fp) == 2 * fp.n_params
    assert math.isclose(load.used_bytes, expect + full_model_bytes(fp).total + sync_copy_bytes(fp))
    text = plan.render()
    assert "mode=colocated" in text and "kv_cache" in text and "node0/gpu7" in text
    # asynchronous training prefers split pools when they fit
    split = plan_placement(paper_pair(), cluster, prefer_split=True)
    _check_consistent(split)
    assert split.mode == "split"
    for p in split.policies:
        assert set(p.train_devices).isdisjoint(p.rollout_devices) and p.rollout_devices
    # a split trainer rank: its shard on the GPU; the whole rollout copy it hands the rollout actors (k > 1)
    # in host RAM, one per trainer rank beside the node's staging copy; a rollout actor: a whole model (fp32,
    # like the masters) plus vLLM's own bf16 copy, the bf16 state dict each sync casts from the fp32 one, and its KV cache
    parts = {ld.device.name: ld.parts for ld in split.devices}
    host = {pt.policy: pt.memory for pt in parts["node0/ram"]}
    for p, fp in zip(split.policies, paper_pair(), strict=True):
        k = len(p.train_devices)
        assert k > 1
        (train,) = parts[p.train_devices[0]]
        assert train.role == "train"
        assert math.isclose(train.memory.total, training_bytes(fp, k).total
                            + cluster.memory_model.process_overhead_gib * GiB)
        (roll,) = parts[p.rollout_devices[0]]
        assert roll.role == "rollout"
        assert math.isclose(roll.memory.weights, fp.n_params * (4 + 2 + 2))
        assert math.isclose(host[fp.name].weights, fp.n_params * 2 + k * full_model_bytes(fp).weights)


def test_paper_pair_on_1xH200_141GB_shares_the_gpu() -> None:
    cluster = load_cluster(CLUSTERS / "1xH200-141GB.yaml")
    plan = plan_placement(paper_pair(), cluster)
    _check_consistent(plan)
    assert plan.mode == "colocated"
    fractions = [p.num_gpus for p in plan.policies]
    assert all(0 < f < 1 for f in fractions) and math.isclose(sum(fractions), 1.0)
    assert {p.train_devices for p in plan.policies} == {("node0/gpu0",)}
    # KV cache was scaled down to what fits: fewer sequences in flight than the 256 requested.
    assert all(p.rollout_concurrency < 256 for p in plan.policies)
    assert all(p.rollout_waves > 1 for p in plan.policies)
    with pytest.raises(AllocationError, match="split pools need at least 2 GPUs per policy"):
        plan_placement(paper_pair(), cluster, mode="split")


def test_cpu_demo_on_2cpu_24GiB() -> None:
    cluster = load_cluster(CLUSTERS / "cpu-2core-24GiB.yaml")
    plan = plan_placement(cpu_demo(), cluster)
    _check_consistent(plan)
    assert plan.mode == "cpu"
    assert [p.num_cpus for p in plan.policies] == [1.0, 1.0]
    assert [p.threads for p in plan.policies] == [1, 1]
    assert all(p.rollout_concurrency == p.rollouts_per_step for p in plan.policies)
    assert "node0/ram" in plan.render()
    # two ranks per policy: each holds its shard of the training state plus the whole copy the HF engine
    # samples from, and no third copy for the engine
    two = plan_placement([replace(fp, ranks=2) for fp in cpu_demo()], cluster)
    fp = cpu_demo()[0]
    part = next(pt for ld in two.devices for pt in ld.parts if pt.policy == fp.name)
    assert math.isclose(part.memory.weights, training_bytes(fp, 2).weights + full_model_bytes(fp).weights)
    # split pools of CPU slots: a trainer rank's copy is in host RAM, i.e. on its own slot here
    split = plan_placement([replace(fp, ranks=2) for fp in cpu_demo()], cluster, mode="split")
    roles = {pt.role: pt.memory for ld in split.devices for pt in ld.parts if pt.policy == fp.name}
    assert math.isclose(roles["train"].weights, training_bytes(fp, 2).weights + full_model_bytes(fp).weights)
    assert math.isclose(roles["rollout"].weights, full_model_bytes(fp).weights)  # hf: no second copy


def test_paper_pair_refused_on_the_cpu_machine_with_the_shortfall() -> None:
    cluster = load_cluster(CLUSTERS / "cpu-2core-24GiB.yaml")
    with pytest.raises(AllocationError) as info:
        plan_placement(paper_pair(), cluster)
    msg = str(info.value)
    assert "node0/ram" in msg and "qwen2.5-math-1.5b" in msg and "qwen3-1.7b-base" in msg
    need = sum(
        training_bytes(fp).total + rollout_bytes(fp, 1, own_weights=True).total + sync_copy_bytes(fp)
        + cluster.memory_model.host_process_gib * GiB
        for fp in paper_pair()
    )
    short = (need - 24 * GiB * cluster.memory_model.usable_fraction) / GiB
    assert f"short by {short:.1f} GiB" in msg
    assert "try:" in msg


def test_three_policies_on_two_cpus_get_fractional_cpus() -> None:
    fps = cpu_demo() + [cpu_demo()[0].__class__(**{**cpu_demo()[0].__dict__, "name": "third"})]
    plan = plan_placement(fps, load_cluster(CLUSTERS / "cpu-2core-24GiB.yaml"))
    _check_consistent(plan)
    assert math.isclose(sum(p.num_cpus for p in plan.policies), 2.0)
    assert all(0 < p.num_cpus < 1 and p.threads == 1 for p in plan.policies)


def test_kv_concurrency_scales_to_what_fits() -> None:
    fp = paper_pair()[0]
    roomy = ClusterSpec("big", (NodeSpec(gpus=1, gpu_memory_gib=400, cpus=4, ram_gib=64),))
    tight = ClusterSpec("tight", (NodeSpec(gpus=1, gpu_memory_gib=50, cpus=4, ram_gib=64),))  # chunked logits: 70 fits
    big, small = plan_placement([fp], roomy), plan_placement([fp], tight)
    assert big.policies[0].rollout_concurrency == 256
    c = small.policies[0].rollout_concurrency
    assert 1 <= c < 256
    load = small.devices[0]
    # one more sequence would not have fitted
    assert load.used_bytes + kv_bytes_per_sequence(fp) + 8 * fp.shape.vocab_size > load.usable_bytes * 0.999
    too_small = ClusterSpec("tiny", (NodeSpec(gpus=1, gpu_memory_gib=16, cpus=4, ram_gib=64),))
    with pytest.raises(AllocationError, match=r"node0/gpu0 \(16.0 GiB, 14.4 GiB usable\).*short by"):
        plan_placement([fp], too_small)


def test_apportion_and_errors() -> None:
    assert apportion([0.5, 0.3, 0.2], 10, 1) == [5, 3, 2]
    assert sum(apportion([0.7, 0.3], 7, 2)) == 7
    with pytest.raises(AllocationError, match="policy names must be unique"):
        plan_placement(cpu_demo() + cpu_demo(), load_cluster(CLUSTERS / "cpu-2core-24GiB.yaml"))
    with pytest.raises(AllocationError, match="needs GPUs"):
        plan_placement(cpu_demo(), load_cluster(CLUSTERS / "cpu-2core-24GiB.yaml"), mode="colocated")


def test_cluster_files(tmp_path) -> None:
    a100 = load_cluster(CLUSTERS / "8xA100-80GB.yaml")
    assert (a100.n_gpus, a100.resources().gpu_memory_gib) == (8, 80.0)
    bad = tmp_path / "bad.yaml"
    bad.write_text("nodes:\n  - {gpus: 1, gpu_memory_gib: 8, cpus: 2, ram_gib: 8, gpu_count: 3}\n")
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['gpu_count'\]"):
        load_cluster(bad)
    with pytest.raises(ConfigError, match="not found; pass --cluster"):
        load_cluster(tmp_path / "missing.yaml")
    # sizes a plan cannot list (100000 nodes ran for minutes and gigabytes) are refused at once
    for nodes, msg in (("[{count: 100000, gpus: 8, gpu_memory_gib: 80, cpus: 2, ram_gib: 8}]", "at most 1024 nodes"),
                       ("[{gpus: 100000000, gpu_memory_gib: 80, cpus: 2, ram_gib: 8}]", "64 GPUs a node"),
                       ("[{count: 1000, cpus: 2, ram_gib: 8}, {count: 25, cpus: 2, ram_gib: 8}]",
                        "1025 nodes, at most 1024"),
                       # 1e300 GiB is infinite bytes: the plan fit anything and vLLM's GPU share came out 0
                       ("[{gpus: 1, gpu_memory_gib: 1e300, cpus: 2, ram_gib: 8}]", "are GiB, at most 1048576"),
                       ("[{cpus: 2, ram_gib: 2e6}]", "are GiB, at most 1048576")):
        bad.write_text(f"nodes: {nodes}\n")
        with pytest.raises(ConfigError, match=msg):
            load_cluster(bad)
    bad.write_text("nodes: [{gpus: 1, gpu_memory_gib: 1048576, cpus: 2, ram_gib: 1048576}]\n")
    assert load_cluster(bad).n_gpus == 1  # the bound itself is accepted
    bad.write_text("nodes: [{gpus: 2, gpu_memory_gib: 80, cpus: 2, ram_gib: 8}]\nmemory_model: {process_overhead_gib: -100}\n")
    with pytest.raises(ConfigError, match="process_overhead_gib must be a finite number >= 0"):
        load_cluster(bad)  # a negative overhead made every device's total negative, so anything fit


@pytest.mark.parametrize("mode", ["colocated", "split"])
def test_mixed_gpus_go_to_the_policy_that_needs_them_whatever_the_order(mode: str) -> None:
    # a 1.5B policy needs more than a 16 GiB GPU, a tiny one fits anywhere: in either config order and either node
    # order, the large GPUs go to the large policy (taken in config order, it got the 16 GiB one and did not fit)
    big = replace(paper_pair()[0], rollouts_per_step=64, prompt_len=512, max_response_len=1024, micro_batch=2)
    tiny = cpu_demo()[1]
    per_node = 2 if mode == "split" else 1
    small, large = (NodeSpec(gpus=per_node, gpu_memory_gib=g, cpus=4, ram_gib=64) for g in (16, 80))
    for fps in ([big, tiny], [tiny, big]):
        for nodes in ((small, large), (large, small)):
            plan = plan_placement(fps, ClusterSpec("mixed", nodes), mode=mode)
            _check_consistent(plan)
            on = {p.policy: {d.split("/")[0] for d in p.bundle_devices} for p in plan.policies}
            assert on == {big.name: {f"node{nodes.index(large)}"}, tiny.name: {f"node{nodes.index(small)}"}}
    # a cluster of equal GPUs keeps the config order: the first policy takes the first GPUs
    same = plan_placement([tiny, big], ClusterSpec("same", (replace(large, gpus=2),)), mode="colocated")
    assert [p.bundle_devices for p in same.policies] == [("node0/gpu0",), ("node0/gpu1",)]
