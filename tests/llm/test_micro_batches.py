"""Token-budget micro-batches (:mod:`mrl_llm.micro_batches`): every row in exactly one micro-batch within the
budget, longest first; the accumulated gradient equals the one-batch gradient (fp32, mixed lengths); a
budget below the longest possible row is refused when the config loads."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mrl_llm.config import PolicyConfig, SamplingSection, TrainSection, config_from_mapping
from mrl_llm.micro_batches import micro_batch_groups, padded_tokens, token_budget_groups
from mrl_llm.update import run_update
from shared_interfaces.config_io import ConfigError
from tests.llm.helpers import tiny
from tests.llm.test_precision import GradCapture, _rows, _worker


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 300), max_size=40), st.integers(2, 400))
def test_every_row_in_exactly_one_group_within_the_budget(lengths, budget):
    lengths = [min(n, budget) for n in lengths]
    groups = token_budget_groups(lengths, budget)
    flat = [i for g in groups for i in g]
    assert sorted(flat) == list(range(len(lengths)))
    assert all(g and padded_tokens(lengths, g) <= budget for g in groups)
    assert [lengths[i] for i in flat] == sorted(lengths, reverse=True)  # longest first
    # greedy: a group could not have taken the next group's first row
    for a, b in zip(groups, groups[1:], strict=False):
        assert padded_tokens(lengths, a + b[:1]) > budget


def test_hand_computed_groups_and_the_row_path():
    assert token_budget_groups([], 10) == []
    assert token_budget_groups([3, 9, 2, 4, 5], 10) == [[1], [4, 3], [0, 2]]
    assert token_budget_groups([0, 1], 4) == [[1, 0]]  # packed at least 2 wide
    assert token_budget_groups([0, 1], 3) == [[1], [0]]
    assert micro_batch_groups([4, 5, 6], [0] * 7, micro_batch=2) == [[4, 5], [6]]
    assert micro_batch_groups([4, 5, 6], [1, 1, 1, 1, 8, 3, 7], micro_batch=2, max_tokens=10) == [[4], [6], [5]]
    assert micro_batch_groups([], [], micro_batch=2, max_tokens=10) == []


@pytest.mark.parametrize("lengths,budget,match", [
    ([3, 11], 10, "row 1 has 11 tokens, more than the micro-batch token budget 10"),
    ([3, -1], 10, "row 1: length must be a non-negative integer"),
    ([3, 2.5], 10, "row 1: length must be a non-negative integer"),
    ([3], 1, "token budget must be an integer >= 2"),
    ([3], None, "token budget must be an integer >= 2"),
])
def test_malformed_input_is_refused(lengths, budget, match):
    with pytest.raises(ValueError, match=match):
        token_budget_groups(lengths, budget)


def _mixed_batch(w):
    """The step's batch with its responses cut to long-tailed lengths 0 .. 8 (a random model rarely stops)."""
    from shared_interfaces.exchange import InMemoryExchange

    batch = w.build_batch(_rows(w, InMemoryExchange(), 0))
    cut = [(i * 5) % 9 for i in range(len(batch))]
    batch.responses = [r[:k] for r, k in zip(batch.responses, cut, strict=True)]
    batch.mu = [m[:k] for m, k in zip(batch.mu, cut, strict=True)]
    return batch


def test_token_budget_gradient_equals_the_one_batch_gradient(monkeypatch):
    w = _worker(monkeypatch, dtype="fp32", kl=0.05)
    batch = _mixed_batch(w)
    lens = [len(p) + len(r) for p, r in zip(batch.prompts, batch.responses, strict=True)]
    assert len(set(lens)) > 3  # mixed lengths
    grads, metrics = [], []
    for kw in ({"micro_batch": len(batch)}, {"micro_batch": 8, "max_tokens": 2 * max(lens)}):
        opt = GradCapture(w.model.parameters())
        res = run_update(w.model, opt, batch, loss_cfg=w.cfg.loss, temperature=1.0, grad_accum=None, grad_clip=None,
                         pad_id=w.pad_id, ref_model=w.ref_model, **kw)
        grads.append(opt.grads[0])
        metrics.append(res.metrics)
    torch.testing.assert_close(grads[1], grads[0], atol=1e-6, rtol=1e-5)
    assert metrics[1]["loss"] == pytest.approx(metrics[0]["loss"], abs=1e-6)
    assert 1.0 <= metrics[1]["padding_waste"] < metrics[0]["padding_waste"]


def test_token_budget_with_several_minibatches_matches_rows(monkeypatch):
    """grad_accum > 1: the snapshot pass runs over the token-budget groups too; same update as by rows."""
    w = _worker(monkeypatch, dtype="fp32")
    batch = _mixed_batch(w)
    lens = [len(p) + len(r) for p, r in zip(batch.prompts, batch.responses, strict=True)]
    grads = []
    for kw in ({}, {"max_tokens": max(lens) + 1}):
        opt = GradCapture(w.model.parameters())
        res = run_update(w.model, opt, batch, loss_cfg=w.cfg.loss, temperature=1.0, micro_batch=4, grad_accum=2,
                         grad_clip=None, pad_id=w.pad_id, **kw)
        assert res.optimizer_steps == 4
        grads.append(torch.stack(opt.grads))
    torch.testing.assert_close(grads[1], grads[0], atol=1e-6, rtol=1e-5)


def test_a_budget_below_the_longest_row_is_refused_at_load():
    with pytest.raises(ConfigError, match=r"policy 'a': train.max_tokens_per_micro_batch 99 is below the longest row "
                                          r"max_prompt_len \+ sampling.max_new_tokens = 100"):
        PolicyConfig(name="a", model_dir="m", max_prompt_len=60, sampling=SamplingSection(max_new_tokens=40),
                     train=TrainSection(max_tokens_per_micro_batch=99))
    ok = PolicyConfig(name="a", model_dir="m", max_prompt_len=60, sampling=SamplingSection(max_new_tokens=40),
                      train=TrainSection(max_tokens_per_micro_batch=100))
    assert ok.train.max_tokens_per_micro_batch == 100
    with pytest.raises(ConfigError, match="max_tokens_per_micro_batch"):
        config_from_mapping({"policies": [{"name": "a", "model_config": tiny("llama"), "tokenizer_dir": "utf8-bytes",
                                           "train": {"max_tokens_per_micro_batch": 64}}]})
    with pytest.raises(ConfigError, match="train.max_tokens_per_micro_batch must be >= 2"):
        TrainSection(max_tokens_per_micro_batch=0)
    with pytest.raises(ConfigError, match="train.logprob_chunk must be >= 1"):
        TrainSection(logprob_chunk=0)


def test_the_worker_trains_by_token_budget_and_cuts_rows_to_fit_it(monkeypatch):
    import mrl_llm.worker as worker_mod
    from shared_interfaces.exchange import InMemoryExchange

    w = _worker(monkeypatch, dtype="fp32")
    w.policy = PolicyConfig(**{**w.policy.__dict__, "max_prompt_len": 64, "train": TrainSection(
        lr=1e-6, micro_batch=8, max_tokens_per_micro_batch=64 + 8)})
    seen = {}
    real = worker_mod.build_batch

    def spy(rows, **kw):
        seen["max_len"] = kw["max_len"]
        return real(rows, **kw)

    monkeypatch.setattr(worker_mod, "build_batch", spy)
    m = w.train_step(_rows(w, InMemoryExchange(), 0))
    assert seen["max_len"] == 64 + 8 < w.max_len
    assert m["padding_waste"] >= 1.0 and m["nan_skipped"] == 0
