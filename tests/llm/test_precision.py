"""Mixed precision (:mod:`mrl_llm.precision`): under ``dtype: bf16`` the trainer keeps fp32 master weights
and fp32 AdamW state and computes under bf16 autocast, so lr-1e-6 updates are not rounded away; the
autocast gradient matches the fp32 one; checkpoints hold the masters (resume exact), exports the dtype."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from mrl_llm.config import PolicyConfig, SamplingSection, TrainSection
from mrl_llm.distributed.actors import fetch_learner_rows
from mrl_llm.precision import Precision, lowp_copy, master_check
from mrl_llm.update import run_update
from mrl_llm.worker import LLMPolicyWorker, WorkerConfig
from shared_interfaces.exchange import InMemoryExchange
from shared_interfaces.regimes import parse_regime
from shared_interfaces.regimes.config import LossConfig
from tests.llm.helpers import ShortAnswerVerifier, install_verifier, problems, tiny
from tests.llm.test_resume import assert_same, outputs, small_config


class ParityVerifier(ShortAnswerVerifier):
    """Success iff the response's byte sum is even: about half of a random model's samples, so every
    group has reward variance from step 0."""

    name = "parity"

    def score(self, response, gold, *, finish_reason="stop", choices=()):
        from mrl_llm.rewards import Verdict
        from mrl_llm.rewards.verdict import CORRECT, WRONG

        ok = sum(response.encode()) % 2 == 0
        return self.stats.record(Verdict(1.0, CORRECT) if ok else Verdict(0.0, WRONG), gold)


class GradCapture(torch.optim.Optimizer):
    """An 'optimizer' whose step records the accumulated gradients (and changes nothing)."""

    def __init__(self, params):
        super().__init__(list(params), {})
        self.grads: list[torch.Tensor] = []

    def step(self, closure=None):
        self.grads.append(torch.cat([p.grad.flatten().float() for g in self.param_groups for p in g["params"]]))


def _worker(monkeypatch, *, dtype: str, lr: float = 1e-6, kl: float = 0.0) -> LLMPolicyWorker:
    install_verifier(monkeypatch, ParityVerifier())
    pol = PolicyConfig(name="A", model_config=tiny("llama"), tokenizer_dir="utf8-bytes", group_size=8, dtype=dtype,
                       device="cpu", sampling=SamplingSection(max_new_tokens=8),
                       train=TrainSection(lr=lr, micro_batch=8, grad_clip=None, weight_decay=0.0))
    return LLMPolicyWorker("A", WorkerConfig(policy=pol, loss=LossConfig(kl_coef=kl)), seed=0)


def _rows(w: LLMPolicyWorker, ex: InMemoryExchange, step: int):
    probs = [p.__class__(**{**p.__dict__, "verifier": "parity"}) for p in problems(4)]
    ex.publish(w.generate(probs, step))
    rows, _ = fetch_learner_rows(ex, "A", parse_regime("grpo"), [p.prompt_id for p in probs], step, present=["A"])
    return rows


def test_bf16_policy_keeps_fp32_masters_and_fp32_adamw_state_with_a_bf16_reference(monkeypatch):
    w = _worker(monkeypatch, dtype="bf16")
    w.train_step(_rows(w, InMemoryExchange(), 0))
    assert master_check(w.model, w.optimizer) == []
    assert w.optimizer.state  # AdamW state exists, and it is fp32 (master_check)
    assert {p.dtype for p in w.ref_model.parameters()} == {torch.bfloat16}
    fp32 = _worker(monkeypatch, dtype="fp32")
    assert {p.dtype for p in fp32.ref_model.parameters()} == {torch.float32}
    assert not Precision("fp32").mixed and Precision("bf16").mixed


def test_bf16_ten_adamw_steps_at_lr_1e6_move_the_master_weights(monkeypatch):
    w = _worker(monkeypatch, dtype="bf16")
    start = {n: p.detach().clone() for n, p in w.model.named_parameters()}
    touched = {n: torch.zeros_like(p, dtype=torch.bool) for n, p in w.model.named_parameters()}

    def hook(n):
        def mark(p) -> None:
            touched[n].logical_or_(p.grad != 0)
        return mark

    for n, p in w.model.named_parameters():
        p.register_post_accumulate_grad_hook(hook(n))
    ex = InMemoryExchange()
    for s in range(10):
        m = w.train_step(_rows(w, ex, s))
        assert m["nan_skipped"] == 0
    assert w.counters["optimizer_steps"] == 10
    n_touched = sum(int(t.sum()) for t in touched.values())
    moved = sum(int(((p.detach() != start[n]) & touched[n]).sum()) for n, p in w.model.named_parameters())
    assert n_touched > 10_000
    assert moved / n_touched > 0.9, (moved, n_touched)


def test_the_same_updates_on_bf16_parameters_are_rounded_away():
    """The control the previous test guards against: AdamW stepping bf16 parameters (the old bf16 path)
    at lr 1e-6 leaves almost every entry of a std-0.02 matrix unchanged; fp32 masters move them all."""
    torch.manual_seed(0)
    w0 = torch.randn(256, 256) * 0.02
    changed = {}
    for dt in (torch.bfloat16, torch.float32):
        p = torch.nn.Parameter(w0.to(dt).clone())
        opt = torch.optim.AdamW([p], lr=1e-6, weight_decay=0.0)
        start = p.detach().clone()
        for _ in range(10):
            p.grad = torch.randn_like(p)
            opt.step()
        changed[dt] = float((p.detach() != start).float().mean())
    assert changed[torch.bfloat16] < 0.2 and changed[torch.float32] > 0.99


def test_bf16_autocast_gradient_matches_fp32_on_a_fixed_batch(monkeypatch):
    w = _worker(monkeypatch, dtype="fp32", kl=0.05)
    batch = w.build_batch(_rows(w, InMemoryExchange(), 0))
    assert len(batch) == 32
    out = {}
    for dtype in ("fp32", "bf16"):
        opt = GradCapture(w.model.parameters())
        ref = lowp_copy(w.model, Precision(dtype).compute_dtype)
        res = run_update(w.model, opt, batch, loss_cfg=w.cfg.loss, temperature=1.0, micro_batch=8,
                         grad_accum=None, grad_clip=None, pad_id=w.pad_id, ref_model=ref,
                         autocast=functools.partial(Precision(dtype).autocast, "cpu"))
        out[dtype] = (opt.grads[0], res.metrics["loss"])
    g32, g16 = out["fp32"][0], out["bf16"][0]
    cos = float(torch.nn.functional.cosine_similarity(g32.double(), g16.double(), dim=0))
    assert cos >= 0.99, cos
    l32, l16 = out["fp32"][1], out["bf16"][1]
    # at ratio 1 the token-mean loss is -sum(A * len) / sum(len): 0 up to float error when every response has
    # the same length (the group advantages sum to 0), so 1% of the terms' size, mean |A|, is the floor
    scale = max(abs(l32), float(torch.as_tensor(batch.rows.advantages).abs().mean()))
    assert abs(l16 - l32) <= 0.01 * scale, (l32, l16, scale)


def test_checkpoint_holds_fp32_masters_and_the_export_is_bf16(monkeypatch, tmp_path):
    w = _worker(monkeypatch, dtype="bf16")
    w.train_step(_rows(w, InMemoryExchange(), 0))
    w.save_checkpoint(str(tmp_path / "ck"))
    w.export(tmp_path / "pol")
    ck = load_file(tmp_path / "ck" / "model" / "model.safetensors")
    ex = load_file(tmp_path / "pol" / "model.safetensors")
    assert {t.dtype for t in ck.values()} == {torch.float32} and {t.dtype for t in ex.values()} == {torch.bfloat16}
    assert json.loads((tmp_path / "pol" / "mrl_policy.json").read_text())["weights_dtype"] == "bf16"
    masters = {n: p.detach().clone() for n, p in w.model.named_parameters()}
    w2 = _worker(monkeypatch, dtype="bf16")
    w2.load_checkpoint(str(tmp_path / "ck"))
    for n, p in w2.model.named_parameters():
        assert p.dtype == torch.float32 and torch.equal(p.detach(), masters[n]), n


def _bf16(cfg):
    from dataclasses import replace

    return replace(cfg, policies=tuple(replace(p, dtype="bf16") for p in cfg.policies))


@pytest.fixture
def short8(monkeypatch):
    install_verifier(monkeypatch, ShortAnswerVerifier(max_chars=8))


def test_bf16_run_resume_equals_uninterrupted(tmp_path, short8):
    from mrl_llm.trainer import train

    probs, evp = problems(5), problems(3, prefix="e")
    train(_bf16(small_config(3)), tmp_path / "a", problems=probs, eval_problems=evp)
    train(_bf16(small_config(1)), tmp_path / "b", problems=probs, eval_problems=evp)
    train(_bf16(small_config(3)), tmp_path / "b", resume=True, problems=probs, eval_problems=evp)
    assert_same(outputs(tmp_path / "a"), outputs(tmp_path / "b"), drop_eval_steps=(1,))
    models = sorted(Path(tmp_path / "b").rglob("model/model.safetensors"))
    assert models and all({t.dtype for t in load_file(m).values()} == {torch.float32} for m in models)


def _grad_accum_worker(monkeypatch, dtype: str) -> LLMPolicyWorker:
    """A tiny policy whose step of 32 rows is four mini-batches (``grad_accum: 1`` x ``micro_batch: 8``): four
    optimizer steps a step, at a learning rate large enough that the later mini-batches' ratio to pi_old moves."""
    install_verifier(monkeypatch, ParityVerifier())
    pol = PolicyConfig(name="A", model_config=tiny("llama"), tokenizer_dir="utf8-bytes", group_size=8, dtype=dtype,
                       device="cpu", sampling=SamplingSection(max_new_tokens=8),
                       train=TrainSection(lr=1e-2, micro_batch=8, grad_accum=1, grad_clip=None, weight_decay=0.0))
    return LLMPolicyWorker("A", WorkerConfig(policy=pol, loss=LossConfig(kl_coef=0.0)), seed=0)


def test_bf16_minibatches_after_the_first_see_the_updated_weights(monkeypatch):
    """Autocast caches its bf16 casts of the fp32 masters for as long as its region lasts: one region around
    the whole update ran every mini-batch after the first on the start-of-step weights (``approx_kl_old``
    ~0.1x the fp32 run's). Per micro-batch regions (:func:`mrl_llm.update.run_update`) see every step."""
    w32 = _grad_accum_worker(monkeypatch, "fp32")
    batch = w32.build_batch(_rows(w32, InMemoryExchange(), 0))
    assert len(batch) == 32
    kl = {}
    for dtype in ("fp32", "bf16"):
        w = _grad_accum_worker(monkeypatch, dtype)  # the same initial weights (seed 0) and the same batch
        res = w.policy_model.update(batch, w.policy, loss_cfg=w.loss_cfg, pad_id=w.pad_id)
        assert res.optimizer_steps == 4 and not res.nan_skipped
        kl[dtype] = res.metrics["approx_kl_old"]
    assert kl["fp32"] > 1e-3, kl  # the weights do move within the step
    assert 0.5 <= kl["bf16"] / kl["fp32"] <= 2.0, kl
