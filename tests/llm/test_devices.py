"""``device: auto`` is the default and the paper presets' device; a policy the MWRA plan puts on a GPU
bundle must resolve to a GPU (``device: cpu`` there, or ``auto`` on an actor without one, is an error
naming the policy). No GPU here: the plan's cluster is declared, not detected."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from mrl_llm.config import PolicyConfig, config_from_mapping, load_config
from mrl_llm.distributed.cluster import ClusterSpec, NodeSpec
from mrl_llm.distributed.ray_trainer import plan_run, ray_specs
from mrl_llm.models import resolve_device
from mrl_llm.worker import WorkerConfig, build
from shared_interfaces.config_io import ConfigError, from_mapping
from tests.llm.helpers import tiny

PRESETS = sorted((Path(__file__).resolve().parents[2] / "experiments" / "configs").glob("paper_*.yaml"))


def _config(device: str):
    return config_from_mapping({
        "steps": 1, "prompts_per_step": 2, "tensorboard": False, "progress": False, "runtime": {"backend": "ray"},
        "policies": [{"name": n, "model_config": tiny("llama"), "tokenizer_dir": "utf8-bytes", "device": device,
                      "group_size": 2, "sampling": {"max_new_tokens": 4}} for n in ("A", "B")],
    })


GPU_NODE = ClusterSpec("fake-1gpu", (NodeSpec(gpus=1, gpu_memory_gib=80.0, cpus=8, ram_gib=64.0),))


def test_device_defaults_to_auto_and_auto_resolves_to_what_torch_sees():
    assert PolicyConfig(name="a", model_dir="m").device == "auto"
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")


@pytest.mark.parametrize("path", PRESETS, ids=lambda p: p.name)
def test_paper_presets_use_device_auto(path, shared_dir):
    assert [p.device for p in load_config(path).policies] == ["auto", "auto"]


def test_device_cpu_on_a_gpu_bundle_is_an_error_naming_the_policy(tmp_path):
    cfg = _config("cpu")
    plan = plan_run(cfg, GPU_NODE)
    assert plan.for_policy("A").num_gpus > 0
    with pytest.raises(ConfigError, match="policy 'A' is planned on a GPU bundle but sets device: cpu"):
        ray_specs(cfg, plan, tmp_path)


def test_device_auto_on_a_gpu_bundle_needs_a_gpu_in_the_actor(tmp_path):
    cfg = _config("auto")
    specs = ray_specs(cfg, plan_run(cfg, GPU_NODE), tmp_path)
    assert all(s.config["gpu_bundle"] for s in specs)
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: auto resolves to it")
    with pytest.raises(ConfigError, match="policy 'A' is placed on a GPU bundle but its device 'auto' resolves to cpu"):
        build("A", specs[0].config, seed=0)


def test_a_cpu_plan_sets_no_gpu_bundle(tmp_path):
    cfg = _config("cpu")
    cpu = ClusterSpec("cpu", (NodeSpec(cpus=4, ram_gib=16.0),))
    specs = ray_specs(cfg, plan_run(cfg, cpu), tmp_path)
    assert not any(s.config.get("gpu_bundle") for s in specs)
    w = from_mapping(WorkerConfig, specs[0].config, where="worker A")
    assert replace(w, gpu_bundle=False) == w
