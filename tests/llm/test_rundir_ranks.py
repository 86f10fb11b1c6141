"""``policies[].ranks``, ``policies[].train.fsdp_unit`` and ``.grad_sync`` may change on resume (a checkpoint holds full weights
and the gathered optimizer state); every other policy key may not, and a malformed saved config is still refused."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from mrl_llm.rundir import check_run_dir
from shared_interfaces.config_io import ConfigError, to_mapping
from tests.llm.test_ray import config, policy


def _cfg(ranks: int, group_size: int = 2, unit: str = "layer", lr: float | None = None, sync: str = "micro_batch"):
    pol = {**policy("a", "llama", "utf8-bytes", 4), "ranks": ranks, "group_size": group_size}
    pol["train"] = {**pol.get("train", {}), "fsdp_unit": unit, "grad_sync": sync, **({"lr": lr} if lr is not None else {})}
    return config([pol])


def test_ranks_may_change_on_resume_other_policy_keys_may_not(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(to_mapping(_cfg(2))))
    check_run_dir(_cfg(1), tmp_path, resume=True)  # k = 2 -> k = 1
    check_run_dir(replace(_cfg(3), steps=7), tmp_path, resume=True)
    check_run_dir(_cfg(2, unit="none"), tmp_path, resume=True)  # FSDP2 shards -> whole replicas
    check_run_dir(_cfg(1, unit="model"), tmp_path, resume=True)
    check_run_dir(_cfg(2, sync="mini_batch"), tmp_path, resume=True)  # when the gradients are reduce-scattered
    for other in (_cfg(1, group_size=4), _cfg(2, lr=0.5)):  # a policy key, a train key beside fsdp_unit
        with pytest.raises(ConfigError, match=r"differs from the run's in \['policies'\].*policies\[\]\.ranks, "
                                              r"policies\[\]\.train\.fsdp_unit, policies\[\]\.train\.grad_sync may change"):
            check_run_dir(other, tmp_path, resume=True)
    (tmp_path / "config.json").write_text(json.dumps({"policies": "not a list"}))
    with pytest.raises(ConfigError, match="differs from the run's in"):
        check_run_dir(_cfg(1), tmp_path, resume=True)
    (tmp_path / "config.json").write_text("[]")
    with pytest.raises(ConfigError, match="not a run config"):
        check_run_dir(_cfg(1), tmp_path, resume=True)
