"""fetch_learner_rows with the learner's own records in hand (only the peers' are fetched) plans exactly as
with every record fetched from the exchange."""

from __future__ import annotations

import pytest

from mrl_llm.distributed.actors import fetch_learner_rows
from shared_interfaces.exchange import DiskLogExchange
from shared_interfaces.regimes import parse_regime
from tests.contract.cases import group


@pytest.mark.parametrize("regime", ["grpo", "xgrpo", "prp_snapshot", "prp_thl+sgt", "sgt+xgrpo"])
def test_own_records_in_hand_give_the_same_plans(tmp_path, regime):
    rewards = {"A": [[0, 0, 0], [1, 0, 1], [0, 0, 0]], "B": [[1, 0, 1], [0, 0, 0], [0, 0, 0]]}
    recs = {p: [r for k, rs in enumerate(rows) for r in group(p, f"q{k}", rs)] for p, rows in rewards.items()}
    ex = DiskLogExchange(tmp_path / "see.jsonl")
    ex.publish(recs["B"] + recs["A"])
    spec = parse_regime(regime)
    pids = ["q0", "q1", "q2"]
    for learner in ("A", "B"):
        fetched = fetch_learner_rows(ex, learner, spec, pids, 0, present=["A", "B"])
        in_hand = fetch_learner_rows(ex, learner, spec, pids, 0, present=["A", "B"], own=recs[learner])
        assert in_hand == fetched
    with pytest.raises(ValueError, match="another policy or step"):
        fetch_learner_rows(ex, "A", spec, pids, 0, present=["A", "B"], own=recs["B"])
