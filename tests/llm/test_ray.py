"""The LLM policy worker runs unchanged under the Ray driver: a synchronous Ray run of two tiny policies
ends with bit-identical weights and the same step metrics as the in-process loop over the same actors."""

from __future__ import annotations

from dataclasses import replace

import pytest

from mrl_llm.config import config_from_mapping
from mrl_llm.contract import learner_tokenizer_dir
from mrl_llm.distributed.driver import RayDriver, run_local
from mrl_llm.trainer import actor_specs
from tests.distributed.conftest import ray_local  # noqa: F401 - the local Ray cluster fixture
from tests.llm.helpers import problems, tiny

pytestmark = [pytest.mark.ray, pytest.mark.slow]

PROBLEMS = problems(4, verifier="short8")
FACTORY = "tests.llm.helpers:build_with_short_verifier"
TIMING = ("thl_s", "update_s", "sync_s")


def batches(step: int):
    return [PROBLEMS[(2 * step + i) % len(PROBLEMS)] for i in range(2)]


def test_llm_worker_under_ray_equals_in_process(ray_local, tmp_path):  # noqa: F811
    cfg = config_from_mapping({
        "seed": 5, "steps": 2, "prompts_per_step": 2, "regime": {"name": "prp_thl+sgt"}, "threads": 1,
        "policies": [
            {"name": "a", "model_config": tiny("llama"), "tokenizer_dir": "utf8-bytes", "group_size": 2,
             "sampling": {"max_new_tokens": 4}, "train": {"lr": 1e-3}},
            {"name": "b", "model_config": tiny("qwen2"), "tokenizer_dir": learner_tokenizer_dir(), "group_size": 2,
             "sampling": {"max_new_tokens": 16}, "train": {"lr": 1e-3}},
        ],
    })
    def specs(d):
        return [replace(s, factory=FACTORY) for s in actor_specs(cfg, d)]

    local, local_state = run_local(specs(tmp_path / "local"), batches, 2)
    with RayDriver(specs(tmp_path / "ray" / "ckpt"), batches, tmp_path / "ray") as drv:
        res = drv.run(2)
        state = drv.states()
    assert {n: s["weights_sha256"] for n, s in state.items()} == {n: s["weights_sha256"] for n, s in local_state.items()}

    def rows(metrics):
        return {(m["step"], m["policy"]): {k: v for k, v in m["metrics"].items() if k not in TIMING} for m in metrics}

    assert rows(res.metrics) == rows(local.metrics)
    assert all(m["metrics"]["peer_rows"] == 4 for m in res.metrics)
    got = {(m["step"], m["policy"]): m["metrics"] for m in res.metrics}
    assert all(got[(s, "a")]["reward_mean"] == 1.0 for s in (0, 1))  # short texts: a always succeeds
    assert got[(0, "b")]["reward_mean"] < 0.5 and sum(got[(s, "b")]["sgt_activations"] for s in (0, 1)) >= 1
    assert local_state["b"]["version"] == 2 and all(v["grad_norm"] > 0 for k, v in got.items() if k[1] == "b")
