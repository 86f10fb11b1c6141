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



def test_cpus_are_never_over_allocated_and_bad_resources_are_refused():
    # GPU modes split the CPUs too, one each at least: fewer CPUs than policies is an error, not 2 CPUs of 1
    for n_gpus in (0, 1, 2, 8):
        with pytest.raises(AllocationError, match="2 policies need at least 2 CPUs .*add CPUs"):
            plan_proportional(specs(), Resources(n_gpus=n_gpus, n_cpus=1))
        plan = plan_proportional(specs(), Resources(n_gpus=n_gpus, n_cpus=3))
        assert sum(a.cpus for a in plan.allocations) == 3 and min(a.cpus for a in plan.allocations) >= 1
    for bad in (dict(n_gpus=-1), dict(n_gpus=2.5), dict(n_cpus=0), dict(n_cpus=True), dict(ram_gib=float("nan")),
                dict(gpu_memory_gib=-1.0), dict(gpu_memory_gib=float("inf"))):
        with pytest.raises(AllocationError, match=f"resources: {next(iter(bad))} must be"):
            Resources(**bad)
    for bad in (dict(n_params=float("nan")), dict(n_params=1.5e9), dict(rollouts_per_step=2.0)):
        with pytest.raises(AllocationError, match=f"{next(iter(bad))} must be an integer"):
            PolicySpec(**(dict(name="p", n_params=10, tokenizer_id="t", rollouts_per_step=1, max_response_len=1) | bad))
    with pytest.raises(AllocationError, match="dtype must be fp32, bf16 or fp16, got 'int8'"):
        PolicySpec("p", 10, "t", 1, 1, dtype="int8")  # type: ignore[arg-type]


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
