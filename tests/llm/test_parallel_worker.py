"""A policy worker on a group of 2 FSDP2 ranks (:class:`~mrl_llm.worker.LLMPolicyWorker` with
``WorkerConfig.group``): its steps equal one process's, and its checkpoint (full fp32 weights in the HF
layout, the optimizer state gathered, every file in the sha256 manifest) resumes on k = 1 exactly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from mrl_llm.runstate import verify_manifest
from tests.llm.parallel_ranks import policy_step, policy_worker, register_parity, run_policy_group


def _max_diff(a, b) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    d = tmp_path_factory.mktemp("group")
    return run_policy_group(2, d / "out.pt", d / "ckpt"), d / "ckpt"


def test_two_rank_policy_steps_equal_one_process_and_its_checkpoint_resumes_on_one(two_ranks):
    torch.set_num_threads(1)
    register_parity()
    res, ckpt = two_ranks
    assert res["sharded"]
    one = policy_worker(None)
    start = {k: v.clone() for k, v in one.model.state_dict().items()}
    policy_step(one, 0)
    one0 = {k: v.clone() for k, v in one.model.state_dict().items()}
    policy_step(one, 1)
    assert _max_diff(start, one0) > 1e-4  # the step moved the weights
    # AdamW's first step moves a weight by lr * g / (|g| + eps): a gradient entry near eps (1e-6) that the ranks'
    # reduction sums in another order (~1e-9 apart) moves it up to lr * 1e-9 / eps = 1e-6 apart; a wrong row or
    # normalisation moves weights by ~lr (1e-3)
    assert _max_diff(res["after0"], one0) < 1e-5
    assert _max_diff(res["after1"], one.model.state_dict()) < 1e-5
    assert res["state"]["version"] == 2
    # the rank's HF rollout copy was reload-checked against the sharded masters at every sync
    assert res["drift"]["drift_reload_exceeded"] == 0.0 and res["drift"]["drift_reload_move"] > 1e-4
    assert res["drift"]["drift_reload_err"] <= 1e-6

    verify_manifest(ckpt)  # every file the 2 ranks wrote is in the manifest and matches it
    files = json.loads((ckpt / "manifest.json").read_text())["files"]
    assert {"model/model.safetensors", "model/config.json", "optimizer.pt", "rng.pt", "worker.json"} <= set(files)
    from safetensors.torch import load_file

    saved = load_file(ckpt / "model" / "model.safetensors")  # HF layout, full fp32 tensors
    assert {v.dtype for v in saved.values()} == {torch.float32}
    assert {k: tuple(v.shape) for k, v in saved.items()} == {k: tuple(v.shape) for k, v in one0.items()}

    resumed = policy_worker(None)  # k = 1 resumes the k = 2 checkpoint
    resumed.load_checkpoint(str(ckpt))
    assert _max_diff(resumed.model.state_dict(), one0) < 1e-5
    assert resumed.version == 1
    policy_step(resumed, 1)
    assert _max_diff(resumed.model.state_dict(), one.model.state_dict()) < 1e-5  # (the bound above)
    for w in (one, resumed):
        w.close()


def test_a_checkpoint_gathers_the_optimizer_state_to_rank_0_alone(two_ranks):
    res, ckpt = two_ranks
    # rank 1 holds nothing after the gather; rank 0 the full moments, in one process's layout, what it wrote
    assert json.loads(Path(f"{ckpt.parent / 'out.pt'}.rank1").read_text()) is None
    full, saved = res["optimizer_rank0"], torch.load(ckpt / "optimizer.pt", weights_only=True)
    assert full["state"].keys() == saved["state"].keys() and len(full["state"]) > 0
    for i, st in full["state"].items():
        assert st["exp_avg"].device.type == "cpu" and st["exp_avg"].shape == saved["state"][i]["exp_avg"].shape
        assert torch.equal(st["exp_avg_sq"], saved["state"][i]["exp_avg_sq"])
    assert tuple(full["state"][0]["exp_avg"].shape) == (258, 64)  # gathered: the embedding's full rows


def test_gathered_optimizer_state_outside_a_group_and_of_an_empty_optimizer():
    from mrl_llm.parallel.checkpoint import gathered_optimizer_state

    lin = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(lin.parameters())
    assert gathered_optimizer_state(opt) == {"state": {}, "param_groups": opt.state_dict()["param_groups"]}
    lin(torch.ones(1, 3)).sum().backward()
    opt.step()
    got = gathered_optimizer_state(opt)
    assert torch.equal(got["state"][0]["exp_avg"], opt.state[lin.weight]["exp_avg"])
    assert got["state"][0]["exp_avg"].data_ptr() != opt.state[lin.weight]["exp_avg"].data_ptr()  # a copy
    assert gathered_optimizer_state(opt, rank=1) is None


def test_a_checkpoint_of_another_model_is_refused_naming_the_parameter(two_ranks):
    from mrl_llm.parallel.checkpoint import load_optimizer_state

    _, ckpt = two_ranks
    full = torch.load(ckpt / "optimizer.pt", weights_only=True)
    opt = torch.optim.AdamW(torch.nn.Linear(3, 2).parameters())
    groups = opt.state_dict()["param_groups"]
    with pytest.raises(ValueError, match=r"optimizer state 'exp_avg' of parameter 0 has shape \(258, 64\), the "
                                         r"parameter \(2, 3\); the checkpoint is of another model"):
        load_optimizer_state(opt, {"state": {0: full["state"][0]}, "param_groups": groups})
    with pytest.raises(ValueError, match="optimizer state for parameter 5, but the model has 2"):
        load_optimizer_state(opt, {"state": {5: {"step": torch.tensor(1.0)}}, "param_groups": groups})
    load_optimizer_state(opt, {"state": {}, "param_groups": groups})  # empty: a fresh optimizer, fine
    assert opt.state_dict()["state"] == {}


def test_the_single_process_runtime_says_it_runs_ranks_as_one(tmp_path, caplog, monkeypatch):
    import logging

    from mrl_llm.trainer import train
    from tests.llm.helpers import ShortAnswerVerifier, install_verifier
    from tests.llm.test_ray import PROBLEMS, config, policy

    install_verifier(monkeypatch, type("Short8", (ShortAnswerVerifier,), {"name": "short8"})(max_chars=8))
    caplog.set_level(logging.WARNING, logger="mrl_llm.trainer")
    cfg = config([{**policy("a", "llama", "utf8-bytes", 4), "ranks": 2}], steps=1, regime="grpo",
                 runtime={"backend": "local"}, eval={"enabled": False})
    train(cfg, tmp_path / "run", problems=PROBLEMS)
    assert any("policy a: ranks 2 applies to --runtime ray; the single-process runtime trains it as one rank"
               in m for m in caplog.messages)
    assert (tmp_path / "run" / "policies" / "a" / "model.safetensors").is_file()


def test_a_rank_shards_its_model_and_reference_in_the_configured_fsdp_unit(monkeypatch):
    """``train.fsdp_unit`` reaches :func:`shard_model` for the trained model and the reference alike, and
    ``train.grad_sync`` the rank's :class:`~mrl_llm.parallel.share.RankShare`."""
    import mrl_llm.rank.model as rank_model
    from mrl_llm.config import PolicyConfig, TrainSection
    from mrl_llm.models import load_tokenizer
    from mrl_llm.parallel.group import GroupSpec, WorkerGroup
    from mrl_llm.precision import Precision
    from tests.llm.helpers import tiny

    units = []
    monkeypatch.setattr(rank_model, "shard_model", lambda m, p, g, *, unit: units.append(unit) or m)

    for unit, with_ref in (("model", True), ("layer", False)):
        pol = PolicyConfig(name="A", model_config=tiny("llama"), tokenizer_dir="utf8-bytes", device="cpu",
                           train=TrainSection(fsdp_unit=unit))
        rank_model.PolicyModel(pol, load_tokenizer(pol), precision=Precision("fp32"),
                               group=WorkerGroup(GroupSpec(rank=0, world_size=1)), device=torch.device("cpu"),
                               init_seed=0, with_ref=with_ref)
    assert units == ["model", "model", "layer"]
    units.clear()
    pol = PolicyConfig(name="A", model_config=tiny("llama"), tokenizer_dir="utf8-bytes", device="cpu",
                       train=TrainSection(fsdp_unit="none"))
    pm = rank_model.PolicyModel(pol, load_tokenizer(pol), precision=Precision("fp32"),  # replicas: no collective here
                                group=WorkerGroup(GroupSpec(rank=1, world_size=2, port=1)), device=torch.device("cpu"),
                                init_seed=0, with_ref=True)
    assert units == ["none", "none"] and not pm.sharded and pm.share.replicated and not pm.share.fsdp
    assert pm.rollout_model is pm.model  # the engine samples from the model itself, as with one rank
    pol = PolicyConfig(name="A", model_config=tiny("llama"), tokenizer_dir="utf8-bytes", device="cpu",
                       train=TrainSection(grad_sync="mini_batch"))
    pm = rank_model.PolicyModel(pol, load_tokenizer(pol), precision=Precision("fp32"),  # shard_model is stubbed
                                group=WorkerGroup(GroupSpec(rank=1, world_size=2, port=1)), device=torch.device("cpu"),
                                init_seed=0, with_ref=False)
    assert pm.share.grad_sync == "mini_batch" and pm.share.accumulates  # train.grad_sync reaches the rank's share
