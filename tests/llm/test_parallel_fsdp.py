"""Worker groups (:mod:`mrl_llm.parallel`): a policy's update on 2 FSDP2 ranks (gloo, two processes) equals
the one-process update — gradients and weights to 1e-6 in fp32, with fillers (ranks with fewer micro-batches),
several mini-batches (the snapshot pass), token-budget micro-batches, the reference model sharded too and
grad-norm clipping over the shards, the LM head in log-prob chunks (the root's registered forward method);
``dtype: bf16`` keeps fp32 master weights and fp32 optimizer state; ``grad_sync: mini_batch`` (units kept gathered
through a mini-batch, its gradients reduce-scattered once: fewer collectives, counted) and gradient checkpointing
alike."""

from __future__ import annotations

import pytest
import torch

from mrl_llm.parallel.fsdp import chunk_rows, decoder_layers, gather_into, shard_model
from mrl_llm.parallel.group import GroupSpec, WorkerGroup, backend_for, rendezvous
from mrl_llm.precision import Precision
from tests.llm.parallel_ranks import run_close, run_gather, run_group, tiny_model, update_once

VARIANTS = [
    {},  # one mini-batch, micro-batches of 2 rows (9 rows: 3 micro-batches on one rank, 2 + a filler on the other)
    {"steps": 2, "micro_batch": 2, "grad_accum": 2, "max_tokens": 40},  # 3 mini-batches a step, token budget
    {"dtype": "bf16"},
    {"logprob_chunk": 5},  # the LM head in chunks of 5 response positions (the root's registered forward method)
    {"nan_rank": 1},  # a non-finite loss on rank 1 only (rank 0's are finite)
    {"steps": 2, "micro_batch": 2, "grad_accum": 2, "max_tokens": 40, "unit": "model"},  # variant 1, one FSDP unit
    {"arch": "gpt2"},  # GPT-2: per-layer units found by _no_split_modules (GPT2Block), tied embeddings
    {"steps": 2, "grad_clip": 1e-3},  # clipping that bites: each rank scales its shards by the global norm
    # replicas (fsdp_unit none): variants 0, 1, 7 and 4, and the SGT term back-propagated apart
    {"unit": "none"},
    {"steps": 2, "micro_batch": 2, "grad_accum": 2, "max_tokens": 40, "unit": "none"},
    {"steps": 2, "grad_clip": 1e-3, "unit": "none"},
    {"nan_rank": 1, "unit": "none"},
    {"sgt_apart": True, "unit": "none"},
    # grad_sync mini_batch (units gathered through a mini-batch, one reduce-scatter): variants 0, 1, 2, 4, 7 (one unit), 6
    {"grad_sync": "mini_batch"},
    {"steps": 2, "micro_batch": 2, "grad_accum": 2, "max_tokens": 40, "grad_sync": "mini_batch"},
    {"dtype": "bf16", "grad_sync": "mini_batch"},
    {"nan_rank": 1, "grad_sync": "mini_batch"},
    {"steps": 2, "grad_clip": 1e-3, "unit": "model", "grad_sync": "mini_batch"},
    {"arch": "gpt2", "grad_sync": "mini_batch"},
    {"logprob_chunk": 5, "grad_sync": "mini_batch"},
    # gradient checkpointing (each layer's forward re-run in backward), per micro-batch and per mini-batch sync
    {"checkpointing": True},
    {"checkpointing": True, "grad_sync": "mini_batch"},
]
#: a variant -> the one whose schedule (steps, mini-batches, clipping) it repeats in another layout
REPEATS = {8: 0, 9: 1, 10: 7, 11: 4, 13: 0, 14: 1, 15: 2, 16: 4, 17: 7, 18: 6, 19: 3, 20: 0, 21: 0}


@pytest.fixture(scope="module")
def one_and_two(tmp_path_factory):
    torch.set_num_threads(1)
    one = [update_once(WorkerGroup(GroupSpec(rank=0, world_size=1)), **kw) for kw in VARIANTS]
    two = run_group(2, tmp_path_factory.mktemp("fsdp") / "two.pt", VARIANTS)
    return one, two


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.mark.parametrize("v", [0, 1, 5, 6, 7, 8, 9, 10, 12, 13, 14, 17, 18, 20, 21])
def test_two_fsdp_ranks_update_like_one_process(one_and_two, v):
    """Per-layer units (0, 1; 6: GPT-2) and the whole model as one unit (5: variant 1's schedule) alike; 7: the
    gradients clipped to a norm of 1e-3 (their norm is larger: the scaling is real); replicas (8, 9, 10: variants
    0, 1, 7 with ``fsdp_unit: none``; 12: the SGT term back-propagated apart) alike; ``grad_sync: mini_batch``
    (13, 14, 18: variants 0, 1, 6; 17: variant 7 with one unit) alike; gradient checkpointing (20; 21 with
    ``mini_batch``) alike."""
    one, two = one_and_two[0][v], one_and_two[1][v]
    layers = 2  # tiny_model's, either architecture
    units = {5: 1, 17: 1}.get(v, 0 if VARIANTS[v].get("unit") == "none" else layers + 1)
    assert (one["units"], two["units"]) == (0, units)
    base = REPEATS.get(v, v)
    assert len(one["grads"]) == len(two["grads"]) == {1: 6, 5: 6, 7: 2}.get(base, 1)
    if base == 7:  # the norm before clipping is the logged one; the stepped gradients have norm 1e-3 on both sides
        assert all(m["grad_norm"] > 1e-2 for m in one["metrics"])
        for g1, g2 in zip(one["grads"], two["grads"], strict=True):
            assert float(torch.stack([g.norm() for g in g2]).norm()) == pytest.approx(1e-3, rel=1e-4)
            for a, b in zip(g1, g2, strict=True):
                torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-10)
    for g1, g2 in zip(one["grads"], two["grads"], strict=True):
        for a, b in zip(g1, g2, strict=True):
            torch.testing.assert_close(b, a, atol=1e-6, rtol=0)
    assert _max_diff(one["state"], two["state"]) < 1e-6
    assert _max_diff(one["state"], tiny_model(arch=VARIANTS[v].get("arch", "qwen2")).state_dict()) > 1e-4  # it moved
    for m1, m2 in zip(one["metrics"], two["metrics"], strict=True):  # the logged loss is the global one
        assert m2["loss"] == pytest.approx(m1["loss"], abs=1e-6)
        assert m2["grad_norm"] == pytest.approx(m1["grad_norm"], rel=1e-5)


@pytest.mark.parametrize("v", [3, 19])  # and with grad_sync: mini_batch
def test_chunked_logprobs_on_two_ranks_update_like_one_unchunked_process(one_and_two, v):
    one, two = one_and_two[0][0], one_and_two[1][v]
    assert two["sharded_chunked"] and not one_and_two[0][v]["sharded_chunked"]  # the sharded chunked path ran
    for a, b in zip(one["grads"][0], two["grads"][0], strict=True):
        torch.testing.assert_close(b, a, atol=1e-6, rtol=0)
    assert _max_diff(one["state"], two["state"]) < 1e-6
    assert two["metrics"][0]["loss"] == pytest.approx(one["metrics"][0]["loss"], abs=1e-6)


def test_bf16_on_two_ranks_keeps_fp32_masters_and_follows_one_process(one_and_two):
    one, two = one_and_two[0][2], one_and_two[1][2]
    assert two["dtypes"] == two["opt_dtypes"] == ["torch.float32"]
    assert all(v.dtype == torch.float32 for v in two["state"].values())
    assert two["metrics"][0]["loss"] == pytest.approx(one["metrics"][0]["loss"], abs=2e-2)  # bf16 compute
    assert _max_diff(one["state"], two["state"]) < 1e-3 * 2  # at most ~lr per element apart


@pytest.mark.parametrize("v", [4, 11, 16])  # FSDP2 shards, replicas, shards with grad_sync: mini_batch
def test_a_non_finite_loss_on_one_rank_skips_the_update_on_every_rank(one_and_two, v):
    one, two = one_and_two[0][v], one_and_two[1][v]
    assert one["metrics"][0].get("nan_skipped", 0.0) == 0.0  # the one process (rank 0) has a finite loss
    assert two["metrics"] == [{"nan_skipped": 1.0}] and two["grads"] == []  # rank 0 saw rank 1's NaN: no step
    assert _max_diff(two["state"], tiny_model().state_dict()) == 0.0


def test_bf16_mini_batch_sync_accumulates_in_fp32_like_per_micro_batch_sync(one_and_two):
    """``dtype: bf16``: gradients accumulated unsharded over the micro-batches (FSDP2 upcasts the accumulator to
    the fp32 ``reduce_dtype``) and reduce-scattered once give the update of one fp32 reduce-scatter per micro-batch,
    to float rounding, not bf16's."""
    micro, mini = one_and_two[1][2], one_and_two[1][15]
    assert mini["dtypes"] == mini["opt_dtypes"] == ["torch.float32"]
    for a, b in zip(micro["grads"][0], mini["grads"][0], strict=True):
        torch.testing.assert_close(b, a, atol=1e-6, rtol=0)
    assert _max_diff(micro["state"], mini["state"]) < 1e-6


def test_mini_batch_sync_gathers_each_unit_once_a_mini_batch(one_and_two):
    """Variant 0's one mini-batch of ``m`` micro-batches on 3 units (2 layers + the root), the reference model
    sharded too: per micro-batch, the policy's all-gathers in forward and in backward, the reference's in forward
    and one reduce-scatter each (``9 m`` and ``3 m``); with ``grad_sync: mini_batch`` one all-gather per unit of
    each model and one reduce-scatter per unit, whatever ``m``."""
    micro, mini = one_and_two[1][0]["collectives"], one_and_two[1][13]["collectives"]
    m = micro["reduce_scatter"] // 3
    assert m >= 2 and micro == {"all_gather": 9 * m, "reduce_scatter": 3 * m}
    assert mini == {"all_gather": 6, "reduce_scatter": 3}
    assert one_and_two[0][13]["collectives"] == {"all_gather": 0, "reduce_scatter": 0}  # one process: none


def test_rank_share_refuses_an_unknown_grad_sync_and_does_nothing_unsharded():
    from mrl_llm.parallel.share import RankShare

    with pytest.raises(ValueError, match="grad_sync 'step' is not one of"):
        RankShare(WorkerGroup(GroupSpec(rank=0, world_size=1)), grad_sync="step")
    share = RankShare(WorkerGroup(GroupSpec(rank=0, world_size=1)), grad_sync="mini_batch")
    assert not share.accumulates
    model = tiny_model()
    with share.gathered(model, None):  # a group of one: nothing to keep gathered
        share.sync_grads(model, last=False)
    with share.gathered():  # no models
        pass


def test_gathered_restores_resharding_and_keeps_the_blocks_own_error():
    """:func:`gathered` turns resharding off for the block and back on after it, also when the block raises; the
    block's error is the one that propagates when the reshard after it fails too; outside an error a failing
    reshard is reported; a model without FSDP2 units is left alone."""
    from torch.distributed.fsdp import FSDPModule

    from mrl_llm.parallel.fsdp import gathered

    class Unit(FSDPModule, torch.nn.Module):  # the FSDP2 calls gathered makes, recorded
        def set_reshard_after_forward(self, value, recurse=True):
            self.calls.append(("forward", value))

        def set_reshard_after_backward(self, value, *, recurse=True):
            self.calls.append(("backward", value))

        def reshard(self):
            self.calls.append("reshard")
            if self.fail:
                raise RuntimeError("reshard failed")

    def unit(fail: bool) -> Unit:
        m = torch.nn.Module()
        m.__class__ = Unit  # as fully_shard makes a module an FSDPModule
        m.fail, m.calls = fail, []
        return m

    failing = unit(fail=True)
    with pytest.raises(ValueError, match="the block's own"), gathered(failing):
        raise ValueError("the block's own")
    assert failing.calls == [("forward", False), ("backward", False), "reshard", ("forward", True), ("backward", True)]
    with pytest.raises(RuntimeError, match="reshard failed"), gathered(unit(fail=True)):
        pass
    fine = unit(fail=False)
    with gathered(fine):
        assert fine.calls == [("forward", False), ("backward", False)]  # kept gathered inside the block
    assert fine.calls[2:] == ["reshard", ("forward", True), ("backward", True)]
    with gathered(torch.nn.Linear(2, 2)):  # nothing sharded: nothing to set
        pass


def test_group_spec_malformed_and_group_of_one():
    for kw, match in (({"rank": 0, "world_size": 0}, "world_size must be an integer >= 1"),
                      ({"rank": 2, "world_size": 2, "port": 5}, r"rank must be an integer in \[0, 2\)"),
                      ({"rank": 0, "world_size": 2}, "needs rank 0's port"),
                      ({"rank": 0, "world_size": 1, "backend": "mpi"}, "backend 'mpi' is not one of")):
        with pytest.raises(ValueError, match=match):
            GroupSpec(**kw)
    g = WorkerGroup.join(GroupSpec(rank=0, world_size=1))  # no process group: identity collectives
    assert not g.sharded and not torch.distributed.is_initialized()
    assert g.sum([1.5, 2.0]) == [1.5, 2.0] and g.sum([]) == [] and g.gather_objects({"a": 1}) == [{"a": 1}]
    assert g.sum_(torch.tensor([1.5, 2.0])).tolist() == [1.5, 2.0] and g.sum_(torch.empty(0)).numel() == 0
    g.close()
    host, port = rendezvous("127.0.0.1")
    assert host == "127.0.0.1" and 0 < port < 65536
    assert backend_for("cpu") == "gloo" and backend_for("cuda:0") == "nccl"


def test_rank_0_hosting_the_store_leaves_last(tmp_path):
    """close() is ordered: rank 0 (the store's host) returns only after rank 1's slow teardown is done; a second
    close does nothing."""
    rank0_left, rank1_done = run_close(tmp_path / "left", delay_s=1.5)
    assert rank0_left >= rank1_done


def test_gather_into_copies_the_shards_bucket_by_bucket(tmp_path):
    """Exact copies with even (96) and uneven (97: 49 + 48 rows) vocabularies; the whole tiny model is one
    all-gather at the default bucket size, one per tensor (or so) at a tiny one."""
    variants = [{"vocab": 96, "bucket_mb": 64.0}, {"vocab": 97, "bucket_mb": 64.0}, {"vocab": 97, "bucket_mb": 0.01}]
    got = run_gather(2, tmp_path / "gather.pt", variants)
    for v, g in zip(variants, got, strict=True):
        want = tiny_model(0, v["vocab"]).state_dict()
        assert g["n"] == len(want) and _max_diff(g["state"], want) == 0.0
        assert _max_diff(tiny_model(1, v["vocab"]).state_dict(), want) > 1e-3  # the copy started elsewhere
    assert got[0]["collectives"] == got[1]["collectives"] == 1
    assert got[2]["collectives"] >= len(tiny_model().state_dict()) // 2


def test_shard_model_refuses_an_unknown_unit_and_finds_any_hf_models_layers():
    with pytest.raises(ValueError, match="FSDP unit 'block' is not one of"):
        shard_model(tiny_model(), Precision("fp32"), WorkerGroup(GroupSpec(rank=0, world_size=1)), unit="block")
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=3, n_embd=16, n_head=2, vocab_size=32, n_positions=16))
    assert decoder_layers(gpt2) == list(gpt2.transformer.h)  # its _no_split_modules: GPT2Block
    qwen = tiny_model()
    assert decoder_layers(qwen) == list(qwen.model.layers)
    with pytest.raises(ValueError, match="set train.fsdp_unit: model to shard it as a single unit"):
        decoder_layers(torch.nn.Sequential(torch.nn.Linear(2, 2)))


def test_shard_model_refuses_a_torch_without_fsdp2s_methods(monkeypatch):
    """torch 2.6 / 2.7 have fully_shard but not every FSDPModule method the groups call: a clear error naming the
    fix before anything is sharded, not an AttributeError from the middle of shard_model; replicas need none."""
    from types import SimpleNamespace

    from torch.distributed.fsdp import FSDPModule

    from mrl_llm.parallel.fsdp import FSDP2_METHODS, require_fsdp2

    require_fsdp2()  # this torch has them all
    two = SimpleNamespace(sharded=True)  # what shard_model reads of a group of 2
    monkeypatch.delattr(FSDPModule, "set_force_sum_reduction_for_comms")
    for unit in ("layer", "model"):
        model = tiny_model()
        with pytest.raises(RuntimeError, match=r"need torch >= 2.8 .*FSDPModule.set_force_sum_reduction_for_comms\); "
                                               r"install torch>=2.8, or train with policies\[\]\.ranks: 1"):
            shard_model(model, Precision("fp32"), two, unit=unit)
        assert not any(isinstance(m, FSDPModule) for m in model.modules())  # nothing sharded
    model = tiny_model()
    assert shard_model(model, Precision("fp32"), two, unit="none") is model
    assert "set_force_sum_reduction_for_comms" in FSDP2_METHODS


def test_chunk_rows_is_torch_chunk():
    for rows, k in ((0, 2), (1, 2), (2, 3), (5, 2), (7, 3), (96, 2), (97, 4)):
        want = [len(c) for c in torch.chunk(torch.arange(rows), k)] if rows else []
        assert chunk_rows(rows, k) == want + [0] * (k - len(want))


def test_gather_into_unsharded_empty_and_mismatched():
    a, b = tiny_model(0), tiny_model(1)
    assert gather_into(a, b) == len(a.state_dict()) and _max_diff(a.state_dict(), b.state_dict()) == 0.0
    assert gather_into(torch.nn.Module(), torch.nn.Module()) == 0
    with pytest.raises(KeyError, match="missing"):
        gather_into(torch.nn.Linear(2, 2, bias=False), torch.nn.Linear(2, 2))
    with pytest.raises(KeyError, match="differ in shape"):
        gather_into(torch.nn.Linear(2, 3), torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="bucket_mb must be > 0"):
        gather_into(a, b, bucket_mb=0)
