"""A worker group logs the batch's diagnostics, not rank 0's rows' (:meth:`mrl_llm.update.Diagnostics.reduce`):
entropy, ``kl_to_ref``, the clip fraction, ``approx_kl_old``, PRP's coefficient and ratio variance and the drift
maximum of an update on 2 ranks (gloo, two processes) equal the one-process update's on the same weights, with
FSDP2 shards and with whole replicas over several mini-batches."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mrl_llm.parallel.group import GroupSpec, WorkerGroup
from mrl_llm.update import Diagnostics
from tests.llm.parallel_ranks import run_group, update_once

VARIANTS = [
    {},  # FSDP2 per-layer units, one mini-batch (9 rows: 3 micro-batches on one rank, 2 + a filler on the other)
    {"steps": 2, "micro_batch": 2, "grad_accum": 2, "max_tokens": 40, "unit": "none"},  # replicas, 3 mini-batches
]
KEYS = ("entropy", "kl_to_ref", "clip_fraction", "approx_kl_old", "prp_coef", "prp_ratio_var", "logprob_drift_max")


@pytest.fixture(scope="module")
def one_and_two(tmp_path_factory):
    torch.set_num_threads(1)
    one = [update_once(WorkerGroup(GroupSpec(rank=0, world_size=1)), **kw) for kw in VARIANTS]
    two = run_group(2, tmp_path_factory.mktemp("diag") / "two.pt", VARIANTS)
    return one, two


@pytest.mark.slow
@pytest.mark.parametrize("v", range(len(VARIANTS)))
def test_two_ranks_log_the_batchs_diagnostics(one_and_two, v):
    one, two = one_and_two[0][v], one_and_two[1][v]
    assert len(one["metrics"]) == len(two["metrics"]) == VARIANTS[v].get("steps", 1)
    for m1, m2 in zip(one["metrics"], two["metrics"], strict=True):
        assert all(np.isfinite(m1[k]) for k in KEYS) and m1["prp_ratio_var"] > 0 and m1["entropy"] > 0
        for k in KEYS:
            assert m2[k] == pytest.approx(m1[k], rel=1e-5, abs=1e-7), k


def test_reduce_on_a_group_of_one_and_of_an_empty_step():
    d = Diagnostics()
    d.reduce(WorkerGroup(GroupSpec(rank=0, world_size=1)))  # nothing in it, no group: nothing changes
    m = d.metrics(tracks_ref=True)
    assert np.isnan(m["entropy"]) and np.isnan(m["kl_to_ref"]) and m["logprob_drift_max"] == 0.0
    assert "prp_ratio_var" not in m
    d.add("entropy", 3.0, 2.0)
    d.reduce(WorkerGroup(GroupSpec(rank=0, world_size=1)))
    assert d.metrics(tracks_ref=False)["entropy"] == 1.5
