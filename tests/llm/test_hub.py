"""Presets a user can start: ``model_dir`` may be a Hugging Face hub id (loaded with ``from_pretrained`` from the
hub cache; ``HF_HUB_OFFLINE`` respected), and ``python -m mrl_llm data prepare`` writes the config's dataset
from a local file or a hub dataset id. Nothing is downloaded: the hub is a local cache made here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mrl_llm.cli import main as cli_main
from mrl_llm.config import config_from_mapping
from mrl_llm.data import DataConfig, FieldMap, load_jsonl
from mrl_llm.hub import is_hub_id
from tests.llm.helpers import tiny

REPO = Path(__file__).resolve().parents[2]


def test_is_hub_id(tmp_path):
    assert is_hub_id("Qwen/Qwen2.5-Math-1.5B") and is_hub_id("microsoft/phi-4")
    for v in ("", None, "models", "./a/b", "/abs/b", "~/a", "a/b/c", "a/..", "../b", "a b/c", "utf8-bytes"):
        assert not is_hub_id(v), v
    (tmp_path / "local" / "model").mkdir(parents=True)
    assert not is_hub_id("local/model", tmp_path) and is_hub_id("local/model")


def test_config_keeps_hub_ids_and_resolves_paths(tmp_path):
    (tmp_path / "models" / "m").mkdir(parents=True)
    cfg = config_from_mapping({"policies": [
        {"name": "a", "model_dir": "Qwen/Qwen2.5-Math-1.5B"},
        {"name": "b", "model_dir": "models/m"},
        {"name": "c", "model_config": tiny("llama"), "tokenizer_dir": "Qwen/Qwen2.5-Math-1.5B"},
    ]}, base_dir=tmp_path)
    a, b, c = cfg.policies
    assert a.model_dir == "Qwen/Qwen2.5-Math-1.5B" and a.tokenizer_path == "Qwen/Qwen2.5-Math-1.5B"
    assert b.model_dir == str(tmp_path / "models" / "m")
    assert c.tokenizer_dir == "Qwen/Qwen2.5-Math-1.5B"


# Run in a child: huggingface_hub reads HF_HUB_CACHE / HF_HUB_OFFLINE when it is imported.
CHILD = r"""
import json, sys
from pathlib import Path
from transformers import AutoConfig, AutoModelForCausalLM
from experiments.gpu.smoke import make_bpe_tokenizer
root = Path(sys.argv[1])
snap = root / "hub" / "models--tiny-org--tiny-llama" / "snapshots" / ("a" * 40)
tok_dir = make_bpe_tokenizer(snap)
cfg = AutoConfig.for_model("llama", vocab_size=400, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                           num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128,
                           eos_token_id=0, pad_token_id=0)
AutoModelForCausalLM.from_config(cfg).save_pretrained(str(snap))
(snap.parents[1] / "refs").mkdir()
(snap.parents[1] / "refs" / "main").write_text("a" * 40)

from mrl_llm.config import PolicyConfig, SamplingSection
from mrl_llm.models import ModelLoadError
from mrl_llm.worker import LLMPolicyWorker, WorkerConfig
pol = PolicyConfig(name="hubby", model_dir="tiny-org/tiny-llama", group_size=2, max_prompt_len=32,
                   sampling=SamplingSection(max_new_tokens=4))
w = LLMPolicyWorker("hubby", WorkerConfig(policy=pol), seed=0)
out = {"params": sum(p.numel() for p in w.model.parameters()), "vocab": len(w.tokenizer)}
try:
    LLMPolicyWorker("x", WorkerConfig(policy=PolicyConfig(name="x", model_dir="tiny-org/absent")), seed=0)
except ModelLoadError as err:
    out["absent"] = str(err)
from mrl_llm.distributed.plan_cli import footprints_from_config
fp = footprints_from_config({"policies": [{"name": "hubby", "model_dir": "tiny-org/tiny-llama"}]})[0]
out["shape"] = [fp.shape.n_layers, fp.shape.hidden_size, fp.shape.vocab_size]
print(json.dumps(out))
"""


def test_a_hub_id_model_loads_from_the_hub_cache_offline(tmp_path):
    env = dict(os.environ, HF_HUB_CACHE=str(tmp_path / "hub"), HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO),
               OMP_NUM_THREADS="1")
    env.pop("HF_HOME", None)
    res = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path)], env=env, cwd=tmp_path, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert 0 < out["vocab"] <= 400 and out["params"] > 0  # the BPE made in the cache
    assert "policy 'x'" in out["absent"] and "'tiny-org/absent'" in out["absent"] and "HF_HUB_OFFLINE" in out["absent"]
    assert out["shape"] == [1, 32, 400]  # the planner reads the cached config.json


def _config(tmp_path: Path) -> Path:
    cfg = tmp_path / "exp.yaml"
    cfg.write_text(
        "policies: [{name: a, model_dir: Qwen/Qwen2.5-Math-1.5B}]\n"
        "data: {path: data/math_train.jsonl, verifier: math, fields: {question: problem, answer: solution}}\n")
    return cfg


def test_data_prepare_writes_the_configs_dataset_from_a_local_file(tmp_path, capsys):
    src = tmp_path / "math.jsonl"
    src.write_text(json.dumps({"problem": "What is $1+1$?", "solution": "It is $\\boxed{2}$.", "level": "Level 1"})
                   + "\n\n" + json.dumps({"problem": "Compute $2\\cdot 3$.", "solution": "$\\boxed{6}$"}) + "\n")
    cfg = _config(tmp_path)
    assert cli_main(["data", "prepare", "--config", str(cfg), "--source", str(src)]) == 0
    assert "wrote 2 rows" in capsys.readouterr().out
    out = tmp_path / "data" / "math_train.jsonl"
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert rows[0]["level"] == "Level 1" and rows[0]["id"] == "math:0" and rows[1]["id"] == "math:1"
    probs = load_jsonl(DataConfig(path=str(out), verifier="math",
                                  fields=FieldMap(question="problem", answer="solution"))).problems
    assert [p.prompt_id for p in probs] == ["math:0", "math:1"] and probs[1].question == "Compute $2\\cdot 3$."
    # an existing file is kept unless --force
    assert cli_main(["data", "prepare", "--config", str(cfg), "--source", str(src)]) == 2
    assert "exists; pass --force" in capsys.readouterr().err
    assert cli_main(["data", "prepare", "--config", str(cfg), "--source", str(src), "--force"]) == 0


@pytest.mark.parametrize("content,match", [
    ("", "has no rows; nothing written"),
    ('{"problem": "Q?"}\n', "bad.jsonl:1: no answer field 'solution'"),
    ('{"problem": "Q?", "solution": "1"}\nnot json\n', ":2: not valid JSON"),
])
def test_data_prepare_refuses_empty_and_malformed_sources(tmp_path, capsys, content, match):
    src = tmp_path / "bad.jsonl"
    src.write_text(content)
    assert cli_main(["data", "prepare", "--config", str(_config(tmp_path)), "--source", str(src)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("mrl_llm data: ") and match in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "data" / "math_train.jsonl").exists()


def test_data_prepare_from_a_hub_id_goes_through_datasets(tmp_path, capsys, monkeypatch):
    import importlib.util

    cfg = _config(tmp_path)
    if importlib.util.find_spec("datasets") is None:
        assert cli_main(["data", "prepare", "--config", str(cfg), "--source", "EleutherAI/hendrycks_math"]) == 2
        assert "needs the datasets package" in capsys.readouterr().err
    assert cli_main(["data", "prepare", "--config", str(cfg), "--source", "no-such-file.jsonl"]) == 2
    assert "no-such-file.jsonl does not exist (it reads as a path" in capsys.readouterr().err


# A hub id as model_dir through `train` itself (preflight, model load, one step), offline, from a cache made here.
TRAIN_CHILD = CHILD.split("from mrl_llm.config import PolicyConfig")[0] + r"""
import yaml
from mrl_llm.cli import main
from mrl_llm.config import load_config
from mrl_llm.preflight import check_model_configs, context_lengths
data = Path(sys.argv[2])
cfg = {"name": "hub", "seed": 1, "steps": 1, "prompts_per_step": 2, "regime": {"name": "grpo"},
       "data": {"path": str(data / "train.jsonl"), "verifier": "arithmetic"}, "tensorboard": False, "progress": False,
       "policies": [{"name": "hubby", "model_dir": "tiny-org/tiny-llama", "group_size": 2, "max_prompt_len": 64,
                     "sampling": {"max_new_tokens": 4}, "train": {"lr": 1e-3}},
                    {"name": "b", "model_config": {"model_type": "llama", "vocab_size": 300, "hidden_size": 32,
                                                   "intermediate_size": 64, "num_hidden_layers": 1,
                                                   "num_attention_heads": 2, "num_key_value_heads": 1},
                     "tokenizer_dir": "utf8-bytes", "group_size": 2, "sampling": {"max_new_tokens": 4},
                     "train": {"lr": 1e-3}}]}
(root / "cfg.yaml").write_text(yaml.safe_dump(cfg))
out = {"rc": main(["train", "--config", str(root / "cfg.yaml"), "--out", str(root / "run")]),
       "context": context_lengths(load_config(root / "cfg.yaml"))["hubby"]}
cfg["policies"][0]["model_dir"] = "tiny-org/absent"
(root / "absent.yaml").write_text(yaml.safe_dump(cfg))
try:
    check_model_configs(load_config(root / "absent.yaml"))
except Exception as err:
    out["absent"] = f"{type(err).__name__}: {err}"
print(json.dumps(out))
"""


def test_a_hub_id_model_dir_trains_from_the_hub_cache(tmp_path):
    """Preflight required ``model_dir/config.json`` before the hub branch of the model load, so a model in the hub
    cache was refused as "not found"; an absent one offline was not said to be offline."""
    env = dict(os.environ, HF_HUB_CACHE=str(tmp_path / "hub"), HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO),
               OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    env.pop("HF_HOME", None)
    data = REPO / "experiments" / "data" / "arithmetic"
    res = subprocess.run([sys.executable, "-c", TRAIN_CHILD, str(tmp_path), str(data)], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=500)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["rc"] == 0, res.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["steps"] == 1 and [p["name"] for p in summary["policies"]] == ["hubby", "b"]
    assert out["context"] == 128  # the cached config.json is read as a local one
    absent = out["absent"]
    assert absent.startswith("ModelLoadError: model 'tiny-org/absent' of policy 'hubby'") and "offline" in absent
    assert str(tmp_path / "hub") in absent and "HF_HUB_OFFLINE" in absent and "not found" not in absent


@pytest.mark.parametrize("source", ["data/mat.jsonl", "./data/math", "~/nowhere/x", "a/b/c", "mydata/train.parquet",
                                    "dir"])
def test_data_prepare_refuses_a_missing_path_instead_of_asking_the_hub(tmp_path, capsys, monkeypatch, source):
    """A mistyped local path of the form ``a/b`` was taken for a hub dataset id (and sent to ``datasets``)."""
    import mrl_llm.data.prepare as prepare

    def no_hub(*a, **k):
        raise AssertionError("the hub was asked")

    monkeypatch.setattr(prepare, "read_hub", no_hub)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "dir").mkdir()
    assert cli_main(["data", "prepare", "--config", str(_config(tmp_path)), "--source", source]) == 2
    err = capsys.readouterr().err
    assert f"--source {source!r}: " in err and ("does not exist" in err or "is a directory" in err), err
    assert "reads as a path" in err and len(err.strip().splitlines()) == 1


def test_looks_like_path_and_cached_file_empty_cases(tmp_path, monkeypatch):
    from mrl_llm.hub import cached_file, looks_like_path

    for v in ("./a", "/abs/x", "~/x", "a/b/c", "data/train.jsonl", "x.parquet", "d/rows.JSON"):
        assert looks_like_path(v), v
    for v in ("", "EleutherAI/hendrycks_math", "openai/gsm8k", "name"):
        assert not looks_like_path(v), v
    assert cached_file("tiny-org/not-cached-anywhere-here") is None  # (nothing is fetched: the cache is only read)


def test_download_file_of_an_empty_or_malformed_id_is_none_without_asking_the_hub(monkeypatch):
    """Preflight fetches an uncached hub id's config.json; an id the hub library refuses is None (the caller names it)."""
    from huggingface_hub import constants

    from mrl_llm.hub import download_file

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # never the network, even where one exists
    for bad in ("", "a/b/c", "../x", "tiny-org/not-cached-anywhere-here"):
        assert download_file(bad) is None, bad
