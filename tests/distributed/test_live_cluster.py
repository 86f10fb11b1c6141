"""GPU memory per node comes from that node: :func:`mrl_llm.distributed.cluster.live_ray_cluster` on a real
two-node local Ray cluster, one node advertising a GPU (no CUDA here: the probe is the test's)."""

from __future__ import annotations

import os

import pytest

ray = pytest.importorskip("ray")

from mrl_llm.distributed.cluster import NodeSpec, live_ray_cluster  # noqa: E402
from shared_interfaces.config_io import ConfigError  # noqa: E402


def probe_on_node() -> NodeSpec:
    """What a GPU node reports: the GPUs Ray gave the task, and a memory that names the node it ran on."""
    gpus = len(ray.get_gpu_ids())
    return NodeSpec(gpus=gpus, gpu_memory_gib=float(os.environ["MRL_TEST_GPU_GIB"]), cpus=1)


def probe_sees_none() -> NodeSpec:
    return NodeSpec(gpus=0, cpus=1)


def probe_fails() -> NodeSpec:
    raise RuntimeError("no driver")


@pytest.fixture(scope="module")
def two_nodes():
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False,
                                                          "env_vars": {"MRL_TEST_GPU_GIB": "11"}})
    cluster.add_node(num_cpus=1, num_gpus=2, env_vars={"MRL_TEST_GPU_GIB": "77"})
    ray.init(address=cluster.address)
    cluster.wait_for_nodes()
    yield cluster
    ray.shutdown()
    cluster.shutdown()


def test_each_gpu_node_reports_its_own_gpu_memory(two_nodes):
    spec = live_ray_cluster(probe_on_node)
    by_gpus = sorted(spec.nodes, key=lambda n: n.gpus)
    assert [n.gpus for n in by_gpus] == [0, 2]
    assert by_gpus[0].gpu_memory_gib == 0.0  # the head: no GPU, no probe
    assert by_gpus[1].gpu_memory_gib == 77.0  # measured on the GPU node, not the head's 11
    assert spec.n_cpus == 2 and [d.name for d in spec.gpus()] and all(d.capacity_bytes > 0 for d in spec.gpus())


def test_a_node_whose_gpus_torch_cannot_see_is_a_config_error(two_nodes):
    with pytest.raises(ConfigError, match=r"Ray lists 2 GPUs but torch there sees 0.*runtime.cluster"):
        live_ray_cluster(probe_sees_none)


def test_a_failing_probe_is_a_config_error_naming_the_node(two_nodes):
    with pytest.raises(ConfigError, match=r"Ray node .*reading its GPUs' memory failed \(RuntimeError: no driver\)"):
        live_ray_cluster(probe_fails)


def test_no_alive_node_is_a_config_error(monkeypatch):
    monkeypatch.setattr(ray, "nodes", lambda: [{"NodeID": "x", "Alive": False, "Resources": {"CPU": 1.0}}])
    with pytest.raises(ConfigError, match="no alive node"):
        live_ray_cluster(probe_on_node)
