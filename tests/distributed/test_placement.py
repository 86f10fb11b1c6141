"""MWRA plans become real Ray resources: per policy a placement group of its planned bundles, its actor
in bundle 0 with the bundle's CPUs and (fractional) GPUs. A local Ray cluster that declares one GPU
(Ray schedules declared GPUs whether or not CUDA is there) holds the paper pair colocated on it as two
fractional shares; the CPU demo gets whole CPUs; what does not fit is refused naming the policy."""

from __future__ import annotations

import pytest

from mrl_llm.distributed.cluster import ClusterSpec, NodeSpec
from mrl_llm.distributed.driver import actor_options, reserve_placement_group
from mrl_llm.distributed.planner import plan_placement
from tests.distributed.specs import cpu_demo, paper_pair
from tests.llm.helpers import local_ray

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def ray_gpu():
    with local_ray("mrl-tests-placement", num_gpus=1) as ray:
        yield ray


class Probe:
    def where(self) -> dict:
        import os

        import ray

        ctx = ray.get_runtime_context()
        return {"gpu_ids": [str(g) for g in ray.get_gpu_ids()], "resources": ctx.get_assigned_resources(),
                "cuda_visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "pg": ctx.get_placement_group_id()}


def _start(ray, placement):
    pg = reserve_placement_group(placement, timeout_s=30)
    actor = ray.remote(Probe).options(**actor_options(placement, pg)).remote()
    return pg, actor, ray.get(actor.where.remote())


def test_paper_pair_shares_one_gpu_as_two_fractional_placement_groups(ray_gpu):
    ray = ray_gpu
    one_gpu = ClusterSpec("1gpu-2cpu", (NodeSpec(gpus=1, gpu_memory_gib=140.4, cpus=2, ram_gib=128),))
    plan = plan_placement(paper_pair(), one_gpu, mode="colocated")
    fracs = [p.bundles[0]["GPU"] for p in plan.policies]
    assert 0 < min(fracs) and sum(fracs) == pytest.approx(1.0)
    started = []
    try:
        for p in plan.policies:
            pg, actor, got = _start(ray, p)
            started.append((pg, actor))
            assert got["gpu_ids"] == ["0"] and got["cuda_visible"] == "0"  # both policies on the one GPU
            assert got["resources"]["GPU"] == pytest.approx(p.bundles[0]["GPU"], abs=1e-4)
            assert got["resources"]["CPU"] == pytest.approx(p.bundles[0]["CPU"]) == 1.0
            assert got["pg"] == pg.id.hex()
        # the GPU is fully reserved now: a third policy asking for a whole one is refused by name
        extra = plan_placement(paper_pair()[:1], one_gpu, mode="colocated").policies[0]
        with pytest.raises(RuntimeError, match="qwen2.5-math-1.5b.*could not reserve"):
            reserve_placement_group(extra, timeout_s=3)
    finally:
        for pg, actor in started:
            ray.kill(actor)
            ray.util.remove_placement_group(pg)


def test_cpu_demo_gets_one_whole_cpu_per_policy(ray_gpu):
    ray = ray_gpu
    plan = plan_placement(cpu_demo(), ClusterSpec("2cpu", (NodeSpec(cpus=2, ram_gib=24),)))
    assert plan.mode == "cpu" and [p.bundles for p in plan.policies] == [({"CPU": 1.0},), ({"CPU": 1.0},)]
    started = []
    try:
        for p in plan.policies:
            pg, actor, got = _start(ray, p)
            started.append((pg, actor))
            assert got["resources"] == {"CPU": 1.0} and got["gpu_ids"] == []
            assert p.threads == 1
    finally:
        for pg, actor in started:
            ray.kill(actor)
            ray.util.remove_placement_group(pg)
