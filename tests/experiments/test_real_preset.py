"""``experiments/configs/real_cpu.yaml`` (issue 41, item 3) loads and validates without the models: both real models
with their own templates (item 2's formats), the HF engine, item 2's sampling, the sizes the issue asks for, every
regime; and its data files are what their make.py writes, with the pool, the held-out prompts and the few-shot
examples apart. (``tests/llm/test_real_preset_slow.py`` runs a step of every regime on the real models.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from experiments.real import task_probe as tp
from mrl_llm.config import load_config
from mrl_llm.data import DataConfig, load_jsonl
from mrl_llm.data.shots import attach_shots
from shared_interfaces.regimes.config import STANDARD_REGIMES

REPO = Path(__file__).resolve().parents[2]
PRESET = REPO / "experiments" / "configs" / "real_cpu.yaml"
DATA = REPO / "experiments" / "data" / "real_add"


@pytest.fixture
def cfg(monkeypatch, tmp_path):
    monkeypatch.setenv("MRL_MODELS_DIR", str(tmp_path))
    return load_config(PRESET)


def test_the_preset_is_the_issue_s_and_item_2_s_setting(cfg, tmp_path):
    assert [(p.name, Path(p.model_dir)) for p in cfg.policies] == [
        ("smollm2", tmp_path / "smollm2-135m-instruct"), ("gemma3", tmp_path / "gemma-3-270m")]
    assert cfg.steps >= 30 and cfg.prompts_per_step >= 8
    smol, gemma = cfg.policies
    assert smol.template == tp.FORMATS["chat"] and gemma.template == tp.FORMATS["plain"]  # item 2's formats
    for p in cfg.policies:
        assert p.engine == "hf" and p.group_size == 8 and p.sampling.max_new_tokens == 16
        assert (p.sampling.temperature, p.sampling.top_p, p.sampling.stop_at_newline) == (0.5, 1.0, True)
        assert p.dtype == "fp32" and [g.sgt for g in p.train.lr_groups] == [False]
        assert [g.lr for g in p.train.lr_groups] == [p.train.lr]  # the final norm at the base rate
    assert (cfg.few_shot.shots, cfg.few_shot.mode) == (tp.SHOTS, "distinct")
    assert cfg.eval.temperature == 0.5 and cfg.eval.k == 8
    assert cfg.regime_spec.name == "sgt"
    for regime in STANDARD_REGIMES:  # grpo, xgrpo, prp_snapshot, prp_thl, sgt
        assert cfg.with_regime(regime).regime_spec.name == regime


def _problems(name: str) -> list:
    return list(load_jsonl(DataConfig(path=str(DATA / f"{name}.jsonl"), verifier="arithmetic")).problems)


def test_the_data_files_are_make_py_s_and_keep_pool_held_out_and_examples_apart(cfg, tmp_path):
    copy = tmp_path / "real_add"
    copy.mkdir()
    (copy / "make.py").write_text((DATA / "make.py").read_text())
    subprocess.run([sys.executable, str(copy / "make.py")], check=True, cwd=REPO, capture_output=True,
                   env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    for name in ("pool", "eval", "examples"):
        assert (copy / f"{name}.jsonl").read_bytes() == (DATA / f"{name}.jsonl").read_bytes(), name
    pool, evaluated, examples = _problems("pool"), _problems("eval"), _problems("examples")
    assert (len(pool), len(evaluated), len(examples)) == (64, 144, 256)
    assert evaluated[:64] == pool and {p.family for p in pool + evaluated + examples} == {"add"}
    ids = [{p.prompt_id for p in s} for s in (pool, evaluated[64:], examples)]
    assert not (ids[0] & ids[1] or ids[0] & ids[2] or ids[1] & ids[2]) and len(set().union(*ids)) == 400
    assert Path(cfg.data.path) == DATA / "pool.jsonl" and Path(cfg.few_shot.data.path) == DATA / "examples.jsonl"
    for p in attach_shots(evaluated, examples, cfg.few_shot):  # every prompt gets its 3 distinct examples
        golds = {s.gold for s in p.shots}
        assert len(golds) == 3 and p.gold not in golds
