"""The study: its third tokenizer and architecture, its config checks, its report's numbers, and the whole
command end to end at a tiny size."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import replace

import pytest

from mrl_llm.demo.sft import ArchSize, arch_config, encode_example
from mrl_llm.demo.study import MUL_SMALL, STUDY_POLICIES, StudyConfig, study_run_config
from mrl_llm.demo.study_report import (
    acceptance,
    claims,
    collect,
    eval_noise,
    run_curves,
    sampled_var,
    write_report,
)
from mrl_llm.demo.tokenizers import build_tokenizer
from mrl_llm.rewards import ArithmeticTask
from mrl_llm.rewards.arithmetic import Family

TASK = ArithmeticTask(families=("add", "sub", MUL_SMALL))


def test_char_tokenizer_is_character_level_deterministic_and_round_trips():
    tok = build_tokenizer("char", TASK)
    assert build_tokenizer("char", TASK).backend_tokenizer.to_str() == tok.backend_tokenizer.to_str()
    text = "What is 12*7?\n\\boxed{84}"
    ids = tok(text).input_ids
    assert tok.convert_ids_to_tokens(ids)[:3] == ["<bos>", "W", "h"] and len(ids) == len(text) + 1
    assert tok.decode(ids, skip_special_tokens=True) == text
    assert None not in (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) and tok.pad_token_id != tok.eos_token_id
    # a character outside the task's alphabet is <unk>, not dropped
    assert tok.convert_ids_to_tokens(tok("é").input_ids) == ["<bos>", "<unk>"]
    others = [build_tokenizer(k, TASK).get_vocab() for k in ("bytebpe", "spbpe")]
    assert all(tok.get_vocab() != v for v in others)


def test_char_tokenizer_encodes_sft_examples_without_straddling():
    from mrl_llm.templates import PromptTemplate, TemplateConfig

    tok = build_tokenizer("char", TASK)
    tpl = PromptTemplate(TemplateConfig(text="{question}\n"), tok)
    p = TASK.problems("train", ["mul_small"])[5]
    ids, cut = encode_example(tok, tpl, p)
    assert tok.decode(ids[cut:], skip_special_tokens=True) == f"\\boxed{{{p.gold}}}"


def test_gpt2_arch_is_built_without_dropout():
    cfg = arch_config("gpt2", ArchSize(hidden=64, layers=1, heads=4))
    assert cfg["model_type"] == "gpt2" and cfg["n_embd"] == 64 and cfg["tie_word_embeddings"]
    assert cfg["resid_pdrop"] == cfg["embd_pdrop"] == cfg["attn_pdrop"] == 0.0
    with pytest.raises(ValueError, match="unknown demo architecture"):
        arch_config("mamba", ArchSize())


def test_sft_steps_per_policy():
    cfg = StudyConfig(sft_steps=7, sft_steps_per_policy=(("qwen-add", 11),))
    assert cfg.sft_config(3, STUDY_POLICIES[0]).steps == 11 and cfg.sft_config(3, STUDY_POLICIES[1]).steps == 7
    assert cfg.sft_config(3).steps == 7 and cfg.sft_config(3, STUDY_POLICIES[0]).seed == 0  # the shared start
    assert replace(cfg, sft_seed=None).sft_config(3, STUDY_POLICIES[0]).seed == 3


def test_shared_start_and_pool_and_per_policy_lr():
    from mrl_llm.demo.setup import DemoConfig
    from mrl_llm.demo.study import eval_set, study_run_config

    cfg = StudyConfig()  # the preset: one start and one pool, shared by every seed
    assert (cfg.sft_seed, cfg.pool_seed) == (0, 0)
    assert [cfg.sft_config(s, STUDY_POLICIES[0]).seed for s in (0, 1, 2)] == [0, 0, 0]
    assert eval_set(cfg, 2) == eval_set(cfg, 0)
    own = StudyConfig(sft_seed=None, pool_seed=None)
    assert [own.sft_config(s, STUDY_POLICIES[0]).seed for s in (0, 1, 2)] == [0, 1, 2]
    assert eval_set(own, 2) != eval_set(own, 0) and eval_set(own, 0) == eval_set(cfg, 0)
    assert StudyConfig(sft_seed=5).sft_config(1).seed == 5 and StudyConfig(pool_seed=5).pool_seed_of(1) == 5
    assert DemoConfig().sft_config(3).seed == 3 and DemoConfig().pool_seed_of(3) == 3  # the demo: per seed
    dirs = {p.name: f"/m/{p.name}" for p in STUDY_POLICIES}
    m = study_run_config(StudyConfig(lr=1e-4, lr_per_policy=(("qwen-add", 5e-5),)), "grpo", 1, dirs)
    assert [p["train"]["lr"] for p in m["policies"]] == [5e-5, 1e-4, 1e-4] and m["seed"] == 1
    assert [p["train"]["lr"] for p in study_run_config(StudyConfig(lr=2e-4, lr_per_policy=()), "grpo", 0,
                                                       dirs)["policies"]] == [2e-4] * 3


def test_cli_parses_study_options(monkeypatch, tmp_path):
    import mrl_llm.demo.study as study_mod
    from mrl_llm.cli import main

    seen = {}
    monkeypatch.setattr(study_mod, "run_study", lambda cfg, out, jobs: seen.update(cfg=cfg, out=out, jobs=jobs))
    assert main(["study", "--out", str(tmp_path), "--seeds", "3", "--lr", "1e-4", "--sft-steps", "50",
                 "--regimes", "grpo,sgt", "--jobs", "2"]) == 0
    cfg = seen["cfg"]
    assert (cfg.seeds, cfg.lr, cfg.regimes, seen["jobs"]) == (3, 1e-4, ("grpo", "sgt"), 2)
    assert all(cfg.sft_config(0, p).steps == 50 for p in STUDY_POLICIES)
    assert main(["study", "--out", str(tmp_path), "--regimes", "nonsense"]) == 2
    assert cfg.norm_lr == StudyConfig().norm_lr
    main(["study", "--out", str(tmp_path), "--norm-lr", "0.03"])
    assert seen["cfg"].norm_lr == 0.03
    main(["study", "--out", str(tmp_path), "--no-norm-lr"])
    assert seen["cfg"].norm_lr is None
    assert seen["cfg"].norm_sgt == StudyConfig().norm_sgt
    main(["study", "--out", str(tmp_path), "--no-norm-sgt"])
    assert seen["cfg"].norm_sgt is False
    main(["study", "--out", str(tmp_path), "--norm-sgt"])
    assert seen["cfg"].norm_sgt is True
    assert main(["study", "--out", str(tmp_path), "--no-norm-lr", "--no-norm-sgt"]) == 2
    assert seen["cfg"].final_norm_sgt == StudyConfig().final_norm_sgt
    main(["study", "--out", str(tmp_path), "--no-final-norm-sgt"])
    assert seen["cfg"].final_norm_sgt is False
    main(["study", "--out", str(tmp_path), "--final-norm-sgt"])
    assert seen["cfg"].final_norm_sgt is True
    main(["study", "--out", str(tmp_path), "--embed-lr", "0"])
    assert seen["cfg"].embed_lr == 0.0
    main(["study", "--out", str(tmp_path), "--no-embed-lr"])
    assert seen["cfg"].embed_lr is None
    assert main(["study", "--out", str(tmp_path), "--embed-lr", "-1"]) == 2
    main(["study", "--out", str(tmp_path), "--sft-seed", "4", "--pool-seed", "7"])
    assert (seen["cfg"].sft_seed, seen["cfg"].pool_seed) == (4, 7)
    main(["study", "--out", str(tmp_path), "--per-seed-sft", "--per-seed-pool"])
    assert (seen["cfg"].sft_seed, seen["cfg"].pool_seed) == (None, None)
    main(["study", "--out", str(tmp_path), "--lr-policy", "qwen-add=5e-5", "--lr-policy", "gpt2-mul=2e-4"])
    assert seen["cfg"].lr_per_policy == (("qwen-add", 5e-5), ("gpt2-mul", 2e-4))
    main(["study", "--out", str(tmp_path)])
    assert seen["cfg"].lr_per_policy == StudyConfig().lr_per_policy
    for bad in ("qwen-add", "qwen-add=fast", "=1e-4", "", "nobody=1e-4", "qwen-add=0"):
        assert main(["study", "--out", str(tmp_path), "--lr-policy", bad]) == 2, bad
    assert main(["study", "--out", str(tmp_path), "--sft-seed", "-1"]) == 2
    main(["study", "--out", str(tmp_path), "--sgt-successes", "2"])
    assert seen["cfg"].sgt_successes == 2
    assert study_run_config(seen["cfg"], "sgt", 0, {p.name: "x" for p in STUDY_POLICIES})["regime"]["sgt"][
        "successes_per_prompt"] == 2
    assert main(["study", "--out", str(tmp_path), "--sgt-successes", "0"]) == 2


def test_study_run_config_gives_each_architecture_its_norm_group():
    from mrl_llm.config import config_from_mapping
    from mrl_llm.demo.study import study_run_config

    dirs = {p.name: f"/m/{p.name}" for p in STUDY_POLICIES}
    m = study_run_config(StudyConfig(norm_lr=0.02, final_norm_sgt=True), "grpo", 0, dirs)
    groups = {p["name"]: p["train"]["lr_groups"] for p in m["policies"]}
    assert groups == {"qwen-add": [{"match": "*norm*", "lr": 0.02}], "llama-sub": [{"match": "*norm*", "lr": 0.02}],
                      "gpt2-mul": [{"match": "*ln_*", "lr": 0.02}]}
    assert config_from_mapping(m).policies[2].train.lr_groups[0].match == "*ln_*"
    one = study_run_config(StudyConfig(norm_lr=None, final_norm_sgt=True), "grpo", 0, dirs)
    assert all("lr_groups" not in p["train"] for p in one["policies"])
    both = study_run_config(StudyConfig(norm_lr=0.03, embed_lr=0.0, final_norm_sgt=True), "grpo", 0, dirs)
    assert [p["train"]["lr_groups"] for p in both["policies"]][2] == [{"match": "*ln_*", "lr": 0.03},
                                                                      {"match": "*.wte.*", "lr": 0.0}]
    emb = study_run_config(StudyConfig(norm_lr=None, embed_lr=1e-5, final_norm_sgt=True), "grpo", 0, dirs)
    assert emb["policies"][0]["train"]["lr_groups"] == [{"match": "*embed_tokens*", "lr": 1e-5}]
    assert config_from_mapping(both).policies[0].train.lr_groups[1].lr == 0.0
    kept = study_run_config(StudyConfig(norm_lr=0.03, norm_sgt=False, embed_lr=0.0), "sgt", 0, dirs)
    assert kept["policies"][1]["train"]["lr_groups"] == [{"match": "*norm*", "lr": 0.03, "sgt": False},
                                                         {"match": "*embed_tokens*", "lr": 0.0}]
    assert [g.sgt for g in config_from_mapping(kept).policies[1].train.lr_groups] == [False, True]
    final = study_run_config(StudyConfig(norm_lr=0.03, final_norm_sgt=False), "sgt", 0, dirs)
    assert [p["train"]["lr_groups"] for p in final["policies"]][1:] == [
        [{"match": "model.norm.*", "lr": 0.03, "sgt": False}, {"match": "*norm*", "lr": 0.03}],
        [{"match": "transformer.ln_f.*", "lr": 0.03, "sgt": False}, {"match": "*ln_*", "lr": 0.03}]]
    both_off = study_run_config(StudyConfig(norm_lr=0.03, norm_sgt=False, final_norm_sgt=False), "sgt", 0, dirs)
    assert both_off["policies"][0]["train"]["lr_groups"] == [{"match": "*norm*", "lr": 0.03, "sgt": False}]
    base = study_run_config(StudyConfig(norm_lr=None, lr=1e-4), "sgt", 0, dirs)  # the final norm at the base lr
    assert base["policies"][0]["train"]["lr_groups"] == [{"match": "model.norm.*", "lr": 1e-4, "sgt": False}]


def test_study_norm_globs_match_the_built_architectures():
    """Each architecture's glob names its normalisation parameters and nothing else."""
    from mrl_llm.config import PolicyConfig
    from mrl_llm.demo.study import FINAL_NORM_GLOBS, NORM_GLOBS
    from mrl_llm.models import build_model
    from mrl_llm.param_groups import LrGroup, split_param_groups

    for p in STUDY_POLICIES:
        model = build_model(PolicyConfig(name=p.name, model_config=arch_config(
            p.arch, ArchSize(hidden=32, layers=1, heads=2, kv_heads=1))), build_tokenizer(p.tokenizer, TASK), seed=0)
        (norms, _rest) = split_param_groups(model.named_parameters(), [LrGroup(NORM_GLOBS[p.arch], 1.0)], 0.1,
                                            policy=p.name)
        assert norms["names"] and all(("norm" in n or ".ln_" in n) for n in norms["names"]), norms["names"]
        assert all(t.dim() == 1 for t in norms["params"])  # gains / biases, not matrices
        (final, _rest) = split_param_groups(model.named_parameters(), [LrGroup(FINAL_NORM_GLOBS[p.arch], 1.0)], 0.1,
                                            policy=p.name)
        assert final["names"] and set(final["names"]) < set(norms["names"]), final["names"]
        assert all(".layers." not in n and ".h." not in n for n in final["names"])  # the final norm, no layer's


def test_study_embed_globs_match_the_token_embedding_tied_to_the_head():
    """Each architecture's embedding glob names exactly its token embedding, which is also the output head;
    lr 0 leaves it out of the optimizer."""
    from mrl_llm.config import PolicyConfig
    from mrl_llm.demo.study import EMBED_GLOBS, NORM_GLOBS
    from mrl_llm.models import build_model
    from mrl_llm.param_groups import LrGroup, split_param_groups

    for p in STUDY_POLICIES:
        model = build_model(PolicyConfig(name=p.name, model_config=arch_config(
            p.arch, ArchSize(hidden=32, layers=1, heads=2, kv_heads=1))), build_tokenizer(p.tokenizer, TASK), seed=0)
        (emb, _rest) = split_param_groups(model.named_parameters(), [LrGroup(EMBED_GLOBS[p.arch], 1.0)], 0.1,
                                          policy=p.name)
        assert len(emb["params"]) == 1 and emb["params"][0] is model.get_input_embeddings().weight, emb["names"]
        assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
        groups = split_param_groups(model.named_parameters(), [LrGroup(NORM_GLOBS[p.arch], 0.03),
                                                               LrGroup(EMBED_GLOBS[p.arch], 0.0)], 1e-4, policy=p.name)
        kept = {id(t) for g in groups for t in g["params"]}
        assert id(model.get_input_embeddings().weight) not in kept and [g["lr"] for g in groups] == [0.03, 1e-4]


def test_study_policies_are_heterogeneous():
    assert len({p.arch for p in STUDY_POLICIES}) == len({p.tokenizer for p in STUDY_POLICIES}) == 3
    assert len({p.family for p in STUDY_POLICIES}) == 3


@pytest.mark.parametrize(("kw", "msg"), [
    ({"seeds": 0}, ">= 1"),
    ({"policies": STUDY_POLICIES[:1]}, "at least two"),
    ({"policies": (STUDY_POLICIES[0], replace(STUDY_POLICIES[1], family="add"))}, "own SFT family"),
    ({"families": ("add", "sub")}, "not in the task families"),
    ({"optimizer": "lion"}, "optimizer"),
    ({"norm_lr": 0.0}, "norm-lr must be > 0"),
    ({"norm_lr": -1e-2}, "norm-lr must be > 0"),
    ({"policies": (STUDY_POLICIES[0], replace(STUDY_POLICIES[1], arch="mamba"))}, "no norm-parameter glob"),
    ({"norm_lr": None, "norm_sgt": False}, "needs --norm-lr"),
    ({"norm_sgt": "no"}, "norm_sgt must be True or False"),
    ({"final_norm_sgt": 0}, "final_norm_sgt must be True or False"),
    ({"embed_lr": -1e-3}, "embed-lr must be >= 0"),
    ({"embed_lr": float("nan")}, "embed-lr must be >= 0"),
    ({"norm_lr": None, "embed_lr": 0.0, "policies": (STUDY_POLICIES[0], replace(STUDY_POLICIES[1], arch="mamba"))},
     "no embedding glob"),
    ({"sft_seed": -1}, "sft-seed must be an integer >= 0"),
    ({"sft_seed": True}, "sft-seed must be an integer >= 0"),
    ({"pool_seed": 1.5}, "pool-seed must be an integer >= 0"),
    ({"lr_per_policy": (("mistral-div", 1e-4),)}, "names policy 'mistral-div'"),
    ({"lr_per_policy": (("qwen-add", 0.0),)}, "must be a number > 0"),
    ({"lr_per_policy": (("qwen-add", float("nan")),)}, "must be a number > 0"),
    ({"lr_per_policy": (("qwen-add", 1e-4), ("qwen-add", 5e-5))}, "more than one learning rate"),
    ({"lr_per_policy": ("qwen-add",)}, "NAME=LR pairs"),
])
def test_study_config_rejects_malformed_settings(kw, msg):
    with pytest.raises(ValueError, match=msg):
        StudyConfig(**kw)


# -- the report, on hand-written run directories --------------------------------------------------
def _eval_row(step, policy, pid, greedy, successes=0, samples=2):
    return {"step": step, "policy": policy, "prompt_id": pid, "family": pid.split(":")[0], "skipped": False,
            "greedy_correct": greedy, "samples": samples, "successes": successes}


def _write_run(d, rows, train):
    d.mkdir(parents=True)
    (d / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in train) + '{"kind": "tra')


def test_run_curves_by_hand(tmp_path):
    held = {"add:1+1", "sub:2-1"}
    rows = [  # policy a (own family add): at step 0 solves add:1+1 (held out), add:0+0 (pool, by sampling)
        _eval_row(0, "a", "add:1+1", 1), _eval_row(0, "a", "add:0+0", 0, successes=1), _eval_row(0, "a", "sub:2-1", 0),
        _eval_row(0, "b", "add:1+1", 0), _eval_row(0, "b", "add:0+0", 0), _eval_row(0, "b", "sub:2-1", 1),
        _eval_row(2, "a", "add:1+1", 0), _eval_row(2, "a", "add:0+0", 1, successes=2), _eval_row(2, "a", "sub:2-1", 1),
        _eval_row(2, "b", "add:1+1", 1), _eval_row(2, "b", "add:0+0", 0), _eval_row(2, "b", "sub:2-1", 1),
    ]
    train = [{"kind": "train", "step": s, "policy": "a", "entropy": 0.1 * (s + 1), "kl_to_ref": 0.01 * s}
             for s in range(3)]
    _write_run(tmp_path / "r", rows, train)
    c = run_curves(tmp_path / "r", {"a": "add", "b": "sub"}, held, window=2)
    a, b = c["a"], c["b"]
    assert a["own"] == {0: 1.0, 2: 0.0} and b["own"] == {0: 1.0, 2: 1.0}
    assert a["excl"] == {0: 0.0, 2: 1.0}  # a's peer-exclusive set: sub:2-1 (b solved it, a did not)
    assert b["excl"] == {0: 0.0, 2: 0.5}  # b's: add:1+1 (greedy by a) and add:0+0 (a sample of a)
    assert a["overall"][2] == pytest.approx(2 / 3)
    assert a["reward"] == {0: 0.5, 2: 1.0}  # own-family pool prompts only (add:0+0), sampled
    assert a["entropy"][0] == pytest.approx(0.1) and a["entropy"][2] == pytest.approx(0.15)  # steps 0, 1
    assert a["kl"][2] == pytest.approx(0.005) and b["entropy"][2] is None
    # sampled: successes / samples over the same prompts (2 samples each)
    assert a["own_s"] == {0: 0.0, 2: 0.0} and a["excl_s"] == {0: 0.0, 2: 0.0}
    assert a["overall_s"] == {0: pytest.approx(1 / 6), 2: pytest.approx(2 / 6)}
    # the evaluation's binomial variance: add:0+0 at step 0 is 1 of 2 (q 0.5): 2^2 * 0.25 / 1 / 2^2
    assert a["reward_var"] == {0: pytest.approx(0.25), 2: 0.0} and a["own_s_var"][0] == 0.0


def test_sampled_var_by_hand_empty_and_single_sample():
    rows = [{"samples": 4, "successes": 2}, {"samples": 4, "successes": 4}]
    assert sampled_var(rows) == pytest.approx(16 * 0.25 / 3 / 64)
    assert sampled_var([]) is None and sampled_var([{"samples": 0, "successes": 0}]) is None
    assert sampled_var([{"samples": 1, "successes": 1}, {"samples": 4, "successes": 2}]) is None


def test_sampled_var_is_unbiased_for_binomial_counts():
    """Averaged over many simulated evaluations it equals the true variance of the sampled accuracy (a plain
    q(1-q)/k estimate would be (k-1)/k = 3/4 of it here)."""
    import numpy as np

    rng = np.random.default_rng(0)
    p, k = np.array([0.1, 0.3, 0.5, 0.8, 0.95, 0.0]), 4
    true = float(np.sum(k * p * (1 - p))) / (k * len(p)) ** 2
    sims = rng.binomial(k, p, size=(20000, len(p)))
    est = np.mean([sampled_var([{"samples": k, "successes": int(x)} for x in row]) for row in sims])
    assert est == pytest.approx(true, rel=0.03)
    accs = sims.sum(axis=1) / (k * len(p))
    assert float(accs.var()) == pytest.approx(true, rel=0.05)


def test_eval_noise_by_hand():
    res = {("grpo", s): {"p": {"reward": {0: 0.5, 10: 0.6 + 0.1 * s}, "reward_var": {0: 0.001, 10: 0.003}}}
           for s in range(3)}
    se, sd = eval_noise(res, "grpo", None, "reward", 10, 0, [0, 1, 2], ["p"])
    assert se == pytest.approx(0.004 ** 0.5) and sd == pytest.approx(0.1)
    assert "eval s.e. 0.063 vs seed sd 0.100" in acceptance(res, [0, 1, 2], ["p"], [0, 10])[0]
    # a missing variance (e.g. one sample per prompt) gives no s.e., an empty result neither
    del res[("grpo", 1)]["p"]["reward_var"][10]
    assert eval_noise(res, "grpo", None, "reward", 10, 0, [0, 1, 2], ["p"])[0] is None
    assert eval_noise({}, "grpo", None, "reward", 10, 0, [0], ["p"]) == (None, None)


def test_run_curves_sampled_is_none_without_samples(tmp_path):
    rows = [_eval_row(0, "a", "add:1+1", 1, samples=0), _eval_row(0, "b", "add:1+1", 0, samples=0)]
    _write_run(tmp_path / "r", rows, [])
    c = run_curves(tmp_path / "r", {"a": "add", "b": "sub"}, {"add:1+1"}, window=1)
    assert c["a"]["own"] == {0: 1.0} and c["a"]["own_s"] == {0: None} and c["a"]["overall_s"] == {0: None}


def test_report_empty_and_missing_runs(tmp_path):
    assert collect(tmp_path, ("grpo",), [0], {"a": "add"}, set(), 1) == {}
    cfg = StudyConfig(regimes=("grpo",))
    with pytest.raises(FileNotFoundError, match="no finished study run"):
        write_report(cfg, tmp_path, wall_s=0.0, load=((0, 0, 0), (0, 0, 0)), sft={}, say=lambda s: None)


def _curves(own, excl, overall, reward, entropy=0.2, kl=0.1, sampled=None):
    """Hand-made curves; the sampled accuracies equal the greedy ones unless ``sampled`` gives them."""
    s = sampled or {}
    return {"p": {"own": own, "excl": excl, "overall": overall, "reward": reward, "own_s": s.get("own", own),
                  "excl_s": s.get("excl", excl), "overall_s": s.get("overall", overall),
                  "entropy": {0: entropy, 10: entropy}, "kl": {0: 0.0, 10: kl}}}


def test_acceptance_and_claims_lines():
    seeds = [0, 1, 2]
    res = {}
    for s in seeds:
        d = 0.01 * s
        res[("grpo", s)] = _curves({0: 0.5, 10: 0.7 + d}, {0: 0.0, 10: 0.1 + d}, {0: 0.3, 10: 0.4 + d},
                                   {0: 0.5, 10: 0.6 + d})
        res[("sgt", s)] = _curves({0: 0.5, 10: 0.68 + d}, {0: 0.0, 10: 0.4 + d}, {0: 0.3, 10: 0.5 + d},
                                  {0: 0.5, 10: 0.6 + d}, entropy=0.25, kl=0.05)
        res[("prp_thl", s)] = _curves({0: 0.5, 10: 0.5 + d}, {0: 0.0, 10: 0.2 + d}, {0: 0.3, 10: 0.35 + d},
                                      {0: 0.5, 10: 0.5}, entropy=0.15, kl=0.3)
    acc = acceptance(res, seeds, ["p"], [0, 10])
    assert acc[0].startswith("GRPO improves every policy") and "PASS" in acc[0]
    assert "PASS" in acc[1] and "0.300" in acc[1]  # SGT - GRPO peer-exclusive: 0.3 in every seed
    cl = claims(res, ("grpo", "prp_thl", "sgt"), seeds, ["p"], [0, 10])
    assert any(x.startswith("SGT best average accuracy: agrees") for x in cl)
    assert any(x.startswith("PRP (prp_thl) lower entropy, larger KL, lower average accuracy than SGT: agrees")
               for x in cl)
    # without a PRP regime the 'KL low' claim is not judged (it used to read as agreeing, vacuously)
    kl_line = next(x for x in claims(res, ("grpo", "sgt"), seeds, ["p"], [0, 10]) if x.startswith("SGT KL low"))
    assert "not judged" in kl_line and "agrees" not in kl_line
    # a GRPO that gets worse fails the first check
    bad = {k: (_curves({0: 0.5, 10: 0.4}, {0: 0, 10: 0}, {0: 0.3, 10: 0.3}, {0: 0.5, 10: 0.4}) if k[0] == "grpo" else v)
           for k, v in res.items()}
    assert "FAIL" in acceptance(bad, seeds, ["p"], [0, 10])[0]
    # the checks read the sampled accuracies: a greedy rise with a sampled fall fails, and the reverse passes
    def flip(greedy_up):
        up, down = {0: 0.5, 10: 0.7}, {0: 0.5, 10: 0.4}
        own, own_s = (up, down) if greedy_up else (down, up)
        return {k: (_curves(own, v["p"]["excl"], v["p"]["overall"], {0: 0.5, 10: 0.6 + 0.01 * k[1]},
                            sampled={"own": {0: 0.5, 10: own_s[10] + 0.01 * k[1]}}) if k[0] == "grpo" else v)
                for k, v in res.items()}
    assert "FAIL" in acceptance(flip(True), seeds, ["p"], [0, 10])[0]
    assert "PASS" in acceptance(flip(False), seeds, ["p"], [0, 10])[0]


def test_a_run_records_its_start_relative_to_its_own_directory(tmp_path):
    from mrl_llm.demo.run import portable_run

    run = {"name": "r", "policies": [{"name": "a", "model_dir": str(tmp_path / "seed0" / "sft" / "a"), "engine": "hf"}]}
    rec = portable_run(run, tmp_path / "seed1" / "grpo")
    assert rec["policies"] == [{"name": "a", "model_dir": os.path.join("..", "..", "seed0", "sft", "a"), "engine": "hf"}]
    assert rec["name"] == "r" and run["policies"][0]["model_dir"] == str(tmp_path / "seed0" / "sft" / "a")
    assert portable_run({"name": "r", "policies": []}, tmp_path) == {"name": "r", "policies": []}


# -- end to end, tiny ----------------------------------------------------------------------------
TINY = (Family("add", "+", (0, 4), (0, 4)), Family("sub", "-", (0, 4), (0, 4), b_le_a=True),
        Family("mul_small", "*", (0, 2), (0, 4)))


def test_study_end_to_end_tiny(tmp_path):
    from mrl_llm.demo.study import run_study

    pols = tuple(replace(p, size=ArchSize(hidden=32, layers=1, heads=2, kv_heads=1)) for p in STUDY_POLICIES)
    cfg = StudyConfig(families=TINY, policies=pols, steps=2, prompts_per_step=3, group_size=2, pool_per_family=2,
                      eval_every=1, eval_k=1, sft_steps=20, sft_steps_per_policy=(), sft_batch=16,
                      regimes=("grpo", "sgt"), embed_lr=0.0, seeds=2)
    lines: list[str] = []
    doc = run_study(cfg, tmp_path, jobs=0, say=lines.append)
    assert (tmp_path / "tokenizers" / "char" / "tokenizer.json").is_file()
    assert doc["steps"] == [0, 1, 2]
    assert set(doc["runs"]) == {"grpo/seed0", "sgt/seed0", "grpo/seed1", "sgt/seed1"}
    # one SFT per policy, shared by both seeds (sft_seed 0): no seed1/sft, three SFT lines, both seeds' runs
    # start from the same weights and train on the same pool (the same prompts evaluated at step 0)
    assert not (tmp_path / "seed1" / "sft").exists() and sum(x.startswith("[seed 0] SFT ") for x in lines) == 3
    assert not any(x.startswith("[seed 1] SFT") for x in lines)
    ids = [{json.loads(x)["prompt_id"] for x in (tmp_path / f"seed{s}" / "grpo" / "eval.jsonl").read_text().splitlines()}
           for s in (0, 1)]
    assert ids[0] == ids[1]
    starts = [[(tmp_path / f"seed{s}" / "grpo" / p["model_dir"]).resolve()
               for p in json.loads((tmp_path / f"seed{s}" / "grpo" / "done.json").read_text())["settings"]["run"]["policies"]]
              for s in (0, 1)]
    assert starts[0] == starts[1] == [(tmp_path / "seed0" / "sft" / p.name).resolve() for p in pols]
    md = (tmp_path / "study.md").read_text()
    assert "## Acceptance" in md and "GRPO improves every policy" in md and "SGT vs GRPO" in md
    assert "token embeddings lr 0 (frozen)" in md and "shared by every seed (SFT seed 0)" in md
    # embed_lr 0: every policy's token embedding (and tied head) leaves RL exactly as the SFT made it
    from mrl_llm.models import load_policy

    for p in pols:
        start = load_policy(tmp_path / "seed0" / "sft" / p.name)[0].get_input_embeddings().weight
        final = load_policy(tmp_path / "seed0" / "sgt" / "policies" / p.name)[0].get_input_embeddings().weight
        assert start.shape == final.shape and bool((start == final).all()), p.name
    assert (tmp_path / "study.png").read_bytes()[:4] == b"\x89PNG"
    # every checkpoint scored the held-out prompts of every family
    ev = [json.loads(x) for x in (tmp_path / "seed0" / "grpo" / "eval.jsonl").read_text().splitlines()]
    held = {p.prompt_id for p in cfg.task().problems("eval")}
    assert {r["step"] for r in ev} == {0, 1, 2} and held <= {r["prompt_id"] for r in ev}
    # resumable: the same command reuses every SFT and run
    lines.clear()
    run_study(cfg, tmp_path, jobs=0, say=lines.append)
    assert sum("(reused)" in x for x in lines) == 3 + 4
    # ... and so does a copy of the directory elsewhere, given under a relative spelling (the runs record their
    # start relative to their own directory, not as --out spelt it)
    copy = tmp_path.parent / f"{tmp_path.name}-copy"
    shutil.copytree(tmp_path, copy)
    lines.clear()
    run_study(cfg, os.path.relpath(copy), jobs=0, say=lines.append)
    assert sum("(reused)" in x for x in lines) == 3 + 4


def test_the_report_header_says_which_norms_take_no_sgt_gradient():
    from mrl_llm.demo.study_report import _norm_sgt

    assert _norm_sgt(StudyConfig(final_norm_sgt=True)) == ""
    assert _norm_sgt(StudyConfig(norm_sgt=False)) == ", without SGT's gradient"
    assert _norm_sgt(StudyConfig(final_norm_sgt=False)) == ", the final norm without SGT's gradient"
    assert _norm_sgt(StudyConfig(norm_lr=None, final_norm_sgt=True)) == ""
    assert _norm_sgt(StudyConfig(norm_lr=None)) == ", the final norm without SGT's gradient"  # at the base lr


@pytest.mark.parametrize("kind", ["demo", "study"])
def test_heldout_prompts_are_sampled_at_every_evaluation(kind):
    """The per-prompt dynamics need held-out curves: every evaluation (step 0, every ``eval_every`` steps, the end)
    scores the pool and every held-out prompt with ``eval_k`` samples each, not greedily only."""
    from mrl_llm.demo import setup
    from mrl_llm.demo import study as study_mod

    cfg = setup.DemoConfig() if kind == "demo" else StudyConfig()
    make = setup.run_config if kind == "demo" else study_run_config
    ev = make(cfg, "grpo", 0, {p.name: "/m" for p in cfg.policies})["eval"]
    assert ev["k"] == cfg.eval_k >= 1 and ev["every"] == cfg.eval_every >= 1 and ev["max_prompts"] is None
    evset = (setup.eval_set if kind == "demo" else study_mod.eval_set)(cfg, 0)
    pool = setup.rl_pool(cfg.task(), cfg.pool_per_family, cfg.pool_seed_of(0))
    assert evset[:len(pool)] == pool and evset[len(pool):] == cfg.task().problems("eval")
