"""The typed config: unknown keys and bad values are errors naming the key; paths resolve; presets load
(and the planner still reads them); missing models and tokenizers fail with what to do."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from mrl_llm.config import config_from_mapping, expand_path, load_config
from mrl_llm.distributed.plan_cli import main as plan_main
from mrl_llm.models import ModelLoadError, build_model, load_tokenizer
from mrl_llm.worker import LLMPolicyWorker, WorkerConfig
from shared_interfaces.config_io import ConfigError
from tests.llm.helpers import tiny

REPO = Path(__file__).resolve().parents[2]
CONFIGS = sorted((REPO / "experiments" / "configs").glob("*.yaml"))
CLUSTERS = REPO / "experiments" / "configs" / "clusters"


def base(**top):
    pol = {"name": "a", "model_config": tiny("llama"), "tokenizer_dir": "utf8-bytes"}
    return {"policies": [pol], **top}


@pytest.mark.parametrize("data, key", [
    (base(stepz=3), "stepz"),
    ({"policies": [{"name": "a", "model_config": tiny("llama"), "colour": 1}]}, "colour"),
    ({"policies": [{"name": "a", "model_config": tiny("llama"), "train": {"lrr": 1}}]}, "lrr"),
    ({"policies": [{"name": "a", "model_config": tiny("llama"), "sampling": {"topp": 1}}]}, "topp"),
    (base(loss={"kl": 0.1}), "kl"),
    (base(regime={"name": "sgt", "sgtt": {}}), "sgtt"),
    (base(eval={"kk": 2}), "kk"),
    (base(data={"path": "x.jsonl", "feilds": {}}), "feilds"),
])
def test_unknown_keys_are_errors_naming_the_key(data, key):
    with pytest.raises(ConfigError, match=key):
        config_from_mapping(data)


@pytest.mark.parametrize("data, match", [
    ({"policies": []}, "at least one policy"),
    ({"policies": [{"name": "a"}]}, "exactly one of model_dir"),
    ({"policies": [{"name": "a", "model_dir": "m", "model_config": tiny("llama")}]}, "exactly one of model_dir"),
    ({"policies": [{"name": "a", "model_config": {"hidden_size": 8}}]}, "model_type"),
    ({"policies": [{"name": "a", "model_dir": "m"}, {"name": "a", "model_dir": "n"}]}, "unique"),
    ({"policies": [{"name": "a", "model_dir": "m", "dtype": "fp8"}]}, "dtype"),
    ({"policies": [{"name": "a", "model_dir": "m", "engine": "tgi"}]}, "engine"),
    ({"policies": [{"name": "a", "model_dir": "m", "train": {"lr": 0}}]}, "lr must be > 0"),
    ({"policies": [{"name": "a", "model_dir": "m", "engine_args": {"enforce_eager": True}}]},
     r"engine_args \['enforce_eager'\] are vllm.LLM's and the policy's engine is 'hf'"),
    ({"policies": [{"name": "a", "model_dir": "m", "join_step": 2}]}, "or pass --runtime ray"),
    ({"policies": [{"name": "a", "model_dir": "m", "train": {"eps": -1}}]}, r"policies\[0\].*train.eps must be > 0"),
    ({"policies": [{"name": "a", "model_dir": "m", "train": {"weight_decay": -5}}]}, "weight_decay must be >= 0"),
    ({"policies": [{"name": "a", "model_dir": "m", "train": {"betas": [1.5, 0.9]}}]}, r"betas must be in \[0, 1\)"),
    ({"policies": [{"name": "a", "model_dir": "m", "train": {"fsdp_unit": "block"}}]}, "fsdp_unit"),
    ({"policies": [{"name": "a", "model_dir": "m", "train": {"grad_sync": "step"}}]}, "grad_sync"),
    ({"policies": [{"name": "a", "model_dir": "m", "sampling": {"top_p": 1.5}}]}, "top_p"),
    ({"policies": [{"name": "a", "model_dir": "m", "engine": "vllm", "sampling": {"top_p": 0.9}}]},
     r"policy 'a': sampling: the vllm engine records log-probs renormalised .* use top_p=1.0 or the hf engine"),
    ({"policies": [{"name": "a", "model_dir": "m", "engine": "vllm", "sampling": {"temperature": 0.005}}]},
     r"policy 'a': sampling: the vllm engine samples at temperature 0.01 at least"),
    ({"policies": [{"name": "a", "model_dir": "m", "engine": "vllm"}], "eval": {"top_p": 0.95}},
     r"eval \(policy 'a''s engine\): the vllm engine records log-probs renormalised"),
    (base(regime={"name": "prp_thl+xgrpo"}), "combines bases"),
    (base(regime={"name": "ppo"}), "unknown regime component"),
    (base(loss={"agg": "sum"}), "agg"),
    (base(steps=-1), "steps"),
])
def test_bad_values_are_errors(data, match):
    with pytest.raises(ConfigError, match=match):
        config_from_mapping(data)


def test_vllm_sampling_limits_apply_only_where_the_vllm_engine_samples():
    hf = {"name": "a", "model_dir": "m", "sampling": {"top_p": 0.9, "temperature": 0.005}}
    config_from_mapping({"policies": [hf], "eval": {"top_p": 0.9}})
    vllm = {"name": "b", "model_dir": "m", "engine": "vllm"}
    config_from_mapping({"policies": [vllm], "eval": {"top_p": 0.9, "k": 0}})  # no sampled evaluation
    config_from_mapping({"policies": [vllm], "eval": {"top_p": 0.9, "enabled": False}})
    config_from_mapping({"policies": [vllm], "eval": {"temperature": 0.01}})  # vLLM's floor itself is fine


def test_paths_aliases_and_overrides(tmp_path, monkeypatch):
    cfg_file = tmp_path / "sub" / "run.yaml"
    cfg_file.parent.mkdir()
    monkeypatch.setenv("MY_MODELS", str(tmp_path / "models"))
    cfg_file.write_text(yaml.safe_dump({
        "regime": {"name": "sgt", "sgt": {"weight": 0.5}},
        "data": {"path": "../train.jsonl", "fields": {"question": "problem", "answer": "solution"}},
        "policies": [{"name": "a", "model_dir": "${MY_MODELS}/m1", "dtype": "bfloat16",
                      "tokenizer_dir": "${UNSET_VAR_XYZ:-toks}/t"}],
    }))
    cfg = load_config(cfg_file)
    assert cfg.data.path == str(tmp_path / "train.jsonl") and cfg.data.fields.question == "problem"
    pol = cfg.policies[0]
    assert pol.model_dir == str(tmp_path / "models" / "m1") and pol.dtype == "bf16"
    assert pol.tokenizer_dir == str(tmp_path / "sub" / "toks" / "t")
    sgt_x = cfg.with_regime("sgt+xgrpo")
    assert sgt_x.regime_spec.name == "sgt+xgrpo" and sgt_x.regime_spec.sgt.weight == 0.5
    with pytest.raises(ConfigError, match="unknown regime"):
        cfg.with_regime("nope")
    with pytest.raises(ConfigError, match="UNSET_VAR_XYZ"):
        expand_path("${UNSET_VAR_XYZ}/x", tmp_path)
    cfg_file.write_text("policies: [{name: a, model_dir: {x}")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(cfg_file)


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_presets_load_and_the_planner_reads_them(path, shared_dir, capsys):
    cfg = load_config(path)
    assert len(cfg.policies) == 2
    names = {p.name for p in cfg.policies}
    assert len(names) == 2
    if path.name.startswith("paper_"):
        assert cfg.loss.clip_high == 0.28 and cfg.loss.kl_coef == 0.001 and cfg.loss.agg == "token-mean"
        assert all(p.dtype == "bf16" and p.group_size == 8 and p.train.lr == 1e-6 and p.train.gradient_checkpointing
                   for p in cfg.policies)
        assert cfg.eval.data is not None and Path(cfg.eval.data.path).is_file()  # MATH-500 from ../shared
    # a paper preset's header gives its plan command: it runs as written, and fits; the CPU config fits this machine
    named = re.findall(r"^#\s+python -m mrl_llm plan\s+--config \S+ --cluster (\S+)$", path.read_text(), re.M)
    assert len(named) == path.name.startswith("paper_")
    cluster = REPO / named[0] if named else CLUSTERS / "cpu-2core-24GiB.yaml"
    assert plan_main(["--config", str(path), "--cluster", str(cluster)]) == 0, capsys.readouterr().err


def test_paper_preset_without_weights_fails_clearly(shared_dir):
    cfg = load_config(REPO / "experiments" / "configs" / "paper_math_qwen25math_qwen3.yaml")
    pol = cfg.policies[0]
    with pytest.raises(ModelLoadError, match="Qwen2.5-Math-1.5B.*not found.*model_dir"):
        load_tokenizer(pol)  # tokenizer_dir defaults to model_dir
    with pytest.raises(ModelLoadError, match="not found \\(no config.json there\\)"):
        build_model(pol, None, seed=0)


def test_missing_tokenizer_and_unavailable_engine_fail_clearly(tmp_path):
    from mrl_llm.config import PolicyConfig

    with pytest.raises(ConfigError, match="no tokenizer_dir"):
        load_tokenizer(PolicyConfig(name="a", model_config=tiny("llama")))
    with pytest.raises(ModelLoadError, match="tokenizer directory .*nowhere.* not found"):
        load_tokenizer(PolicyConfig(name="a", model_config=tiny("llama"), tokenizer_dir=str(tmp_path / "nowhere")))
    try:
        from mrl_llm.rollout import make_engine  # noqa: F401
    except ImportError:
        pol = PolicyConfig(name="a", model_config=tiny("llama"), tokenizer_dir="utf8-bytes", engine="vllm")
        with pytest.raises(ConfigError, match="engine 'vllm' needs"):
            LLMPolicyWorker("a", WorkerConfig(policy=pol), seed=0)

