"""The worker hands the core's decisions to the core's loss unchanged: rows, THL denominators, SGT masks,
behaviour coefficients, and exact gradient accumulation over micro-batches."""

from __future__ import annotations

import functools
import math

import pytest
import torch

import mrl_llm.update as update_mod
from mrl_llm.config import PolicyConfig, TrainSection
from mrl_llm.contract import learner_tokenizer_dir
from mrl_llm.distributed.actors import fetch_learner_rows
from mrl_llm.thl import align_trace
from mrl_llm.update import minibatches, run_update
from mrl_llm.worker import LLMPolicyWorker, WorkerConfig
from shared_interfaces.exchange import InMemoryExchange
from shared_interfaces.records import ExperienceRecord, make_record_id
from shared_interfaces.regimes import parse_regime
from shared_interfaces.regimes.config import LossConfig
from tests.llm.helpers import tiny

PROMPT = "Question: what is 2+2? Put the answer in \\boxed{}."
TEXTS_A = ["I think it is 5.", "No idea at all", "five?"]
TEXTS_B = ["The answer is \\boxed{4}.", "So \\boxed{4}", "It is 3."]


def worker(name: str, tok: str, **train) -> LLMPolicyWorker:
    pol = PolicyConfig(name=name, model_config=tiny("llama"), tokenizer_dir=tok,
                       train=TrainSection(**{"lr": 1e-2, "micro_batch": 2, **train}))
    w = LLMPolicyWorker(name, WorkerConfig(policy=pol, loss=LossConfig(kl_coef=0.1),
                                           tokenizers=("utf8-bytes", learner_tokenizer_dir())), seed=1)
    w.set_prompt("p0", PROMPT)
    return w


def records(w: LLMPolicyWorker, texts: list[str], rewards: list[float], lp: float) -> list[ExperienceRecord]:
    out = []
    for g, (text, r) in enumerate(zip(texts, rewards, strict=True)):
        ids = list(w.tokenizer(text, add_special_tokens=False).input_ids) + [w.tokenizer.eos_token_id]
        out.append(ExperienceRecord(
            record_id=make_record_id(w.name, 0, "p0", g), policy_id=w.name, policy_version=0, step=0, prompt_id="p0",
            sample_index=g, prompt_text=PROMPT, response_text=text, token_ids=ids,
            token_logprobs=[lp - 0.01 * k for k in range(len(ids))], tokenizer_id=w.tok_id, reward=r, verified=True,
            verifier="math", finish_reason="stop"))
    return out


@pytest.fixture(scope="module")
def pair():
    a = worker("A", "utf8-bytes")
    b = worker("B", learner_tokenizer_dir())
    ex = InMemoryExchange()
    ex.publish(records(a, TEXTS_A, [0, 0, 0], -0.5) + records(b, TEXTS_B, [1, 1, 0], -0.2))
    return a, b, ex


class Spy:
    def __init__(self):
        self.calls = []
        self.real = update_mod.regime_loss

    def __call__(self, *args, **kw):
        self.calls.append((args, kw))
        return self.real(*args, **kw)


def rows_for(ex, learner, regime):
    rows, _ = fetch_learner_rows(ex, learner, parse_regime(regime), ["p0"], 0, present=["A", "B"])
    return rows


def kinds(rows) -> list[str]:
    """Each row's behaviour kind: own, a PRP peer row under snapshot / thl, or none (an SGT-only row)."""
    return ["own" if o else ("none" if not pg else "thl" if mu else "snapshot")
            for o, pg, mu in zip(rows.own_mask.tolist(), rows.pg_mask.tolist(), rows.use_mu.tolist(), strict=True)]


def test_prp_thl_peer_rows_take_mu_from_thl_and_sgt_rows_only_the_sgt_mask(pair, monkeypatch):
    a, b, ex = pair
    rows = rows_for(ex, "A", "prp_thl+sgt")
    assert rows.sgt_gate.tolist() == [True]  # A failed everywhere, B has verified successes
    batch = a.build_batch(rows)
    behaviours = kinds(batch.rows)
    assert behaviours == ["own"] * 3 + ["thl"] * 3  # the SGT target is a PRP row too: one row, both roles
    records = rows.row_records()
    for i, rec in enumerate(records):
        if behaviours[i] == "thl":
            want = align_trace(b.tokenizer, a.tokenizer, list(rec.token_ids), list(rec.token_logprobs),
                               prompt_text=PROMPT)
            assert batch.responses[i] == list(want.target_ids)
            assert batch.mu[i] == list(want.target_logprobs)
            assert batch.responses[i] == list(rec.response_text.encode()) + [a.tokenizer.eos_token_id]
        else:
            assert batch.responses[i] == list(rec.token_ids) and batch.mu[i] == list(rec.token_logprobs)
    assert int(rows.sgt_mask.sum()) == 1 and records[int(rows.sgt_mask.nonzero())].policy_id == "B"

    spy = Spy()
    monkeypatch.setattr(update_mod, "regime_loss", spy)
    t = a.policy.train
    run_update(a.model, torch.optim.SGD(a.model.parameters(), lr=0.0), batch, loss_cfg=a.cfg.loss, temperature=1.0,
               micro_batch=t.micro_batch, grad_accum=None, grad_clip=None, pad_id=a.pad_id, ref_model=a.ref_model)
    seen = 0
    for args, kw in spy.calls:
        logp, old, adv, pg_mask = args[0], args[1], args[2], args[3]
        n = logp.shape[0]
        idx = list(range(seen, seen + n))
        seen += n
        assert torch.equal(adv, rows.advantages[idx]) and torch.equal(kw["sample_weight"], rows.sample_weight[idx])
        assert kw["norm"] == batch.norm(list(range(len(batch))))
        coef = kw["behaviour_coef"]
        for j, k in enumerate(idx):
            L = len(batch.responses[k])
            assert bool(pg_mask[j, :L].all()) == bool(rows.pg_mask[k]) and not pg_mask[j, L:].any()
            assert bool(kw["sgt_mask"][j, :L].all()) == bool(rows.sgt_mask[k]) and not kw["sgt_mask"][j, L:].any()
            if behaviours[k] == "thl":
                mu = torch.tensor(batch.mu[k])
                want = torch.clamp(old[j, :L] - mu, max=math.log(rows.ratio_cap)).exp()
                torch.testing.assert_close(coef[j, :L], want)
            else:
                assert torch.equal(coef[j, :L], torch.ones(L))
        assert kw["sgt_weight"] == rows.sgt_weight == 1.0 and kw["ref_logp"] is not None
    assert seen == len(batch)


def test_snapshot_peers_have_coefficient_one_and_sgt_only_rows_are_not_in_pg(pair, monkeypatch):
    a, b, ex = pair
    spy = Spy()
    monkeypatch.setattr(update_mod, "regime_loss", spy)
    for regime, want in (("prp_snapshot", ["own"] * 3 + ["snapshot"] * 3), ("sgt", ["own"] * 3 + ["none"])):
        spy.calls.clear()
        batch = a.build_batch(rows_for(ex, "A", regime))
        assert kinds(batch.rows) == want
        run_update(a.model, torch.optim.SGD(a.model.parameters(), lr=0.0), batch, loss_cfg=a.cfg.loss,
                   temperature=1.0, micro_batch=8, grad_accum=None, grad_clip=None, pad_id=a.pad_id)
        (args, kw), = spy.calls
        mask = args[3] | kw["sgt_mask"]
        assert torch.equal(kw["behaviour_coef"][mask], torch.ones(int(mask.sum())))
        if regime == "sgt":
            assert not args[3][3].any() and kw["sgt_mask"][3].any()  # the SGT-only row: NLL term only
            assert batch.rows.pg_mask.tolist() == [True] * 3 + [False]
    # B (all-success learner with a failing peer) gets no SGT term and no peer rows under plain sgt
    assert kinds(b.build_batch(rows_for(ex, "B", "sgt")).rows) == ["own"] * 3


@pytest.mark.parametrize("grad_accum", [None, 2])
def test_micro_batches_accumulate_to_the_full_batch_update(pair, grad_accum):
    """Cutting each mini-batch into micro-batches of 1 row or into one micro-batch gives the same SGD update
    (the LossNorm contract); with grad_accum the step has two mini-batches (two updates) of h rows."""
    _, b, ex = pair
    batch = b.build_batch(rows_for(ex, "B", "prp_thl+sgt"))
    n = len(batch)
    results = []
    h = n // 2
    for mb in (1, n if grad_accum is None else h):
        torch.manual_seed(0)
        w = worker("B", learner_tokenizer_dir())
        opt = torch.optim.SGD(w.model.parameters(), lr=0.5)
        ga = None if grad_accum is None else h // mb
        res = run_update(w.model, opt, batch, loss_cfg=w.cfg.loss, temperature=0.9, micro_batch=mb, grad_accum=ga,
                         grad_clip=None, pad_id=w.pad_id, ref_model=w.ref_model)
        assert res.optimizer_steps == len(minibatches(n, mb, ga)) and not res.nan_skipped
        results.append(torch.cat([p.detach().flatten() for p in w.model.parameters()]))
        results.append(res.metrics["loss"])
    torch.testing.assert_close(results[0], results[2], atol=2e-6, rtol=1e-5)
    assert results[1] == pytest.approx(results[3], rel=1e-4, abs=1e-6)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_gradient_checkpointing_gives_the_same_update(pair, dtype):
    _, b, ex = pair
    batch = b.build_batch(rows_for(ex, "B", "prp_thl+sgt"))
    params = []
    for ckpt in (False, True):
        pol = PolicyConfig(name="B", model_config=tiny("llama"), tokenizer_dir=learner_tokenizer_dir(), dtype=dtype,
                           train=TrainSection(lr=1e-2, micro_batch=3, gradient_checkpointing=ckpt))
        w = LLMPolicyWorker("B", WorkerConfig(policy=pol, loss=LossConfig(kl_coef=0.1)), seed=1)
        # fp32 master weights whatever the dtype; bf16 computes under autocast (mrl_llm.precision)
        assert w.model.is_gradient_checkpointing == ckpt and next(w.model.parameters()).dtype == torch.float32
        res = run_update(w.model, w.optimizer, batch, loss_cfg=w.cfg.loss, temperature=1.0, micro_batch=3,
                         grad_accum=None, grad_clip=1.0, pad_id=w.pad_id, ref_model=w.ref_model,
                         autocast=functools.partial(w.precision.autocast, w.device))
        assert not res.nan_skipped and res.optimizer_steps == 1 and math.isfinite(res.metrics["loss"])
        params.append(torch.cat([p.detach().float().flatten() for p in w.model.parameters()]))
    torch.testing.assert_close(params[0], params[1], atol=1e-6 if dtype == "fp32" else 1e-2, rtol=0)


def test_batched_thl_prefetch_equals_one_by_one_alignment(pair):
    from shared_interfaces.records import TraceCache

    a, b, ex = pair
    for learner, peer in ((a, b), (b, a)):
        recs = [r for r in ex.records() if r.policy_id == peer.name]
        learner.alignment.trace_cache = TraceCache(max_entries=64)
        learner.alignment.prefetch(recs)
        assert learner.trace_cache.misses == len(recs)
        for rec in recs:
            got = learner.trace_cache.get_or_compute(rec.record_id, learner.tok_id, lambda: pytest.fail("not cached"))
            want = align_trace(peer.tokenizer, learner.tokenizer, list(rec.token_ids), list(rec.token_logprobs),
                               prompt_text=PROMPT)
            assert list(got.target_ids) == list(want.target_ids) and list(got.prompt_ids) == list(want.prompt_ids)
            assert list(got.target_logprobs) == list(want.target_logprobs)
            assert got.residual == want.residual


def test_kl_own_rows_and_prompt_sgt_scale_reach_the_loss(pair, monkeypatch):
    """The loss gets the own-row mask (KL on own rows) and, under ``sgt.normalize: prompt``, the core's
    per-row SGT scale computed over the whole batch; micro-batches still add up to the full update."""
    a, _, ex = pair
    spec = parse_regime("prp_thl+sgt", {"sgt": {"normalize": "prompt", "successes_per_prompt": 2}})
    rows, _ = fetch_learner_rows(ex, "A", spec, ["p0"], 0, present=["A", "B"])
    batch = a.build_batch(rows)
    sgt = rows.sgt_mask.tolist()
    sgt_tokens = sum(len(r) for r, s in zip(batch.responses, sgt, strict=True) if s)
    assert sum(sgt) == 2 and rows.prompt.tolist() == [0] * len(batch)
    assert batch.sgt_scale.tolist() == [1 / sgt_tokens if s else 0.0 for s in sgt]
    spy = Spy()
    monkeypatch.setattr(update_mod, "regime_loss", spy)
    run_update(a.model, torch.optim.SGD(a.model.parameters(), lr=0.0), batch, loss_cfg=a.cfg.loss, temperature=1.0,
               micro_batch=2, grad_accum=None, grad_clip=None, pad_id=a.pad_id, ref_model=a.ref_model)
    own, scale = [], []
    for _, kw in spy.calls:
        own += kw["own_mask"].tolist()
        scale += kw["sgt_scale"].tolist()
    assert own == rows.own_mask.tolist() and scale == batch.sgt_scale.tolist()
    monkeypatch.undo()
    losses = []
    for mb in (1, len(batch)):
        torch.manual_seed(0)
        w = worker("A", "utf8-bytes")
        res = run_update(w.model, torch.optim.SGD(w.model.parameters(), lr=0.0), batch, loss_cfg=w.cfg.loss,
                         temperature=1.0, micro_batch=mb, grad_accum=None, grad_clip=None, pad_id=w.pad_id,
                         ref_model=w.ref_model)
        losses.append((res.metrics["loss"], res.metrics["sgt_loss"], res.metrics["kl_loss"]))
    assert losses[0] == pytest.approx(losses[1], rel=1e-5, abs=1e-7)


@pytest.mark.parametrize("regime", ["sgt", "prp_thl+sgt"])
def test_a_group_with_sgt_false_takes_no_gradient_from_the_sgt_term(pair, regime):
    """``train.lr_groups[].sgt: false``: that group's parameters move as if lambda were 0, every other parameter
    as with the full loss (micro-batches of one row: the kept gradients accumulate across them); SGT's term
    does move the group when it is not kept out, so the comparison can fail."""
    from dataclasses import replace

    a, _, ex = pair
    batch = a.build_batch(rows_for(ex, "A", regime))
    assert bool(batch.rows.sgt_mask.any())
    no_sgt_batch = replace(batch, rows=replace(batch.rows, sgt_weight=0.0))

    def deltas(b, keep_norms_out):
        torch.manual_seed(0)
        w = worker("A", "utf8-bytes")
        named = list(w.model.named_parameters())
        norms = [p for n, p in named if "norm" in n]
        rest = [p for n, p in named if "norm" not in n]
        opt = torch.optim.SGD([{"params": norms, "sgt": not keep_norms_out}, {"params": rest}], lr=1.0)
        before = {n: p.detach().clone() for n, p in named}
        res = run_update(w.model, opt, b, loss_cfg=w.cfg.loss, temperature=1.0, micro_batch=1, grad_accum=None,
                         grad_clip=None, pad_id=w.pad_id, ref_model=w.ref_model)
        assert res.optimizer_steps == 1 and not res.nan_skipped
        return {n: p.detach() - before[n] for n, p in named}

    kept, without, full = deltas(batch, True), deltas(no_sgt_batch, False), deltas(batch, False)
    for name, d in kept.items():
        want = without[name] if "norm" in name else full[name]
        torch.testing.assert_close(d, want, atol=1e-6, rtol=1e-5, msg=name)
    moved = max(float((full[n] - without[n]).abs().max()) for n in kept if "norm" in n)
    assert moved > 1e-4  # SGT's term reaches the norms when they are not kept out


def test_sgt_false_groups_without_sgt_rows_are_one_plain_backward(pair):
    """No SGT token in the batch (the learner is not rescued): the kept-out group changes nothing."""
    _, b, ex = pair
    batch = b.build_batch(rows_for(ex, "B", "sgt"))
    assert not bool(batch.rows.sgt_mask.any())
    params = []
    for keep in (True, False):
        torch.manual_seed(0)
        w = worker("B", learner_tokenizer_dir())
        named = list(w.model.named_parameters())
        opt = torch.optim.SGD([{"params": [p for n, p in named if "norm" in n], "sgt": not keep},
                               {"params": [p for n, p in named if "norm" not in n]}], lr=1.0)
        run_update(w.model, opt, batch, loss_cfg=w.cfg.loss, temperature=1.0, micro_batch=2, grad_accum=None,
                   grad_clip=None, pad_id=w.pad_id, ref_model=w.ref_model)
        params.append(torch.cat([p.detach().flatten() for p in w.model.parameters()]))
    assert torch.equal(params[0], params[1])


def test_sgt_false_runs_in_a_group_of_one_and_is_refused_by_a_sharded_group(pair):
    from types import SimpleNamespace

    from mrl_llm.parallel.group import GroupSpec, WorkerGroup
    from mrl_llm.parallel.share import RankShare

    a, _, ex = pair
    batch = a.build_batch(rows_for(ex, "A", "sgt"))
    named = list(a.model.named_parameters())
    opt = torch.optim.SGD([{"params": [p for n, p in named if "norm" in n], "sgt": False},
                           {"params": [p for n, p in named if "norm" not in n]}], lr=0.0)
    kw = dict(loss_cfg=a.cfg.loss, temperature=1.0, micro_batch=2, grad_accum=None, grad_clip=None, pad_id=a.pad_id)
    res = run_update(a.model, opt, batch, share=RankShare(WorkerGroup.join(GroupSpec(0, 1))), **kw)
    assert res.optimizer_steps == 1 and res.metrics["sgt_loss"] > 0
    with pytest.raises(ValueError, match="sgt: false needs a policy on one rank"):
        run_update(a.model, opt, batch, share=SimpleNamespace(fsdp=True, group=SimpleNamespace(sharded=True)), **kw)
