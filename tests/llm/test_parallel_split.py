"""Rows over ranks (:mod:`mrl_llm.parallel.split`, :mod:`mrl_llm.parallel.share`): every row on exactly one
rank, balanced by tokens (LPT bound) with no rank more rows than an even split, order kept; the empty and
malformed cases; a group of one is the one-process update exactly; global counts are the sum of the ranks'
counts."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mrl_llm.parallel.group import GroupSpec, WorkerGroup
from mrl_llm.parallel.share import RankShare
from mrl_llm.parallel.split import split_by_tokens
from mrl_llm.update import run_update
from tests.llm.parallel_ranks import LOSS, synthetic_batch, tiny_model


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 500), max_size=40), st.integers(1, 6))
def test_every_row_on_one_rank_balanced_in_order(lengths, k):
    rows = list(range(len(lengths)))
    shares = split_by_tokens(rows, lengths, k)
    assert len(shares) == k
    assert sorted(i for s in shares for i in s) == rows
    assert all(s == sorted(s) for s in shares)
    assert max(len(s) for s in shares) <= math.ceil(len(rows) / k)  # no rank more rows than an even split
    loads = [sum(lengths[i] for i in s) for s in shares]
    # LPT: the fullest rank exceeds the mean by less than its last row, so by at most the longest row
    assert max(loads) <= sum(lengths) / k + max(lengths, default=0)


def test_hand_computed_split_empty_and_malformed():
    assert split_by_tokens([], [], 3) == [[], [], []]
    assert split_by_tokens([0, 1, 2, 3], [5, 1, 4, 2], 2) == [[0, 1], [2, 3]]  # 5+1 vs 4+2
    assert split_by_tokens([3, 1], [9, 2, 9, 7], 2) == [[3], [1]]  # a subset of the rows, by index
    assert split_by_tokens([0], [4], 3) == [[0], [], []]  # fewer rows than ranks
    # one long row and three short: plain LPT would give 1 and 3 rows (3 micro-batches of one row on one rank,
    # a filler on the other); at most ceil(4 / 2) = 2 rows a rank, so each runs one micro-batch of 2
    assert split_by_tokens([0, 1, 2, 3], [1, 1, 1, 10], 2) == [[2, 3], [0, 1]]
    for args, match in ((([0], [1], 0), "ranks must be an integer >= 1"),
                        (([0], [1], True), "ranks must be an integer >= 1"),
                        (([1], [1], 2), "row 1 is not an index"),
                        (([0], [-1], 2), "row 0 has length -1"),
                        (([0], [1.5], 2), "row 0 has length 1.5"),
                        (([0, 0], [1], 2), "listed twice")):
        with pytest.raises(ValueError, match=match):
            split_by_tokens(*args)


def test_group_of_one_share_is_the_one_process_update():
    torch.set_num_threads(1)
    out = []
    for share in (None, RankShare(WorkerGroup(GroupSpec(rank=0, world_size=1)))):
        model = tiny_model()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        res = run_update(model, opt, synthetic_batch(), loss_cfg=LOSS, temperature=1.0, micro_batch=2, grad_accum=2,
                         grad_clip=1.0, pad_id=0, share=share)
        out.append((model.state_dict(), res.metrics))
    (w0, m0), (w1, m1) = out
    assert all(torch.equal(w0[k], w1[k]) for k in w0)
    assert m0 == pytest.approx(m1, nan_ok=True)


def test_global_norm_is_the_sum_of_the_rank_counts():
    batch = synthetic_batch()
    rows = list(range(len(batch)))
    lens = [len(p) + len(r) for p, r in zip(batch.prompts, batch.responses, strict=True)]
    shares = split_by_tokens(rows, lens, 3)
    parts = [batch.norm(s) for s in shares]
    whole = batch.norm(rows)
    for f in ("pg_tokens", "pg_rows", "sgt_tokens", "kl_tokens", "kl_rows"):
        assert sum(getattr(p, f) for p in parts) == getattr(whole, f)
    one = RankShare(WorkerGroup(GroupSpec(rank=0, world_size=1)))
    assert one.plan(batch, rows, [[0, 1], [2]], filler=[0]) == (whole, [([0, 1], True), ([2], True)])
    assert one.plan(batch, [], [], filler=[0]) == (batch.norm([]), [])  # an empty share: no micro-batches
    assert one.totals({"b": 1.0, "a": 2.0}, True, 9.0) == ({"a": 2.0, "b": 1.0}, True, 3.0)
    assert one.totals({}, False) == ({}, False, 0.0)


def test_clipping_by_a_given_global_norm_is_torchs_clip_grad_norm():
    torch.manual_seed(0)
    net, twin = torch.nn.Linear(4, 3), torch.nn.Linear(4, 3)
    twin.load_state_dict(net.state_dict())
    assert RankShare.grad_sq(net.parameters()) == 0.0  # no gradient yet: nothing to measure
    assert float(RankShare.clip(net.parameters(), 1.0, 0.0)) == 0.0  # ... or to scale
    (net(torch.randn(5, 4)) * 10).square().sum().backward()
    twin.weight.grad, twin.bias.grad = net.weight.grad.clone(), net.bias.grad.clone()
    total = math.sqrt(RankShare.grad_sq(net.parameters()))
    for max_norm in (1e-2, math.inf):  # scaled, and left as it is
        want = torch.nn.utils.clip_grad_norm_(twin.parameters(), max_norm)
        got = RankShare.clip(net.parameters(), max_norm, total)
        assert float(got) == pytest.approx(float(want), rel=1e-6)
        for a, b in zip(net.parameters(), twin.parameters(), strict=True):
            torch.testing.assert_close(a.grad, b.grad, rtol=1e-6, atol=0)
        total = math.sqrt(RankShare.grad_sq(net.parameters()))
    net.bias.grad[0] = float("nan")  # a non-finite norm: nothing scaled (the caller aborts the update)
    before = net.weight.grad.clone()
    assert math.isnan(RankShare.grad_sq(net.parameters()))
    assert torch.isnan(RankShare.clip(net.parameters(), 1e-3, math.nan))
    assert torch.equal(net.weight.grad, before)


def test_replicas_gradient_reduce_on_a_group_of_one_empty_and_missing_gradients():
    group = WorkerGroup.join(GroupSpec(rank=0, world_size=1))
    share, fsdp = RankShare(group, replicated=True), RankShare(group)
    assert not share.replicated and not share.fsdp and not fsdp.fsdp  # a group of one is neither
    share.reduce_grads([])  # nothing to reduce
    net = torch.nn.Linear(4, 3)
    net(torch.randn(2, 4)).sum().backward()
    net.bias.grad = None  # a parameter without a gradient takes zeros, so that every rank's buffer lines up
    before = net.weight.grad.clone()
    share.reduce_grads(net.parameters())
    assert torch.equal(net.weight.grad, before) and torch.equal(net.bias.grad, torch.zeros(3))
