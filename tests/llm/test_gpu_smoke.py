"""``experiments/gpu/smoke.sh`` must run where only Python, torch and transformers are installed: with Ray,
vLLM, math-verify and gymnasium made unimportable (``sys.modules[name] = None``, what an absent package
looks like to ``import`` and to ``importlib.util.find_spec``) the smoke path imports none of them, and its
CPU mode runs end to end through the script and writes its numbers. (The GPU run itself is not
exercised here: there is no GPU in CI.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BLOCKED = ("ray", "vllm", "math_verify", "gymnasium")

# Installed as sitecustomize in the child: the packages look absent, and every attempt to import one
# (an ``import`` statement, even one whose ImportError is caught) is written to $MRL_IMPORT_LOG at exit.
SITECUSTOMIZE = f"""
import atexit, builtins, json, os, sys
BLOCKED = {BLOCKED!r}
for name in BLOCKED:
    sys.modules[name] = None
attempts = []
_import = builtins.__import__
def _recording_import(name, globals=None, locals=None, fromlist=(), level=0):
    if level == 0 and name.split(".")[0] in BLOCKED:
        attempts.append(name)
    return _import(name, globals, locals, fromlist, level)
builtins.__import__ = _recording_import
atexit.register(lambda: open(os.environ["MRL_IMPORT_LOG"], "w").write(json.dumps(attempts)))
"""


def _env(tmp_path: Path) -> dict[str, str]:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = dict(os.environ, PYTHONPATH=f"{site}{os.pathsep}{REPO}", MRL_IMPORT_LOG=str(tmp_path / "imports.json"),
               PYTHON=sys.executable, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    env.pop("MRL_SHARED_DIR", None)  # ../shared does not travel to the GPU machine
    return env


def test_the_smoke_path_imports_no_ray_vllm_mathverify_gymnasium(tmp_path):
    code = ("import experiments.gpu.smoke as s, mrl_llm.trainer, mrl_llm.worker, mrl_llm.rewards, mrl_llm.rollout\n"
            "from pathlib import Path\n"
            "assert not s.vllm_installed()\n"
            f"cfg = s.smoke_config(Path({str(tmp_path / 'out')!r}), cpu=False, steps=1, engine='hf')\n"
            "assert [p.model_config['model_type'] for p in cfg.policies] == ['qwen2', 'qwen3']\n"
            "assert {p.tokenizer_path for p in cfg.policies} >= {'utf8-bytes'}\n"
            # the GPU run exercises bf16 master weights, device auto, the token budget and chunking
            "assert all(p.dtype == 'bf16' and p.device == 'auto' and p.train.max_tokens_per_micro_batch\n"
            "           and p.train.logprob_chunk for p in cfg.policies)\n")
    res = subprocess.run([sys.executable, "-c", code], env=_env(tmp_path), cwd=tmp_path, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert json.loads((tmp_path / "imports.json").read_text()) == []


@pytest.mark.slow
def test_smoke_sh_cpu_mode_runs_end_to_end_without_them(tmp_path):
    out = tmp_path / "smoke"
    res = subprocess.run([str(REPO / "experiments" / "gpu" / "smoke.sh"), "--cpu", "--steps", "2", "--out", str(out)],
                         env=_env(tmp_path), cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert json.loads((tmp_path / "imports.json").read_text()) == []
    got = json.loads((out / "smoke.json").read_text())
    assert got["engine"] == "hf" and got["device"] == "cpu" and got["steps"] == 2
    assert set(got["policies"]) == {"qwen2.5-like", "qwen3-like"}
    for p in got["policies"].values():
        assert p["steps"] == 2 and p["generation_tokens_per_s"] > 0 and p["training_tokens_per_s"] > 0
        assert p["padding_waste_mean"] >= 1.0 and p["checkpoint_dtypes"] == p["export_dtypes"] == ["F32"]
    assert got["peak_memory"]["host_max_rss_gib"] > 0
    assert "gen tok/s" in res.stdout and "written:" in res.stdout
    # the checks on one tiny-width policy with the real vocabulary: memory, bf16 vs fp32, stale weights
    checks = got["checks"]
    assert checks["size"]["model_config"]["vocab_size"] == 151936 and checks["size"]["dtype"] == "bf16"
    assert got["check_failures"] == [] and "checks: all passed" in res.stdout
    assert checks["decode_tokens_per_s"] > 0 and checks["train_tokens_per_s"] > 0
    assert {"memory_update", "memory_sample"} <= checks.keys() and checks["stale"]["kl_fp32"] > 1e-4


@pytest.mark.slow
@pytest.mark.parametrize("sync", ["micro_batch", "mini_batch"])
def test_smoke_sh_ranks_2_on_cpu_runs_one_policy_on_two_gloo_ranks_against_one(tmp_path, sync):
    out = tmp_path / "smoke"
    res = subprocess.run([str(REPO / "experiments" / "gpu" / "smoke.sh"), "--cpu", "--ranks", "2", "--steps", "2",
                          "--grad-sync", sync, "--out", str(out)], env=_env(tmp_path), cwd=tmp_path,
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    assert json.loads((tmp_path / "imports.json").read_text()) == []  # no Ray, vLLM, ... on this path either
    got = json.loads((out / "smoke_ranks.json").read_text())
    assert (got["fsdp_unit"], got["grad_sync"]) == ("layer", sync)
    one, two = got["runs"]
    assert (one["ranks"], two["ranks"]) == (1, 2) and one["steps"] == two["steps"] == 2
    assert one["records_per_step"] == two["records_per_step"] and all(n > 0 for n in two["records_per_step"])
    assert one["reward_mean"] == two["reward_mean"]  # per-sample seeds: the same records whatever the split
    assert len(two["peak_gib_per_rank"]) == 2 and two["training_tokens_per_s"] > 0
    assert got["final_weights_max_abs_diff"] < 1e-5  # the gathered sharded weights equal the one-rank run's
    assert got["step_time_ratio"] > 0 and "step time with 2 ranks / 1 rank" in res.stdout


def test_smoke_refuses_bad_ranks(tmp_path):
    env = _env(tmp_path)
    res = subprocess.run([str(REPO / "experiments" / "gpu" / "smoke.sh"), "--cpu", "--ranks", "0", "--out",
                          str(tmp_path / "o")], env=env, cwd=tmp_path, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 2 and "--ranks must be >= 1, got 0" in res.stderr
    res = subprocess.run([str(REPO / "experiments" / "gpu" / "smoke.sh"), "--cpu", "--ranks", "2", "--grad-sync",
                          "step", "--out", str(tmp_path / "o")], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 2 and "--grad-sync: invalid choice: 'step'" in res.stderr


def _fake_checks(monkeypatch, *, growth: float, reserved: float, par: dict, stale: dict) -> None:
    """``smoke_checks`` with its measurements replaced: RSS growth and the reserved peak as multiples of the
    planned bytes, the parity and stale results as given."""
    import experiments.gpu.smoke_checks as sc

    def fake_rss(phase, size, **kw):
        return {"growth_bytes": growth * sc.planned(size)[phase], "decode_tokens_per_s": 1.0, "train_tokens_per_s": 2.0}

    def fake_sub(phase, size, **kw):
        peak = sc.planned(size)["total"] / reserved
        return {"peak_bytes": peak, "peak_allocated_bytes": peak, "decode_tokens_per_s": 1.0, "train_tokens_per_s": 2.0}

    monkeypatch.setattr(sc, "rss_growth", fake_rss)
    monkeypatch.setattr(sc, "measure_in_subprocess", fake_sub)
    monkeypatch.setattr(sc, "parity", lambda size: par)
    monkeypatch.setattr(sc, "stale_check", lambda size: stale)


GOOD_PARITY = {"loss_rel": 0.0, "nll_rel": 1e-4, "grad_cos": 0.999}
GOOD_STALE = {"kl_bf16": 0.08, "kl_fp32": 0.08, "ratio": 1.0}


@pytest.mark.parametrize("cpu", [True, False])
def test_smoke_checks_pass_within_their_bounds(monkeypatch, cpu):
    from experiments.gpu.smoke_checks import run_checks

    _fake_checks(monkeypatch, growth=1.2, reserved=1.2, par=GOOD_PARITY, stale=GOOD_STALE)
    out, fails = run_checks(cpu=cpu)
    assert fails == [] and out["decode_tokens_per_s"] == 1.0 and out["train_tokens_per_s"] == 2.0
    size = out["size"]
    assert (size["rows"], size["response_len"], size["model_config"]["num_hidden_layers"]) == (
        (8, 16, 2) if cpu else (64, 512, 28))
    assert size["model_config"]["vocab_size"] == 151936 and size["dtype"] == "bf16"


def test_smoke_checks_name_each_failure(monkeypatch):
    from experiments.gpu.smoke_checks import run_checks

    _fake_checks(monkeypatch, growth=2.0, reserved=0.9, par={"loss_rel": 0.02, "nll_rel": 0.0, "grad_cos": 0.9},
                 stale={"kl_bf16": 0.008, "kl_fp32": 0.08, "ratio": 0.1})
    _, fails = run_checks(cpu=True)
    assert fails == ["memory (update): RSS growth / planned = 2.00, outside (0.8, 1.5)",
                     "memory (sample): RSS growth / planned = 2.00, outside (0.8, 1.5)",
                     "bf16 vs fp32: loss_rel = 2.00e-02 > 0.01",
                     "bf16 vs fp32: gradient cosine 0.9000 < 0.99",
                     "stale weights: bf16 / fp32 approx_kl_old = 0.10 (bf16 8.00e-03, fp32 8.00e-02), outside "
                     "(0.5, 2.0): mini-batches after the first ran on start-of-step weights"]
    _, fails = run_checks(cpu=False)  # the planner below the reserved peak; over 1.3x it
    assert fails[0].startswith("memory: planned") and fails[0].endswith("= 0.90, outside (1.0, 1.3)")
    _fake_checks(monkeypatch, growth=1.0, reserved=1.4, par=GOOD_PARITY, stale={"kl_bf16": 0, "kl_fp32": 0, "ratio": 0})
    _, fails = run_checks(cpu=False)
    assert fails == [fails[0], "stale weights: fp32 approx_kl_old 0.00e+00 < 0.0001, too small to compare; raise "
                               "--stale-lr"]
    assert fails[0].endswith("= 1.40, outside (1.0, 1.3)")


def test_smoke_refuses_a_bad_stale_lr(tmp_path):
    res = subprocess.run([str(REPO / "experiments" / "gpu" / "smoke.sh"), "--cpu", "--stale-lr", "0", "--out",
                          str(tmp_path / "o")], env=_env(tmp_path), cwd=tmp_path, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 2 and "--stale-lr must be > 0, got 0.0" in res.stderr
