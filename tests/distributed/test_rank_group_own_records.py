"""A worker group's own records (:meth:`mrl_llm.distributed.actors.PolicyActor.generate`): the ranks all-gather the
records they sampled, so each trains on its policy's records in hand as a single rank does — it fetches only the
peers' records, and its peer-claim check sees only theirs (a real local Ray cluster, 2 CPUs, toy workers of 2 gloo
ranks, :mod:`tests.distributed.toy_group_worker`), whether the ranks split the prompts (``sampling.seeding:
sample``) or rank 0 samples them all."""

from __future__ import annotations

import pytest

from mrl_llm.distributed.actors import PolicyActorSpec
from mrl_llm.distributed.driver import RayDriver
from tests.distributed.test_driver_rank_restart import FACTORY, problems

pytestmark = pytest.mark.ray

STEPS = 3


def _spec(name: str, tmp, *, good_on: int, ranks: int, seeding: str) -> PolicyActorSpec:
    return PolicyActorSpec(name=name, factory=FACTORY, seed=3, regime={"name": "prp_thl+sgt"},
                           config={"good_on": good_on, "n_prompts": 8, "policy": {"sampling": {"seeding": seeding}}},
                           checkpoint_dir=str(tmp / "ckpt" / name), checkpoint_every=0, ranks=ranks)


@pytest.mark.parametrize("seeding", ["sample", "call"])
def test_a_groups_ranks_check_only_the_peers_records_as_one_rank_does(ray_local, tmp_path, seeding) -> None:
    specs = [_spec("A", tmp_path, good_on=0, ranks=1, seeding=seeding),
             _spec("B", tmp_path, good_on=1, ranks=2, seeding=seeding)]
    with RayDriver(specs, problems, tmp_path, mode="sync") as drv:
        res = drv.run(STEPS)
    rows = {(m["step"], m["policy"]): m for m in res.metrics}
    assert sorted(rows) == sorted((s, p) for s in range(STEPS) for p in "AB")
    per_step = len(problems(0)) * 4  # 4 prompts a step, group_size 4
    for s in range(STEPS):
        a, b = rows[(s, "A")]["metrics"], rows[(s, "B")]["metrics"]
        assert (a.get("checked_B"), a.get("checked_A")) == (per_step, None)  # the single rank: its peer's records only
        assert (b.get("checked_A"), b.get("checked_B")) == (per_step, None)  # the group's rank 0 likewise
        assert a["rows"] >= 2 * per_step and b["rows"] >= 2 * per_step  # PRP: every own and peer record a row
