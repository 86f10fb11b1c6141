"""``mrl_llm plan``: the plan printed from a config file, and a refusal that says what does not fit."""

from __future__ import annotations

import yaml

from mrl_llm.distributed.plan_cli import footprints_from_config, main

from .specs import CLUSTERS, paper_pair

PAPER = {
    "prompts_per_step": 128,
    "policies": [
        {"name": "qwen2.5-math-1.5b", "model_dir": "models/Qwen2.5-Math-1.5B", "dtype": "bf16", "group_size": 8,
         "sampling": {"max_new_tokens": 3072}, "max_prompt_len": 1024,
         "train": {"micro_batch": 4, "gradient_checkpointing": True}, "engine": "vllm"},
        {"name": "qwen3-1.7b-base", "model_dir": "models/Qwen3-1.7B-Base", "dtype": "bfloat16", "group_size": 8,
         "sampling": {"max_new_tokens": 3072}, "max_prompt_len": 1024,
         "train": {"micro_batch": 4, "gradient_checkpointing": True}, "engine": "vllm"},
    ],
    "loss": {"kl_coef": 0.001},
}


def test_config_adapter_reads_the_planner_numbers() -> None:
    assert footprints_from_config(PAPER) == paper_pair()


def test_plan_cli_prints_and_refuses(tmp_path, capsys) -> None:
    cfg = tmp_path / "paper.yaml"
    cfg.write_text(yaml.safe_dump(PAPER))
    assert main(["--config", str(cfg), "--cluster", str(CLUSTERS / "8xA100-80GB.yaml")]) == 0
    out = capsys.readouterr().out
    assert "mode=colocated" in out and "node0/gpu7" in out and "optimizer" in out
    assert main(["--config", str(cfg), "--cluster", str(CLUSTERS / "1xH200-141GB.yaml")]) == 0
    assert main(["--config", str(cfg), "--cluster", str(CLUSTERS / "cpu-2core-24GiB.yaml")]) == 2
    err = capsys.readouterr().err
    assert "does not fit" in err and "short by" in err and "GiB" in err
    tiny = {"policies": [{"name": "t", "model_config": {"model_type": "llama", "hidden_size": 32,
                                                          "intermediate_size": 64, "num_hidden_layers": 2,
                                                          "num_attention_heads": 4, "vocab_size": 100},
                          "dtype": "fp32", "group_size": 4}]}
    cfg.write_text(yaml.safe_dump(tiny))
    assert main(["--config", str(cfg), "--cluster", str(CLUSTERS / "cpu-2core-24GiB.yaml")]) == 0
    assert "mode=cpu" in capsys.readouterr().out
    cfg.write_text(yaml.safe_dump({"policies": [{"name": "x", "model_dir": "nowhere/xyz"}]}))
    assert main(["--config", str(cfg)]) == 2
    assert "not a known architecture" in capsys.readouterr().err


def test_config_adapter_reads_the_optimizer() -> None:
    import pytest

    from mrl_llm.distributed.memory import training_bytes
    from shared_interfaces.config_io import ConfigError

    def with_opt(opt: str | None) -> dict:
        pols = [dict(p) | {"train": dict(p["train"]) | ({"optimizer": opt} if opt else {})} for p in PAPER["policies"]]
        return PAPER | {"policies": pols}

    assert [f.optimizer for f in footprints_from_config(with_opt(None))] == ["adamw", "adamw"]
    assert [f.optimizer for f in footprints_from_config(with_opt("adam"))] == ["adamw", "adamw"]  # same two moments
    sgd = footprints_from_config(with_opt("sgd"))
    assert [f.optimizer for f in sgd] == ["sgd", "sgd"] and training_bytes(sgd[0]).optimizer == 0  # no state
    with pytest.raises(ConfigError, match=r"policies\[0\].train.optimizer must be one of"):
        footprints_from_config(with_opt("lion"))
