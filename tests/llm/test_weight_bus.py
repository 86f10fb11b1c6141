"""The weight bus (:mod:`mrl_llm.parallel.weight_bus`): the source's weights reach every rollout member exactly,
bucket by bucket (with float64 extra values when sent: the trainers' drift-probe log-probs), over its own gloo group (3 spawned processes); an empty model crosses as a header only; a
receiver with another model refuses naming both sizes; the buckets follow the size limit and the dtypes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from mrl_llm.parallel.group import GroupSpec, rendezvous
from mrl_llm.parallel.weight_bus import WeightBus, WeightBusError, buckets
from tests.llm.parallel_ranks import rank_done, rank_process, tiny_model


def bus_main(rank: int, spec: GroupSpec, out: str) -> None:
    """Bus member ``rank``: the source sends seed-0 weights (version 7; again in 10 KiB buckets, version 8), an empty
    state, then weights of another vocabulary; each receiver takes the first two into a seed-1 model in place, the
    empty one into nothing, and refuses the last."""
    rank_process()
    bus = WeightBus.join(spec.for_rank(rank))
    res: dict[str, Any] = {}
    if rank == 0:
        res["n"] = [bus.send(tiny_model(0).state_dict(), 7), bus.send(tiny_model(0).state_dict(), 8, bucket_mb=0.01),
                    bus.send({}, 9, extra=torch.tensor([0.5, -1.25, 3.0]))]
        res["n"].append(bus.send(tiny_model(0).state_dict(), 11, dtype=torch.bfloat16))  # in a bf16 engine's dtype
        try:
            bus.send(tiny_model(0, vocab=97).state_dict(), 10)
        except RuntimeError as err:  # a receiver refused: the bucket may not be taken
            res["last"] = str(err)
    else:
        got = []
        for kw in ({}, {"bucket_mb": 0.01}):
            model = tiny_model(1)
            version = bus.recv_into(model.state_dict(), **kw)  # into the model's own tensors
            got.append(({k: v.clone() for k, v in model.state_dict().items()}, version))
        got.append(({}, bus.recv_into({})))
        res["extra"] = bus.last_extra
        model, keep = tiny_model(1), {}
        res["bf16"] = (bus.recv_into(model.state_dict(), dtype=torch.bfloat16, keep=keep),
                       {k: v.clone() for k, v in model.state_dict().items()}, keep)
        res["got"] = got
        try:
            bus.recv_into(tiny_model(1).state_dict())
        except WeightBusError as err:
            res["refused"] = str(err)
    bus.close()
    torch.save(res, Path(out) / f"{rank}.pt")
    rank_done()


@pytest.fixture(scope="module")
def bus_results(tmp_path_factory):
    import torch.multiprocessing as mp

    out = tmp_path_factory.mktemp("bus")
    addr, port = rendezvous("127.0.0.1")
    spec = GroupSpec(rank=0, world_size=3, addr=addr, port=port, backend="gloo", timeout_s=20)
    mp.spawn(bus_main, args=(spec, str(out)), nprocs=3, join=True)
    return [torch.load(out / f"{r}.pt", weights_only=False) for r in range(3)]


def test_every_rollout_member_gets_the_source_weights_exactly(bus_results):
    want = tiny_model(0).state_dict()
    n_tensors = len(want)
    assert bus_results[0]["n"][0] == 2  # the header + one bucket: the whole tiny model fits 64 MiB
    assert bus_results[0]["n"][1] >= n_tensors // 2 + 1  # 10 KiB buckets: about one per tensor
    assert bus_results[0]["n"][2] == 2  # an empty model: the header and the extra values alone
    for r in (1, 2):
        (s1, v1), (s2, v2), (s3, v3) = bus_results[r]["got"]
        assert (v1, v2, v3) == (7, 8, 9) and s3 == {}
        assert bus_results[r]["extra"].dtype == torch.float64 and bus_results[r]["extra"].tolist() == [0.5, -1.25, 3.0]
        for s in (s1, s2):
            assert s.keys() == want.keys()
            assert all(torch.equal(s[k], want[k]) for k in want)
        assert max(float((tiny_model(1).state_dict()[k] - want[k]).abs().max()) for k in want) > 1e-3


def test_a_receiver_with_another_model_refuses_naming_both(bus_results):
    n = len(tiny_model(0).state_dict())
    other = sum(t.numel() for t in tiny_model(0, vocab=97).state_dict().values())
    mine = sum(t.numel() for t in tiny_model(1).state_dict().values())
    for r in (1, 2):
        assert bus_results[r]["refused"] == (f"the trainers sent {n} tensors of {other} elements, this rollout actor's "
                                             f"model has {n} of {mine}: trainers and rollout actors must build the "
                                             "same model")


def test_buckets_follow_the_limit_and_the_dtype():
    state = {"a": torch.zeros(256), "b": torch.zeros(256), "c": torch.zeros(1024), "d": torch.zeros(8, dtype=torch.int64),
             "e": torch.zeros(4)}
    assert buckets(state, 2 / 1024) == [["a", "b"], ["c"], ["d"], ["e"]]  # 2 KiB: a + b fit, c alone, dtype apart
    assert buckets(state, 64.0) == [["a", "b", "c"], ["d"], ["e"]]
    assert buckets({}, 1.0) == []
    with pytest.raises(ValueError, match="bucket_mb must be > 0"):
        buckets(state, 0)


def test_the_bus_refuses_a_lone_member_and_the_wrong_direction():
    with pytest.raises(ValueError, match="at least one rollout actor"):
        WeightBus.join(GroupSpec(rank=0, world_size=1))
    spec = GroupSpec(rank=1, world_size=2, port=1)
    with pytest.raises(RuntimeError, match="the source's"):
        WeightBus(spec, None, None).send({}, 0)  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="a rollout actor's"):
        WeightBus(spec.for_rank(0), None, None).recv_into({})  # type: ignore[arg-type]


def test_weights_cross_in_the_engines_dtype_and_land_as_the_masters_cast(bus_results):
    """``dtype=bf16`` (a bf16 vLLM engine's): the tensors arrive in bf16 (``keep``: what the engine loads as it is),
    equal to the fp32 masters cast; the receiver's fp32 copy holds that cast, upcast."""
    want = tiny_model(0).state_dict()
    for r in (1, 2):
        version, target, keep = bus_results[r]["bf16"]
        assert version == 11 and keep.keys() == want.keys()
        for k, v in want.items():
            assert keep[k].dtype == torch.bfloat16 and torch.equal(keep[k], v.to(torch.bfloat16)), k
            assert target[k].dtype == torch.float32 and torch.equal(target[k], v.to(torch.bfloat16).float()), k
    assert bus_results[0]["n"][3] == 2  # the header and one bucket (of half the fp32 bytes)
    assert buckets(want, 0.01, torch.bfloat16) != buckets(want, 0.01)  # bf16 sizes: fewer, larger buckets
