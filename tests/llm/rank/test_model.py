"""The trainable state (:mod:`mrl_llm.rank.model`) alone: a tiny model on a group of one."""

from __future__ import annotations

import torch

from mrl_llm.byte_tokenizer import byte_tokenizer
from mrl_llm.config import PolicyConfig, TrainSection
from mrl_llm.parallel.group import GroupSpec, WorkerGroup
from mrl_llm.param_groups import LrGroup
from mrl_llm.precision import Precision
from mrl_llm.rank.model import PolicyModel, make_optimizer, rollout_copy_device
from mrl_llm.update import UpdateResult
from tests.llm.helpers import tiny


def policy(dtype: str = "fp32", **train) -> PolicyConfig:
    return PolicyConfig(name="a", model_config=tiny("llama", num_hidden_layers=1), tokenizer_dir="utf8-bytes",
                        dtype=dtype, train=TrainSection(**train))


def model(pol: PolicyConfig, *, with_ref: bool) -> PolicyModel:
    return PolicyModel(pol, byte_tokenizer(), precision=Precision(pol.dtype), group=WorkerGroup.join(GroupSpec(0, 1)),
                       device=torch.device("cpu"), init_seed=0, with_ref=with_ref)


def test_a_group_of_one_trains_fp32_masters_and_samples_from_them():
    pm = model(policy("bf16"), with_ref=True)
    assert pm.rollout_model is pm.model and pm.share.group.world_size == 1
    assert {p.dtype for p in pm.model.parameters()} == {torch.float32}
    assert {p.dtype for p in pm.ref_model.parameters()} == {torch.bfloat16}
    assert not any(p.requires_grad for p in pm.ref_model.parameters())
    assert pm.max_positions == 512 and model(policy(), with_ref=False).ref_model is None
    assert pm.optimizer_state() == pm.optimizer.state_dict()


def test_a_rank_without_an_engine_keeps_its_rollout_copy_in_host_memory():
    gpu, cpu = torch.device("cuda", 1), torch.device("cpu")
    assert rollout_copy_device(gpu, engine=True) == gpu  # the engine samples from (or reloads out of) it
    assert rollout_copy_device(gpu, engine=False) == cpu  # a split trainer: it goes to host-bound consumers only
    assert rollout_copy_device(cpu, engine=False) == cpu and rollout_copy_device(cpu, engine=True) == cpu
    # a group of one has no copy to place: the engine samples from the masters wherever they are
    pm = PolicyModel(policy(), byte_tokenizer(), precision=Precision("fp32"), group=WorkerGroup.join(GroupSpec(0, 1)),
                     device=cpu, init_seed=0, with_ref=False, rollout_device=torch.device("meta"))
    assert pm.rollout_model is pm.model and next(pm.model.parameters()).device == cpu


def test_the_same_seed_builds_the_same_weights_without_touching_the_global_rng():
    torch.manual_seed(123)
    before = torch.get_rng_state()
    a, b = model(policy(), with_ref=False), model(policy(), with_ref=False)
    assert torch.equal(torch.get_rng_state(), before)
    assert all(torch.equal(x, y) for x, y in zip(a.model.parameters(), b.model.parameters(), strict=True))


def test_make_optimizer_freezes_what_no_group_steps():
    pol = policy(optimizer="sgd", lr=0.1, lr_groups=(LrGroup(match="model.embed_tokens.*", lr=0.0),
                                                     LrGroup(match="model.norm.*", lr=0.5)))
    pm = model(pol, with_ref=False)
    frozen = [n for n, p in pm.model.named_parameters() if not p.requires_grad]
    assert frozen == ["model.embed_tokens.weight"]
    assert isinstance(pm.optimizer, torch.optim.SGD) and [g["lr"] for g in pm.optimizer.param_groups] == [0.5, 0.1]
    assert sum(len(g["params"]) for g in pm.optimizer.param_groups) == len(list(pm.model.parameters())) - 1
    adam = make_optimizer(model(policy(lr=0.2), with_ref=False).model, policy(lr=0.2))
    assert isinstance(adam, torch.optim.AdamW) and [g["lr"] for g in adam.param_groups] == [0.2]


def test_the_optimizers_are_multi_tensor_and_step_as_the_one_parameter_at_a_time_loop():
    for name, cls in (("adamw", torch.optim.AdamW), ("adam", torch.optim.Adam), ("sgd", torch.optim.SGD)):
        pol = policy(optimizer=name, lr=1e-2, weight_decay=0.01)
        fast, slow = model(pol, with_ref=False).model, model(pol, with_ref=False).model
        opt = make_optimizer(fast, pol)
        assert opt.defaults["foreach"] is True, name
        kw = {"betas": tuple(pol.train.betas), "eps": pol.train.eps} if name != "sgd" else {}
        ref = cls(slow.parameters(), lr=1e-2, weight_decay=0.01, foreach=False, **kw)
        for step in range(3):
            for m, o in ((fast, opt), (slow, ref)):
                o.zero_grad()
                m(torch.arange(step + 2)[None]).logits.square().mean().backward()
                o.step()
        for (n, a), b in zip(fast.named_parameters(), slow.parameters(), strict=True):
            assert torch.allclose(a, b, atol=1e-6, rtol=0), (name, n)


def test_update_flops_count_6n_per_trained_and_2n_per_reference_or_snapshot_token():
    pm = model(policy(), with_ref=False)
    n = pm.params["flops"]
    res = UpdateResult()
    assert pm.update_flops(res) == 0.0
    res.seq_tokens, res.ref_seq_tokens, res.old_seq_tokens = 10, 4, 3
    assert pm.update_flops(res) == 6.0 * n * 10 + 2.0 * n * 7
