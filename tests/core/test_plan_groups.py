"""plan_groups: a step's groups planned at once give the rows of one call per group, end to end."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from shared_interfaces.records import PromptGroup
from shared_interfaces.regimes import parse_regime
from shared_interfaces.regimes.plan import plan_groups
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


def _table(rows) -> list[tuple]:
    """Each row's record id, prompt and roles (what the loss sees), in order."""
    return list(zip([r.record_id for r in rows.row_records()], rows.prompt.tolist(), rows.advantages.tolist(),
                    rows.pg_mask.tolist(), rows.sample_weight.tolist(), rows.sgt_mask.tolist(),
                    rows.own_mask.tolist(), rows.use_mu.tolist(), strict=True))


@settings(max_examples=60)
@given(prompts=st.lists(prompt, min_size=1, max_size=6), regime=st.sampled_from(REGIMES),
       selection=st.sampled_from(["shortest", "first", "random"]), learner=st.sampled_from(PIDS))
def test_batched_rows_equal_per_group_rows(prompts, regime, selection, learner):
    spec = parse_regime(regime, {"sgt": {"selection": selection}} if "sgt" in regime else None)
    groups = _groups(prompts)  # groups of different [P, G] shapes, some empty, go through together
    batched = plan_groups(groups, PIDS, spec, learner=learner, rng=lambda: np.random.default_rng(7))
    single = [plan_groups([g], PIDS, spec, learner=learner, rng=lambda: np.random.default_rng(7)) for g in groups]
    assert _table(batched) == [(rid, k, *rest) for k, one in enumerate(single) for rid, _, *rest in _table(one)]
    assert torch.equal(batched.sgt_gate, torch.cat([one.sgt_gate for one in single]))


def test_an_unknown_policy_in_a_group_is_an_error():
    g = PromptGroup(prompt_id="p", step=0, records=(rec("Z", "p", 0, 1.0),))
    with pytest.raises(ValueError, match="unknown policies"):
        plan_groups([g], ("A", "B"), parse_regime("grpo"), learner="A")
