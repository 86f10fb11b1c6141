"""MWRA's simple planner and typed config loading."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from shared_interfaces.config_io import ConfigError, from_mapping, load_yaml, to_mapping
from shared_interfaces.mwra import AllocationError, PolicySpec, Resources, plan_proportional


def specs():
    return [PolicySpec("big", 3_000_000_000, "qwen", 64, 1024), PolicySpec("small", 1_000_000_000, "llama", 64, 1024)]


def test_split_pools_proportional_with_minimum_one():
    plan = plan_proportional(specs(), Resources(n_gpus=8, n_cpus=64))
    assert plan.mode == "split"
    assert [a.gpus for a in plan.allocations] == [6.0, 2.0]
    assert sum(a.cpus for a in plan.allocations) == 64
    assert plan.for_policy("small").share == pytest.approx(0.25)
    with pytest.raises(KeyError, match="no allocation"):
        plan.for_policy("nope")


def test_colocated_fractional_gpus_and_cpu_mode():
    plan = plan_proportional(specs(), Resources(n_gpus=1, n_cpus=16))
    assert plan.mode == "colocated"
    assert [a.gpus for a in plan.allocations] == pytest.approx([0.75, 0.25])
    cpu = plan_proportional(specs(), Resources(n_gpus=0, n_cpus=2))
    assert cpu.mode == "cpu" and [a.cpus for a in cpu.allocations] == [1, 1]
    with pytest.raises(AllocationError, match="at least 3 CPUs"):
        plan_proportional(specs() + [PolicySpec("c", 10, "t", 1, 1)], Resources(n_cpus=2))
    with pytest.raises(AllocationError, match="unique"):
        plan_proportional(specs() + specs(), Resources(n_cpus=8))


@dataclass(frozen=True)
class Inner:
    lr: float = 1e-3
    name: str = "x"


@dataclass(frozen=True)
class Outer:
    inner: Inner = field(default_factory=Inner)
    layers: tuple[int, ...] = (1, 2)
    opt: int | None = None
    steps: int = 1


def test_from_mapping_nested_and_errors(tmp_path):
    cfg = from_mapping(Outer, {"inner": {"lr": 1}, "layers": [3, 4], "opt": None})
    assert cfg == Outer(Inner(1.0), (3, 4), None)
    assert to_mapping(cfg) == {"inner": {"lr": 1.0, "name": "x"}, "layers": [3, 4], "opt": None, "steps": 1}
    with pytest.raises(ConfigError, match=r"config.inner: unknown key\(s\) \['lrr'\]"):
        from_mapping(Outer, {"inner": {"lrr": 1}})
    with pytest.raises(ConfigError, match="config.steps: expected an integer"):
        from_mapping(Outer, {"steps": "3"})
    with pytest.raises(ConfigError, match="expected a list"):
        from_mapping(Outer, {"layers": 3})
    p = tmp_path / "c.yaml"
    p.write_text("inner: {lr: 0.5}\nsteps: !!python/object/apply:os.system ['echo pwned']\n")
    with pytest.raises(Exception, match="(?i)constructor|could not determine"):
        load_yaml(p)
    with pytest.raises(ConfigError, match="does not exist"):
        load_yaml(tmp_path / "missing.yaml")
