"""A worker group that fails on every step stops the run after ``runtime.max_restarts`` restarts (issue 38 item 3),
on a real local Ray cluster: policy B's 2 toy ranks, rank 1 of which dies in every ``train``; with
``max_restarts: 1`` B's group restarts once, fails again, and the run stops with one line naming the policy, the
step and the cause — it does not restart the group into the next step forever."""

from __future__ import annotations

import os
from typing import Any

import pytest

from mrl_llm.distributed.actors import PolicyActorSpec
from mrl_llm.distributed.driver import RayDriver, RestartLimit
from mrl_llm.distributed.rank_group import RankGroup
from tests.distributed.toy_group_worker import ToyGroupWorker

pytestmark = [pytest.mark.ray, pytest.mark.slow]


class AlwaysDyingRank(ToyGroupWorker):
    """Rank 1 exits (a hard crash) in every training step; rank 0 is left in the gradient all-reduce."""

    def train_step(self, rows: Any) -> dict[str, float]:
        if self.group.rank == 1:
            os._exit(17)
        return super().train_step(rows)


def build(name: str, config: dict[str, Any], seed: int) -> AlwaysDyingRank:
    return AlwaysDyingRank(name, config, seed)


def test_a_group_that_always_fails_stops_after_max_restarts(ray_local, tmp_path) -> None:
    spec = PolicyActorSpec(name="B", factory="tests.distributed.test_driver_restart_limit:build",
                           config={"good_on": 1, "n_prompts": 8}, seed=3, regime={"name": "grpo"},
                           checkpoint_dir=str(tmp_path / "ckpt" / "B"), ranks=2)
    with RayDriver([spec], lambda s: [f"p{i}" for i in range(4)], tmp_path, max_restarts=1) as drv:
        with pytest.raises(RestartLimit) as err:
            drv.run(6)
        group = drv.actors["B"]
        assert isinstance(group, RankGroup) and group.restarts == 1
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith("policy 'B' failed at step 1 (train: RankGroupDied: policy 'B': rank ")
    assert "after 1 restart(s) without finishing a step (runtime.max_restarts: 1)" in msg
    assert [(e["event"], e["step"]) for e in drv.result.events] == [("join", 0), ("gap", 0), ("rejoin", 1),
                                                                    ("gap", 1)]
