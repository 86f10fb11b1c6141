"""plan_prompt_groups: a step's groups planned at once equal one plan_prompt_group call per group."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared_interfaces.records import PromptGroup
from shared_interfaces.regimes import parse_regime
from shared_interfaces.regimes.plan import plan_prompt_group, plan_prompt_groups
from tests.contract.cases import group, rec

REGIMES = ["grpo", "xgrpo", "prp_snapshot", "prp_thl", "sgt", "sgt+xgrpo", "prp_thl+sgt"]
PIDS = ("A", "B", "C")


def _groups(rewards_per_prompt: list[dict[str, list[float]]]) -> list[PromptGroup]:
    out = []
    for k, by_policy in enumerate(rewards_per_prompt):
        recs = [r for p, rs in by_policy.items() for r in group(p, f"p{k}", rs)]
        out.append(PromptGroup(prompt_id=f"p{k}", step=0, records=tuple(recs)))
    return out


rewards = st.lists(st.sampled_from([0.0, 1.0]), min_size=0, max_size=4)
prompt = st.fixed_dictionaries({p: rewards for p in PIDS})


@settings(max_examples=60)
@given(prompts=st.lists(prompt, min_size=1, max_size=6), regime=st.sampled_from(REGIMES),
       selection=st.sampled_from(["shortest", "first", "random"]))
def test_batched_plans_equal_per_group_plans(prompts, regime, selection):
    spec = parse_regime(regime, {"sgt": {"selection": selection}} if "sgt" in regime else None)
    groups = _groups(prompts)  # groups of different [P, G] shapes, some empty, go through together
    batched = plan_prompt_groups(groups, PIDS, spec, rng=lambda: np.random.default_rng(7))
    single = [plan_prompt_group(g, PIDS, spec, rng=np.random.default_rng(7)) for g in groups]
    assert batched == single


def test_learners_restricts_the_result_and_keeps_the_order():
    groups = _groups([{"A": [0, 0], "B": [1, 0]}, {"A": [1, 1], "B": [0, 1]}])
    spec = parse_regime("prp_thl+sgt")
    out = plan_prompt_groups(groups, ("A", "B"), spec, learners=["B"])
    assert [list(p) for p in out] == [["B"], ["B"]]
    assert [p["B"].prompt_id for p in out] == ["p0", "p1"]
    assert out == [{"B": plan_prompt_group(g, ("A", "B"), spec)["B"]} for g in groups]


def test_an_unknown_policy_in_a_group_is_an_error():
    g = PromptGroup(prompt_id="p", step=0, records=(rec("Z", "p", 0, 1.0),))
    with pytest.raises(ValueError, match="unknown policies"):
        plan_prompt_groups([g], ("A", "B"), parse_regime("grpo"))
