"""``train.lr_groups``: per-parameter-name learning rates (first matching glob wins, lr 0 freezes), validated
at the config boundary and by the worker that builds the optimizer."""

from __future__ import annotations

import pytest
import torch

from mrl_llm.config import PolicyConfig, config_from_mapping
from mrl_llm.param_groups import LrGroup, split_param_groups
from mrl_llm.worker import LLMPolicyWorker, WorkerConfig
from shared_interfaces.config_io import ConfigError
from tests.llm.helpers import tiny


def _named():
    return [(n, torch.nn.Parameter(torch.zeros(2))) for n in
            ("model.embed_tokens.weight", "model.layers.0.input_layernorm.weight",
             "model.layers.0.mlp.up_proj.weight", "model.norm.weight")]


def test_split_first_match_wins_and_the_rest_keep_the_base_lr():
    groups = split_param_groups(_named(), [LrGroup("model.norm.*", 1e-2), LrGroup("*norm*", 1e-3)], 1e-4,
                                policy="a")
    assert [(g["lr"], g["names"]) for g in groups] == [
        (1e-2, ["model.norm.weight"]),
        (1e-3, ["model.layers.0.input_layernorm.weight"]),
        (1e-4, ["model.embed_tokens.weight", "model.layers.0.mlp.up_proj.weight"]),
    ]


def test_split_lr_zero_leaves_the_parameters_out_and_empty_groups_keep_everything():
    frozen = split_param_groups(_named(), [LrGroup("*embed_tokens*", 0.0)], 1e-4, policy="a")
    assert [g["names"] for g in frozen] == [["model.layers.0.input_layernorm.weight",
                                             "model.layers.0.mlp.up_proj.weight", "model.norm.weight"]]
    (only,) = split_param_groups(_named(), [], 1e-4, policy="a")
    assert only["lr"] == 1e-4 and len(only["params"]) == 4
    assert split_param_groups([], [], 1e-4, policy="a") == []


def test_split_skips_parameters_that_do_not_require_grad():
    named = _named()
    named[0][1].requires_grad_(False)
    (only,) = split_param_groups(named, [], 1e-4, policy="a")
    assert "model.embed_tokens.weight" not in only["names"]


@pytest.mark.parametrize("groups, match", [
    ([LrGroup("*nrom*", 1e-2)], "'a'.*'\\*nrom\\*' matches no trainable parameter"),
    ([LrGroup("*", 1e-2), LrGroup("*norm*", 1e-3)], "earlier group took them all"),
    ([LrGroup("*", 0.0)], "freeze every parameter"),
])
def test_split_bad_groups_are_errors_naming_the_policy(groups, match):
    with pytest.raises(ConfigError, match=match):
        split_param_groups(_named(), groups, 1e-4, policy="a")


def _cfg(lr_groups):
    return {"policies": [{"name": "a", "model_config": tiny("llama"), "tokenizer_dir": "utf8-bytes",
                          "train": {"lr": 1e-4, "lr_groups": lr_groups}}]}


def test_config_reads_lr_groups():
    cfg = config_from_mapping(_cfg([{"match": "*norm*", "lr": 0.01}, {"match": "*embed*", "lr": 0}]))
    assert cfg.policies[0].train.lr_groups == (LrGroup("*norm*", 0.01), LrGroup("*embed*", 0.0))
    kept = config_from_mapping(_cfg([{"match": "*norm*", "lr": 0.01, "sgt": False}]))
    assert kept.policies[0].train.lr_groups == (LrGroup("*norm*", 0.01, sgt=False),)


def test_split_carries_each_groups_sgt_flag():
    groups = split_param_groups(_named(), [LrGroup("*norm*", 1e-2, sgt=False)], 1e-4, policy="a")
    assert [(g["sgt"], len(g["params"])) for g in groups] == [(False, 2), (True, 2)]


def test_sgt_false_needs_one_rank_or_replicas():
    mapping = _cfg([{"match": "*norm*", "lr": 0.01, "sgt": False}])
    mapping["policies"][0]["ranks"] = 2
    with pytest.raises(ConfigError, match="sgt: false needs ranks: 1 or train.fsdp_unit: none"):
        config_from_mapping(mapping)
    mapping["policies"][0]["train"] = {**mapping["policies"][0].get("train", {}), "fsdp_unit": "none"}
    assert config_from_mapping(mapping).policies[0].train.fsdp_unit == "none"  # replicas back-propagate it apart


@pytest.mark.parametrize("lr_groups, match", [
    ([{"match": "*norm*", "lr": -1e-3}], "lr must be >= 0"),
    ([{"match": "", "lr": 1e-3}], "non-empty glob"),
    ([{"match": "*norm*"}], "missing required key.*lr"),
    ([{"match": "*norm*", "lr": 1e-3, "beta": 1}], "unknown key.*beta"),
    ([{"match": "*norm*", "lr": "fast"}], "expected a number"),
    ([{"match": "*norm*", "lr": 1e-3, "sgt": "no"}], "sgt"),
    ({"*norm*": 1e-3}, "expected a list"),
])
def test_config_bad_lr_groups_are_errors(lr_groups, match):
    with pytest.raises(ConfigError, match=match):
        config_from_mapping(_cfg(lr_groups))


def _worker(lr_groups):
    pol = PolicyConfig(name="a", model_config=tiny("llama"), tokenizer_dir="utf8-bytes", engine="hf",
                       train=config_from_mapping(_cfg(lr_groups)).policies[0].train)
    return LLMPolicyWorker("a", WorkerConfig(policy=pol), seed=0)


def test_worker_optimizer_uses_the_groups_and_freezes_lr_zero():
    w = _worker([{"match": "*norm*", "lr": 0.01}, {"match": "*embed_tokens*", "lr": 0}])
    names = {id(p): n for n, p in w.model.named_parameters()}
    lrs = {names[id(p)]: g["lr"] for g in w.optimizer.param_groups for p in g["params"]}
    assert lrs["model.norm.weight"] == 0.01
    assert all(v == 1e-4 for n, v in lrs.items() if "norm" not in n)
    emb = dict(w.model.named_parameters())["model.embed_tokens.weight"]
    assert "model.embed_tokens.weight" not in lrs and not emb.requires_grad


def test_worker_glob_matching_nothing_is_a_config_error():
    with pytest.raises(ConfigError, match="policy 'a': train.lr_groups match '\\*ln_f\\*'"):
        _worker([{"match": "*ln_f*", "lr": 0.01}])
