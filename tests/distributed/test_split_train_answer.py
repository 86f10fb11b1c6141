"""A split policy's ``train`` call (:mod:`mrl_llm.distributed.split_group`) on a real local Ray cluster, with small
actors instead of policy workers: the answer is the trainers' once every rollout actor has loaded the weights,
with the loads' time and drift checks folded in; a load that fails (a vllm engine's drift check above its
threshold) fails the call with its own error, as a colocated actor's failed check fails its step."""

from __future__ import annotations

import pytest

from mrl_llm.distributed.rank_group import RankGroup
from mrl_llm.distributed.split_group import SplitGroup

pytestmark = pytest.mark.ray


class DriftTooLarge(RuntimeError):
    pass


class Trainer:
    def train(self, step: int) -> dict:
        return {"step": step, "metrics": {"loss": 0.5, "sync_s": 0.0}}

    def weights(self) -> dict:
        return {"state": {}, "version": 1}


class Rollout:
    def __init__(self, drift: float) -> None:
        self.drift = drift

    def load_weights(self, payload: dict) -> dict:
        if self.drift > 1e-3:
            raise DriftTooLarge(f"drift {self.drift} above the threshold 0.001")
        return {"version": payload["version"], "metrics": {"sync_s": 0.5, "drift_mean_abs": self.drift}}


def _group(ray, drifts):
    def start():
        trainer = ray.remote(Trainer).options(num_cpus=0).remote()
        return RankGroup([trainer], policy="A"), [ray.remote(Rollout).options(num_cpus=0).remote(d) for d in drifts]

    return SplitGroup(start, policy="A")


def test_the_train_answer_waits_for_the_loads_and_a_failed_drift_check_fails_it(ray_local):
    ray = ray_local
    got = ray.get(_group(ray, [1e-4, 3e-4]).train.remote(3))
    assert got == {"step": 3, "metrics": {"loss": 0.5, "sync_s": 0.5, "drift_mean_abs": 3e-4}}
    g = _group(ray, [1e-4, 0.5])
    with pytest.raises(DriftTooLarge, match="drift 0.5 above the threshold"):
        ray.get(g.train.remote(3))
    assert not g.failed()  # the call's own error, not a dead actor: no restart
