"""What a cluster has: nodes with GPUs (and their memory), CPUs and RAM, from a YAML file or this machine.

A cluster file (``experiments/configs/clusters/*.yaml``)::

    name: 8xA100-80GB
    nodes:
      - {count: 1, gpus: 8, gpu_memory_gib: 80, cpus: 96, ram_gib: 1000}
    memory_model: {usable_fraction: 0.9}      # optional, see memory.MemoryModel

Unknown keys are errors naming the key. Without a file, :func:`detect_local_cluster` reads this
machine (``torch.cuda`` devices, ``os.cpu_count``, ``/proc/meminfo``), and :func:`live_ray_cluster` a
running Ray cluster: CPUs, GPUs and RAM from each node's Ray resources, and each GPU node's GPU memory
measured on that node (a task pinned to it, holding its GPUs, reads them with ``torch.cuda``), so a head
without GPUs, or with smaller ones, plans its workers' GPUs right.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from mrl_llm.distributed.memory import GiB, MemoryModel
from shared_interfaces.config_io import ConfigError, from_mapping, load_yaml
from shared_interfaces.mwra import Resources

#: The largest cluster a plan is made for (the plan lists every device: 1024 8-GPU nodes take seconds), the most
#: GPUs a node may have, and the most GiB a GPU or a node's RAM may have (1 PiB: far above any machine, far below
#: what overflows the byte counts to infinity and a vLLM engine's share of its GPU to 0).
MAX_NODES, MAX_GPUS_PER_NODE, MAX_MEMORY_GIB = 1024, 64, 2**20


@dataclass(frozen=True)
class NodeSpec:
    """``count`` identical nodes."""

    gpus: int = 0
    gpu_memory_gib: float = 0.0
    cpus: int = 1
    ram_gib: float = 1.0
    count: int = 1

    def __post_init__(self) -> None:
        if self.count < 1 or self.cpus < 1 or self.gpus < 0 or self.ram_gib <= 0:
            raise ConfigError(f"node spec {self}: count and cpus must be >= 1, gpus >= 0, ram_gib > 0")
        if self.count > MAX_NODES or self.gpus > MAX_GPUS_PER_NODE:
            raise ConfigError(f"node spec {self}: at most {MAX_NODES} nodes and {MAX_GPUS_PER_NODE} GPUs a node; "
                              "describe the nodes the run will use")
        if self.gpus > 0 and self.gpu_memory_gib <= 0:
            raise ConfigError(f"node spec {self}: gpus > 0 needs gpu_memory_gib > 0")
        if self.gpu_memory_gib > MAX_MEMORY_GIB or self.ram_gib > MAX_MEMORY_GIB:
            raise ConfigError(f"node spec {self}: gpu_memory_gib and ram_gib are GiB, at most {MAX_MEMORY_GIB}; give "
                              "the memory one GPU and one node have")


@dataclass(frozen=True)
class Device:
    """One placement target: a GPU (``node0/gpu3``) or a node's host RAM (``node0/ram``)."""

    name: str
    node: int
    kind: str  # "gpu" | "ram"
    capacity_bytes: float


@dataclass(frozen=True)
class ClusterSpec:
    name: str
    nodes: tuple[NodeSpec, ...]
    memory_model: MemoryModel = field(default_factory=MemoryModel)

    def __post_init__(self) -> None:
        if not self.nodes:
            raise ConfigError(f"cluster {self.name!r}: nodes must list at least one node")
        total = sum(n.count for n in self.nodes)
        if total > MAX_NODES:
            raise ConfigError(f"cluster {self.name!r}: {total} nodes, at most {MAX_NODES}; describe the nodes the "
                              "run will use")

    def expanded(self) -> list[NodeSpec]:
        """One entry per physical node (``count`` unrolled)."""
        return [n for n in self.nodes for _ in range(n.count)]

    def gpus(self) -> list[Device]:
        return [
            Device(f"node{i}/gpu{j}", i, "gpu", n.gpu_memory_gib * GiB)
            for i, n in enumerate(self.expanded())
            for j in range(n.gpus)
        ]

    def rams(self) -> list[Device]:
        return [Device(f"node{i}/ram", i, "ram", n.ram_gib * GiB) for i, n in enumerate(self.expanded())]

    @property
    def n_gpus(self) -> int:
        return sum(n.gpus for n in self.expanded())

    @property
    def n_cpus(self) -> int:
        return sum(n.cpus for n in self.expanded())

    def resources(self) -> Resources:
        """The cluster as the core's :class:`~shared_interfaces.mwra.Resources` (smallest GPU memory)."""
        nodes = self.expanded()
        gpu_mem = min((n.gpu_memory_gib for n in nodes if n.gpus), default=0.0)
        return Resources(
            n_gpus=self.n_gpus, gpu_memory_gib=gpu_mem, n_cpus=self.n_cpus,
            ram_gib=sum(n.ram_gib for n in nodes),
        )

    def describe(self) -> str:
        parts = []
        for n in self.nodes:
            gpu = f"{n.gpus}x{n.gpu_memory_gib:g} GiB GPU, " if n.gpus else "no GPU, "
            parts.append(f"{n.count} node(s) of {gpu}{n.cpus} CPUs, {n.ram_gib:g} GiB RAM")
        return f"{self.name}: " + "; ".join(parts)


def load_cluster(path: str | Path) -> ClusterSpec:
    """Read a cluster YAML file (module docstring); errors name the file and the key."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(
            f"cluster file {p} not found; pass --cluster with one of experiments/configs/clusters/*.yaml "
            "or omit it to plan for this machine"
        )
    data = load_yaml(p)
    if not isinstance(data, dict):
        raise ConfigError(f"cluster file {p}: expected a mapping with 'name' and 'nodes'")
    data = dict(data)
    data.setdefault("name", p.stem)
    return from_mapping(ClusterSpec, data, where=f"cluster file {p}")


def detect_local_cluster() -> ClusterSpec:
    """This machine as a one-node cluster."""
    cpus = os.cpu_count() or 1
    ram = 1.0
    try:
        with open("/proc/meminfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    ram = int(line.split()[1]) * 1024 / GiB
                    break
    except OSError:
        pass
    gpus, gpu_mem = 0, 0.0
    try:
        import torch

        if torch.cuda.is_available():
            gpus = torch.cuda.device_count()
            gpu_mem = min(torch.cuda.get_device_properties(i).total_memory for i in range(gpus)) / GiB
    except Exception:  # a broken CUDA install plans as CPU-only
        gpus = 0
    return ClusterSpec("local", (NodeSpec(gpus=gpus, gpu_memory_gib=gpu_mem, cpus=cpus, ram_gib=ram),))


def node_hardware() -> NodeSpec:
    """The machine this runs on as one :class:`NodeSpec` (what :func:`detect_local_cluster` reads)."""
    return detect_local_cluster().nodes[0]


def live_ray_cluster(probe: Callable[[], NodeSpec] = node_hardware, *, timeout_s: float = 120.0) -> ClusterSpec:
    """The live Ray cluster's alive nodes as a :class:`ClusterSpec`: CPUs, GPUs and RAM (Ray's schedulable
    memory) from each node's resources; the GPU memory of a node with GPUs from ``probe`` run on that node
    (pinned to it, holding all its GPUs). A node whose probe does not answer within ``timeout_s`` (its
    GPUs busy) or sees fewer GPUs than Ray lists is a :class:`ConfigError` saying to describe the
    cluster in a YAML file (``runtime.cluster``)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    alive = [n for n in ray.nodes() if n.get("Alive", True)]
    if not alive:
        raise ConfigError("the Ray cluster has no alive node; start one (ray start) or set runtime.cluster")
    refs = {}
    for n in alive:
        gpus = int(n["Resources"].get("GPU", 0))
        if gpus:
            on_node = NodeAffinitySchedulingStrategy(node_id=n["NodeID"], soft=False)
            refs[n["NodeID"]] = ray.remote(probe).options(num_cpus=0, num_gpus=gpus, scheduling_strategy=on_node,
                                                          max_retries=0).remote()
    fix = "describe the cluster in a YAML file (experiments/configs/clusters/) and set runtime.cluster"
    nodes = []
    for n in alive:
        r, where = n["Resources"], f"Ray node {n.get('NodeManagerAddress', '?')} ({n['NodeID'][:8]})"
        gpus, gpu_mem = int(r.get("GPU", 0)), 0.0
        if gpus:
            ready, _ = ray.wait([refs[n["NodeID"]]], timeout=timeout_s)
            if not ready:
                ray.cancel(refs[n["NodeID"]], force=True)
                raise ConfigError(f"{where}: could not read its {gpus} GPUs' memory within {timeout_s:g} s (are they "
                                  f"in use?); {fix}")
            try:
                seen = ray.get(ready[0])
            except Exception as err:
                cause = getattr(err, "cause", None) or err  # a RayTaskError wraps the probe's own exception
                raise ConfigError(f"{where}: reading its GPUs' memory failed ({type(cause).__name__}: "
                                  f"{str(cause).strip().splitlines()[0] if str(cause).strip() else ''}); {fix}") from None
            if seen.gpus < gpus or seen.gpu_memory_gib <= 0:
                raise ConfigError(f"{where}: Ray lists {gpus} GPUs but torch there sees {seen.gpus}; check the node's "
                                  f"CUDA install and its --num-gpus, or {fix}")
            gpu_mem = seen.gpu_memory_gib
        nodes.append(NodeSpec(gpus=gpus, gpu_memory_gib=gpu_mem, cpus=max(1, int(r.get("CPU", 1))),
                              ram_gib=max(float(r.get("memory", GiB)) / GiB, 1e-3)))
    return ClusterSpec("ray", tuple(nodes))
