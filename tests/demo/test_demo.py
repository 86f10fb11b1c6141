"""The CPU demo: its tokenizers, its statistics, and the whole command end to end at a tiny size."""

from __future__ import annotations

import json
import math
import time
from dataclasses import replace

import numpy as np
import pytest

from mrl_llm.demo.results import mean_ci, t_quantile
from mrl_llm.demo.setup import POLICIES, DemoConfig, rl_pool
from mrl_llm.demo.sft import ArchSize
from mrl_llm.demo.tokenizers import build_tokenizer
from mrl_llm.evaluate import read_eval_rows
from mrl_llm.rewards import ArithmeticTask
from mrl_llm.rewards.arithmetic import Family
from shared_interfaces.regimes.config import STANDARD_REGIMES
from shared_interfaces.success_matrix import read_success_matrix

PROMPT, RESPONSE = "What is 12-7?\n", "\\boxed{5}"


@pytest.fixture(scope="module")
def toks():
    task = ArithmeticTask()
    return build_tokenizer("bytebpe", task), build_tokenizer("spbpe", task)


def test_tokenizers_are_deterministic(toks):
    task = ArithmeticTask()
    for kind, tok in zip(("bytebpe", "spbpe"), toks, strict=True):
        assert build_tokenizer(kind, task).backend_tokenizer.to_str() == tok.backend_tokenizer.to_str()


def test_tokenizers_are_genuinely_different(toks):
    a, b = toks
    ta = a.convert_ids_to_tokens(a(PROMPT + "19").input_ids)
    tb = b.convert_ids_to_tokens(b(PROMPT + "19").input_ids)
    assert ta[:3] == ["What", "Ġis", "Ġ12"] and "19" in ta  # byte-level, whole numbers, no BOS
    assert tb[:5] == ["<s>", "▁What", "▁is", "▁", "1"] and "<0x0A>" in tb  # Metaspace, digits, BOS, byte fallback
    assert a.get_vocab() != b.get_vocab()
    for t in (a, b):
        assert None not in (t.bos_token_id, t.eos_token_id, t.pad_token_id) and t.pad_token_id != t.eos_token_id
        assert t.decode(t(PROMPT + RESPONSE).input_ids, skip_special_tokens=True) == PROMPT + RESPONSE


def test_thl_moves_a_response_between_them_exactly(toks):
    from mrl_llm.thl import align_trace

    for src, tgt in (toks, toks[::-1]):
        n = len(src(PROMPT).input_ids)
        ids = src(PROMPT + RESPONSE).input_ids[n:] + [src.eos_token_id]
        tr = align_trace(src, tgt, ids, [-0.25] * len(ids), prompt_text=PROMPT)
        m = len(tgt(PROMPT).input_ids)
        assert list(tr.prompt_ids) == tgt(PROMPT).input_ids
        assert list(tr.target_ids) == tgt(PROMPT + RESPONSE).input_ids[m:] + [tgt.eos_token_id]
        assert math.isclose(sum(tr.target_logprobs), -0.25 * len(ids)) and tr.residual.moved_mass == 0


@pytest.mark.parametrize(("df", "want"), [(1, 12.7062), (2, 4.3027), (4, 2.7764), (9, 2.2622), (29, 2.0452)])
def test_t_quantile(df, want):
    assert t_quantile(0.975, df) == pytest.approx(want, abs=2e-3)


def test_mean_ci():
    assert mean_ci([0.5]) == (0.5, None, 1)
    m, h, n = mean_ci([0.1, 0.3, None, float("nan"), 0.5])
    assert (n, m) == (3, pytest.approx(0.3)) and h == pytest.approx(4.3027 * 0.2 / math.sqrt(3), rel=1e-3)


def test_rl_pool_is_balanced_seeded_and_from_the_training_split():
    task = ArithmeticTask()
    pool = rl_pool(task, 5, seed=3)
    assert [p.family for p in pool] == ["add", "sub"] * 5
    assert pool == rl_pool(task, 5, seed=3) and pool != rl_pool(task, 5, seed=4)
    train = {p.prompt_id for p in task.problems("train")}
    assert all(p.prompt_id in train for p in pool)


TINY_FAMILIES = (Family("add", "+", (0, 4), (0, 4)), Family("sub", "-", (0, 4), (0, 4), b_le_a=True))


def tiny_config(**kw) -> DemoConfig:
    """A demo small enough for the default suite: operands 0..4, tiny models, a short SFT, two RL steps."""
    pols = tuple(replace(p, size=ArchSize(hidden=64, layers=1, heads=4, kv_heads=1, mlp_mult=4)) for p in POLICIES)
    base = dict(families=TINY_FAMILIES, steps=2, prompts_per_step=4, group_size=4, pool_per_family=4, eval_every=1,
                eval_k=2, sft_steps=300, sft_batch=32, sft_lr=3e-3, lr=1e-3, policies=pols)
    return DemoConfig(**{**base, **kw})


def test_demo_end_to_end_tiny(tmp_path, monkeypatch):
    import mrl_llm.config

    def no_shared():
        raise AssertionError("the demo must not look for ../shared")

    monkeypatch.setattr(mrl_llm.config, "find_shared_dir", no_shared)
    from mrl_llm.demo.run import run_demo

    out = tmp_path / "demo"
    lines: list[str] = []
    doc = run_demo(tiny_config(), out, jobs=0, say=lines.append)

    for kind in ("bytebpe", "spbpe"):
        assert (out / "tokenizers" / kind / "tokenizer.json").is_file()
    # complementary skills after the SFT: each policy solves its own family's prompts and not the other's
    # (beyond the coincidences a+0 = a-0 that operands 0..4 make frequent: at most 5 of 20 add prompts)
    sft = doc["sft"]["0"]
    for p in POLICIES:
        other = "sub" if p.family == "add" else "add"
        acc = sft[p.name]["accuracy"]
        assert acc[p.family]["train"] >= 0.7 and acc[other]["train"] <= 0.35, (p.name, acc)
    # one trainer run directory per regime, same start, same seed
    starts = set()
    for reg in STANDARD_REGIMES:
        d = out / "seed0" / reg
        s = json.loads((d / "summary.json").read_text())
        assert s["regime"] == reg and s["steps"] == 2 and s["seed"] == 0
        assert (d / "eval.jsonl").is_file() and (d / "done.json").is_file()
        starts.add(json.dumps([r for r in read_eval_rows(d / "eval.jsonl") if r["step"] == 0], sort_keys=True))
        for p in POLICIES:
            assert (d / "policies" / p.name / "config.json").is_file()
    assert len(starts) == 1
    assert {(r["regime"], r["seed"]) for r in doc["runs"]} == {(r, 0) for r in STANDARD_REGIMES}
    # the table (printed and written) and the plot
    md = (out / "demo.md").read_text()
    for reg in STANDARD_REGIMES:
        assert f"| {reg} | qwen-add |" in md and f"| {reg} | llama-sub |" in md
    assert any("| sgt | llama-sub |" in line for line in lines)
    assert (out / "demo.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "report.png").is_file()
    # the table's numbers are the runs' own: every evaluation scored the pool and the held-out prompts, greedy
    # and sampled; the pool columns read the pool's rows, the held-out columns the held-out rows
    task = tiny_config().task()
    pool_ids = {p.prompt_id for p in rl_pool(task, 4, 0)}
    held = {p.prompt_id: p.family for p in task.problems("eval")}
    head = [c.strip() for c in next(x for x in md.split("\n") if x.startswith("| regime |")).strip("|").split("|")]
    for reg in STANDARD_REGIMES:
        rows = read_eval_rows(out / "seed0" / reg / "eval.jsonl")
        assert {r["step"] for r in rows} == {0, 1, 2}
        assert {r["prompt_id"] for r in rows} == pool_ids | set(held)
        split = read_success_matrix(out / "seed0" / reg / "success_matrix.json").split  # the pool, as trained
        assert {p for p, s in zip(sorted(pool_ids | set(held)), split, strict=True) if s == "train"} == pool_ids
        for p in POLICIES:
            row = next(line for line in md.split("\n") if line.startswith(f"| {reg} | {p.name} |"))
            cells = dict(zip(head, (c.strip() for c in row.strip("|").split("|")), strict=True))
            mine = [r for r in rows if r["policy"] == p.name and not r["skipped"]]
            final_pool = [r for r in mine if r["step"] == 2 and r["prompt_id"] in pool_ids]
            assert cells["eval acc (final)"] == f"{np.mean([r['greedy_correct'] for r in final_pool]):.3f}"
            for step, col in ((0, "held-out own sampled (SFT start)"), (2, "held-out own sampled (final)")):
                own = [r for r in mine if r["step"] == step and held.get(r["prompt_id"]) == p.family]
                assert own and all(r["samples"] == 2 for r in own)
                assert cells[col] == f"{sum(r['successes'] for r in own) / sum(r['samples'] for r in own):.3f}"
            res = next(r for r in doc["runs"] if r["regime"] == reg)["policies"][p.name]
            assert res["heldout_own_sampled"] is not None and res["pool_sampled_start"] is not None
            pe = res["peer_exclusive_accuracy"]
            assert cells["peer-excl. acc (final)"] == ("-" if pe is None else f"{pe:.3f}")
    assert "Δ held-out own sampled from start" in md and "Δ held-out own sampled |" in md

    # a second call with the same settings reuses every step
    t0 = time.perf_counter()
    lines.clear()
    run_demo(tiny_config(), out, jobs=0, say=lines.append)
    assert sum("(reused)" in line for line in lines) == 2 + len(STANDARD_REGIMES)
    assert time.perf_counter() - t0 < 30
    # other settings in the same directory: an error, not a silent overwrite
    with pytest.raises(FileExistsError, match="other settings"):
        run_demo(tiny_config(lr=5e-4), out, jobs=0, say=lines.append)


def test_cli_parses_demo_options(monkeypatch, tmp_path):
    import mrl_llm.demo.run as run_mod
    from mrl_llm.cli import main

    seen = {}
    monkeypatch.setattr(run_mod, "run_demo", lambda cfg, out, jobs: seen.update(cfg=cfg, out=out, jobs=jobs))
    assert main(["demo", "--out", str(tmp_path), "--seeds", "3", "--steps", "7", "--regimes", "sgt, grpo",
                 "--lr", "1e-4", "--jobs", "0", "--norm-lr", "0.01", "--heldout-per-family", "20"]) == 0
    cfg = seen["cfg"]
    assert (cfg.seeds, cfg.steps, cfg.regimes, cfg.lr, seen["jobs"]) == (3, 7, ("sgt", "grpo"), 1e-4, 0)
    assert (cfg.norm_lr, cfg.final_norm_sgt, cfg.heldout_per_family) == (0.01, DemoConfig().final_norm_sgt, 20)
    assert main(["demo", "--out", str(tmp_path), "--no-norm-lr", "--final-norm-sgt", "--jobs", "0"]) == 0
    assert (seen["cfg"].norm_lr, seen["cfg"].final_norm_sgt) == (None, True)
    assert main(["demo", "--out", str(tmp_path), "--regimes", "nope"]) == 2


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_default_demo_one_seed(tmp_path):
    """The default demo for seed 0 (5-10 min on 2 cores): complementary SFT skills at full size, every
    regime, and a GRPO baseline that does not wreck its policies: the pool's sampled accuracy rises and the
    own-family held-out sampled accuracy stays within 0.05 of the SFT start (the two policies averaged);
    SGT's term fires for both policies."""
    from mrl_llm.demo.run import run_demo

    doc = run_demo(DemoConfig(), tmp_path / "demo", jobs=5, say=lambda _: None)
    for p in POLICIES:
        other = "sub" if p.family == "add" else "add"
        acc = doc["sft"]["0"][p.name]["accuracy"]
        assert acc[p.family]["train"] >= 0.8 and acc[other]["train"] <= 0.1, (p.name, acc)
    final = {r["regime"]: r["policies"] for r in doc["runs"]}
    assert set(final) == set(STANDARD_REGIMES)

    def change(reg, key):
        return np.mean([d[key] - d[key + "_start"] for d in final[reg].values()])

    assert change("grpo", "pool_sampled") > 0 and change("grpo", "heldout_own_sampled") >= -0.05, final["grpo"]
    assert all(d["sgt_activations"] > 0 for d in final["sgt"].values()), final["sgt"]


def test_paired_differences_are_per_seed_differences_of_the_policy_means():
    from mrl_llm.demo.results import paired_vs

    def run(reg, seed, a, b):
        return {"regime": reg, "seed": seed, "policies": {"p": {"peer_exclusive_accuracy": a},
                                                          "q": {"peer_exclusive_accuracy": b}}}

    res = [run("grpo", 0, 0.0, 0.2), run("sgt", 0, 0.4, 0.4), run("grpo", 1, 0.1, 0.1), run("sgt", 1, 0.3, 0.1)]
    m, h, n = paired_vs(res)["sgt"]["peer_exclusive_accuracy"]
    assert n == 2 and m == pytest.approx((0.3 + 0.1) / 2) and h == pytest.approx(12.7062 * math.sqrt(0.02) / math.sqrt(2), rel=1e-3)
    assert paired_vs(res)["grpo"]["peer_exclusive_accuracy"][0] == 0.0


def test_heldout_set_is_a_fixed_sample_per_family_or_all():
    from mrl_llm.demo.setup import heldout_set

    task = ArithmeticTask(families=("add", "sub"))
    every = task.problems("eval")
    assert heldout_set(task, None) == every and heldout_set(task, 10_000) == every
    sub = heldout_set(task, 5)
    assert [p.family for p in sub] == ["add"] * 5 + ["sub"] * 5 and sub == heldout_set(task, 5)
    assert {p.prompt_id for p in sub} <= {p.prompt_id for p in every}
    for bad in (0, -1, True, 2.5):
        with pytest.raises(ValueError, match="heldout-per-family"):
            DemoConfig(heldout_per_family=bad)


def test_run_config_norm_groups_and_per_sample_seeding():
    from mrl_llm.config import config_from_mapping
    from mrl_llm.demo.setup import run_config

    dirs = {p.name: "sft" for p in POLICIES}
    m = run_config(DemoConfig(lr=3e-5, norm_lr=3e-2, final_norm_sgt=False), "sgt", 0, dirs)
    for p in m["policies"]:
        assert p["sampling"]["seeding"] == "sample"
        assert p["train"]["lr_groups"] == [{"match": "model.norm.*", "lr": 3e-2, "sgt": False},
                                           {"match": "*norm*", "lr": 3e-2}]
    config_from_mapping(m)
    m = run_config(DemoConfig(norm_lr=None, final_norm_sgt=True), "sgt", 0, dirs)
    assert all("lr_groups" not in p["train"] for p in m["policies"])
    m = run_config(DemoConfig(lr=1e-4, norm_lr=None, final_norm_sgt=False), "sgt", 0, dirs)
    assert all(p["train"]["lr_groups"] == [{"match": "model.norm.*", "lr": 1e-4, "sgt": False}] for p in m["policies"])
    m = run_config(DemoConfig(norm_lr=3e-2, norm_sgt=False), "sgt", 0, dirs)
    assert all(p["train"]["lr_groups"] == [{"match": "*norm*", "lr": 3e-2, "sgt": False}] for p in m["policies"])
    config_from_mapping(m)
    with pytest.raises(ValueError, match="norm-lr"):
        DemoConfig(norm_lr=0.0)
    with pytest.raises(ValueError, match="--norm-lr X"):
        DemoConfig(norm_lr=None, norm_sgt=False)
    with pytest.raises(ValueError, match="norm_sgt must be True or False"):
        DemoConfig(norm_sgt="no")


def test_change_from_start_is_the_per_seed_change_of_the_policy_means():
    from mrl_llm.demo.results import change_from_start, change_markdown

    def run(seed, a0, a1, b0, b1):
        return {"regime": "grpo", "seed": seed,
                "policies": {"p": {"heldout_own_sampled_start": a0, "heldout_own_sampled": a1},
                             "q": {"heldout_own_sampled_start": b0, "heldout_own_sampled": b1}}}

    # per seed (0.2 + 0) / 2 = 0.1 and (0.1 + 0) / 2 = 0.05; seed 2 lacks a final value and is left out
    res = change_from_start([run(0, 0.5, 0.7, 0.6, 0.6), run(1, 0.4, 0.5, 0.2, 0.2), run(2, 0.1, None, 0.1, 0.1)])
    m, h, n = res["grpo"]["heldout_own_sampled"]
    assert n == 2 and m == pytest.approx(0.075) and h == pytest.approx(12.7062 * 0.05 / math.sqrt(2) / math.sqrt(2),
                                                                       rel=1e-3)
    assert res["grpo"]["pool_sampled"] == (pytest.approx(float("nan"), nan_ok=True), None, 0)
    assert change_from_start([]) == {}
    assert "| grpo | - | - | - | 0.075 ± 0.318 |" in change_markdown(res, ["grpo"])
