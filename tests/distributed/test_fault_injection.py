"""Fault injection's inputs (no Ray): a :class:`FaultInjection` is checked when it is made, a policy's spec
refuses a fault naming a rank it does not have, and the Ray trainer refuses faults for policies the config
does not have."""

from __future__ import annotations

from pathlib import Path

import pytest

from mrl_llm.config import config_from_mapping
from mrl_llm.distributed.actors import FaultInjection, PolicyActorSpec
from mrl_llm.distributed.cluster import ClusterSpec, NodeSpec
from mrl_llm.distributed.ray_trainer import plan_run, ray_specs
from shared_interfaces.config_io import ConfigError
from tests.llm.helpers import tiny


def test_a_fault_defaults_to_rank_0_in_train_and_refuses_malformed_fields():
    f = FaultInjection(step=3)
    assert (f.step, f.phase, f.rank) == (3, "train", 0)
    assert FaultInjection(step=0, phase="generate", rank=1).rank == 1
    with pytest.raises(ValueError, match="step must be an integer >= 0, got -1"):
        FaultInjection(step=-1)
    with pytest.raises(ValueError, match="step must be an integer"):
        FaultInjection(step="2")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"phase must be one of \['generate', 'train'\], got 'update'"):
        FaultInjection(step=1, phase="update")
    with pytest.raises(ValueError, match="rank must be an integer >= 0, got -1"):
        FaultInjection(step=1, rank=-1)
    with pytest.raises(ValueError, match="rank must be an integer >= 0, got True"):
        FaultInjection(step=1, rank=True)  # type: ignore[arg-type]


def _spec(**kw) -> PolicyActorSpec:
    return PolicyActorSpec(name="b", factory="tests.distributed.toy_worker:build", config={}, seed=1,
                           regime={"name": "grpo"}, checkpoint_dir="unused", **kw)


def test_a_spec_refuses_a_fault_on_a_rank_it_does_not_have():
    assert _spec(fault=FaultInjection(step=1, rank=1), ranks=2).fault.rank == 1
    assert _spec(fault=None, ranks=2).fault is None  # no fault: nothing to check
    with pytest.raises(ValueError, match=r"policy 'b': the fault injection names rank 2, but the policy has 2 rank\(s\) \(0\.\.1\)"):
        _spec(fault=FaultInjection(step=1, rank=2), ranks=2)
    with pytest.raises(ValueError, match=r"names rank 1, but the policy has 1 rank"):
        _spec(fault=FaultInjection(step=1, rank=1))


def _config():
    return config_from_mapping({
        "policies": [{"name": "a", "model_config": tiny("llama", vocab_size=300), "tokenizer_dir": "utf8-bytes"},
                     {"name": "b", "model_config": tiny("qwen2", vocab_size=300), "tokenizer_dir": "utf8-bytes",
                      "ranks": 2}],
        "runtime": {"backend": "ray"},
    })


def test_ray_specs_take_faults_on_the_configs_policies_and_ranks_only(tmp_path: Path):
    c = _config()
    plan = plan_run(c, ClusterSpec("2cpu", (NodeSpec(cpus=2, ram_gib=24),)))
    specs = {s.name: s for s in ray_specs(c, plan, tmp_path, {"b": FaultInjection(step=2, rank=1)})}
    assert specs["b"].ranks == 2 and specs["b"].fault == FaultInjection(step=2, rank=1) and specs["a"].fault is None
    assert all(s.fault is None for s in ray_specs(c, plan, tmp_path, {}))  # empty: no fault anywhere
    with pytest.raises(ConfigError, match=r"fault injection for \['z'\], which the config has no policies of; "
                                          r"name one of \['a', 'b'\]"):
        ray_specs(c, plan, tmp_path, {"z": FaultInjection(step=1)})
    with pytest.raises(ValueError, match="policy 'b': the fault injection names rank 2, but the policy has 2"):
        ray_specs(c, plan, tmp_path, {"b": FaultInjection(step=1, rank=2)})
    with pytest.raises(ValueError, match="policy 'a': the fault injection names rank 1, but the policy has 1"):
        ray_specs(c, plan, tmp_path, {"a": FaultInjection(step=1, rank=1)})
