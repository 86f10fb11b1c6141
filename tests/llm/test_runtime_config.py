"""The ``runtime:`` section and its command-line overrides, per-policy membership, and what the Ray
runtime derives from the MWRA plan (threads, checkpoints, a vllm engine's memory settings) — no Ray."""

from __future__ import annotations

from pathlib import Path

import pytest

from mrl_llm.cli import _with_runtime, build_parser
from mrl_llm.config import config_from_mapping
from mrl_llm.distributed.cluster import ClusterSpec, NodeSpec
from mrl_llm.distributed.ray_trainer import plan_run, ray_specs
from shared_interfaces.config_io import ConfigError
from tests.llm.helpers import tiny


def cfg(runtime=None, **pol_extra):
    return config_from_mapping({
        "policies": [{"name": "a", "model_config": tiny("llama", vocab_size=300), "tokenizer_dir": "utf8-bytes",
                      **pol_extra},
                     {"name": "b", "model_config": tiny("qwen2", vocab_size=300), "tokenizer_dir": "utf8-bytes"}],
        **({"runtime": runtime} if runtime is not None else {}),
    })


def test_runtime_section_defaults_and_validation():
    rt = cfg().runtime
    assert (rt.backend, rt.mode, rt.max_staleness, rt.address) == ("local", "sync", 0, None)
    assert cfg({"backend": "ray", "mode": "async", "max_staleness": 2}).runtime.max_staleness == 2
    with pytest.raises(ConfigError, match="max_staleness must be 0 with mode sync"):
        cfg({"backend": "ray", "max_staleness": 1})
    with pytest.raises(ConfigError, match="runtime.*unknown|unknown.*bogus|bogus"):
        cfg({"backend": "ray", "bogus": 1})
    assert rt.weight_transfer == "auto"
    assert cfg({"backend": "ray", "weight_transfer": "collective"}).runtime.weight_transfer == "collective"
    with pytest.raises(ConfigError, match=r"runtime.weight_transfer: 'nccl' is not one of"):
        cfg({"backend": "ray", "weight_transfer": "nccl"})
    with pytest.raises(ConfigError, match="join_step/leave_step .*, which only the Ray runtime"):
        cfg(join_step=1)
    with pytest.raises(ConfigError, match="join_step < leave_step"):
        cfg({"backend": "ray"}, join_step=2, leave_step=2)


def test_command_line_overrides():
    p = build_parser()

    def over(*argv):
        return _with_runtime(cfg(), p.parse_args(["train", "--config", "x", "--out", "y", *argv]))

    c = over("--runtime", "ray", "--mode", "async", "--leave", "b=3", "--join", "a=1")
    assert (c.runtime.backend, c.runtime.mode, c.runtime.max_staleness) == ("ray", "async", 1)
    assert (c.policy("a").join_step, c.policy("b").leave_step) == (1, 3)
    assert over("--runtime", "ray", "--mode", "async", "--max-staleness", "0").runtime.max_staleness == 0
    with pytest.raises(ValueError, match="expected NAME=STEP"):
        over("--runtime", "ray", "--leave", "b")
    with pytest.raises(KeyError, match="no policy 'z'"):
        over("--runtime", "ray", "--leave", "z=2")
    with pytest.raises(ConfigError, match="only the Ray runtime"):
        over("--leave", "b=2")


def test_ray_specs_follow_the_plan(tmp_path: Path):
    c = cfg({"backend": "ray"})
    plan = plan_run(c, ClusterSpec("2cpu", (NodeSpec(cpus=2, ram_gib=24),)))
    specs = ray_specs(c, plan, tmp_path)
    assert [s.threads for s in specs] == [1, 1] and all(s.checkpoint_every == 1 for s in specs)
    assert all("engine_args" not in s.config or not s.config["engine_args"] for s in specs)


def test_ray_specs_refuse_fsdp2_ranks_on_a_torch_without_fsdp2s_methods(tmp_path: Path, monkeypatch):
    """On torch 2.6 / 2.7 a sharded worker group is a ConfigError naming the policy before any rank starts
    (not Ray's wrapper of the ranks' creation error); one rank and whole replicas need no FSDP2."""
    from torch.distributed.fsdp import FSDPModule

    cpu = ClusterSpec("2cpu", (NodeSpec(cpus=2, ram_gib=24),))
    c = cfg({"backend": "ray"}, ranks=2)
    assert [s.ranks for s in ray_specs(c, plan_run(c, cpu), tmp_path)] == [2, 1]
    monkeypatch.delattr(FSDPModule, "set_gradient_divide_factor")
    with pytest.raises(ConfigError, match=r"policy 'a' \(ranks: 2\): FSDP2 worker groups need torch >= 2.8 .*"
                                          r"FSDPModule.set_gradient_divide_factor"):
        ray_specs(c, plan_run(c, cpu), tmp_path)
    for ok in (cfg({"backend": "ray"}), cfg({"backend": "ray"}, ranks=2, train={"fsdp_unit": "none"})):
        assert len(ray_specs(ok, plan_run(ok, cpu), tmp_path)) == 2


def test_vllm_policies_sharing_a_gpu_get_their_planned_memory(tmp_path: Path):
    d = cfg({"backend": "ray"}).to_dict()
    c = config_from_mapping({**d, "policies": [{**p, "engine": "vllm"} for p in d["policies"]]})
    plan = plan_run(c, ClusterSpec("1gpu", (NodeSpec(gpus=1, gpu_memory_gib=80, cpus=4, ram_gib=64),)))
    assert plan.mode == "colocated"
    args = [s.config["engine_args"] for s in ray_specs(c, plan, tmp_path)]
    assert sum(a["gpu_memory_utilization"] for a in args) <= 0.9
    assert all(a["max_model_len"] == 1024 + 256 and a["kv_cache_memory_bytes"] > 0 for a in args)
    # split pools plan vllm policies too (their engines run in the rollout actors only): one rollout GPU and one
    # trainer GPU each, the engine's memory settings for its rollout GPU
    cs = config_from_mapping({**c.to_dict(), "runtime": {"backend": "ray", "placement": "split"}})
    split = plan_run(cs, ClusterSpec("4gpu", (NodeSpec(gpus=4, gpu_memory_gib=80, cpus=8, ram_gib=64),)))
    assert split.mode == "split" and all(p.bundle_roles == ("rollout", "train") for p in split.policies)
    specs = ray_specs(cs, split, tmp_path)
    assert all(s.ranks == 1 and 0 < s.config["engine_args"]["gpu_memory_utilization"] <= 0.9 for s in specs)
