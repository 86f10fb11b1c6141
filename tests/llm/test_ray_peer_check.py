"""Peers' claims re-checked on the Ray runtime: a policy actor that publishes lying records (inverted
rewards, one reward of 2.0) has every one of them refused or quarantined by its peer, on receipt, and
counted in the peer's train results; the liar, learning from an honest peer, drops nothing."""

from __future__ import annotations

from dataclasses import replace

import pytest

from mrl_llm.contract import learner_tokenizer_dir
from mrl_llm.distributed.driver import RayDriver
from mrl_llm.trainer import actor_specs
from tests.llm.helpers import local_ray, problems
from tests.llm.test_ray import config, policy

pytestmark = [pytest.mark.ray, pytest.mark.slow]

PROBLEMS = problems(4, verifier="short8")


@pytest.fixture(scope="module")
def ray_llm():
    with local_ray("mrl-tests-peer-check", test_verifiers=True) as ray:
        yield ray


def test_a_lying_ray_actor_has_its_records_refused_and_counted(ray_llm, tmp_path):
    pols = [policy("a", "llama", "utf8-bytes", 4), policy("b", "qwen2", learner_tokenizer_dir(), 12)]
    cfg = config(pols, steps=2, eval={"enabled": False})
    specs = [replace(s, factory="tests.llm.liars:build") if s.name == "a" else s
             for s in actor_specs(cfg, tmp_path / "checkpoints")]
    batches = [PROBLEMS[:2], PROBLEMS[2:]]
    with RayDriver(specs, lambda s: batches[s], tmp_path) as drv:
        result = drv.run(2)
    rows = {(r["step"], r["policy"]): r for r in result.metrics}
    assert sorted(rows) == [(0, "a"), (0, "b"), (1, "a"), (1, "b")]
    for s in (0, 1):
        b = rows[(s, "b")]
        # 2 prompts x 2 samples from 'a': one claims 2.0 (refused), three claim the opposite of their verdict
        assert (b["peer_reward_refused"], b["peer_verdict_rejected"]) == (1, 3)
        assert b["metrics"]["peer_rows"] == 0 and b["metrics"]["sgt_activations"] == 0
        a = rows[(s, "a")]
        assert (a["peer_reward_refused"], a["peer_verdict_rejected"]) == (0, 0)
        assert a["metrics"]["peer_rows"] > 0  # the honest peer's records are used
