"""Every backend hands its optimizer the core's decisions for the same raw records.

Backends plug in through ``run_contract_case(case) -> ContractOutput`` in their ``contract`` module.
"""

from __future__ import annotations

import importlib
import math

import pytest

from shared_interfaces.contract import ContractOutput, reference_output
from tests.contract.cases import all_cases

BACKENDS = {
    "core": "shared_interfaces.contract:reference_output",
    "bandit": "bandit_sim.contract:run_contract_case",
    "llm": "mrl_llm.contract:run_contract_case",
}


def _load(spec: str):
    """Every backend is part of the package: one that does not import fails its cases (never a skip)."""
    module, func = spec.split(":")
    return getattr(importlib.import_module(module), func)


def assert_same(got: ContractOutput, want: ContractOutput) -> None:
    assert set(got) == set(want), "learners differ"
    for learner, w in want.items():
        g = got[learner]
        assert set(g.advantages) == set(w.advantages), f"{learner}: policy-gradient rows differ"
        for rid, a in w.advantages.items():
            assert math.isclose(g.advantages[rid], a, rel_tol=1e-9, abs_tol=1e-12), (learner, rid)
            assert math.isclose(g.weights[rid], w.weights[rid], rel_tol=1e-9), (learner, rid, "weight")
        assert g.snapshot_coef == w.snapshot_coef, f"{learner}: snapshot coefficients differ"
        assert g.sgt_targets == w.sgt_targets, f"{learner}: SGT targets differ"
        assert g.sgt_gates == w.sgt_gates, f"{learner}: SGT gates differ"
        assert g.sgt_pools == w.sgt_pools, f"{learner}: SGT normalisation pools differ"


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize("case", all_cases(), ids=lambda c: c.name)
def test_backend_matches_core(backend, case):
    run = _load(BACKENDS[backend])
    assert_same(run(case), reference_output(case))


def test_reference_is_not_trivial():
    """The cases exercise every decision: nonzero advantages, peer rows, SGT targets and closed gates."""
    outs = [reference_output(c) for c in all_cases()]
    assert any(a != 0 for o in outs for d in o.values() for a in d.advantages.values())
    assert any(d.snapshot_coef for o in outs for d in o.values())
    assert any(d.sgt_targets for o in outs for d in o.values())
    assert any(not g for o in outs for d in o.values() for g in d.sgt_gates.values())
    assert any(len(d.sgt_pools) >= 2 for o in outs for d in o.values())  # prompt-normalised SGT, two rescues
