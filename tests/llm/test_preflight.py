"""The checks a run makes after its tokenizers load and before any model does: every prompt fits each
policy's ``max_prompt_len`` under that policy's template and tokenizer (an error, or with
``data.on_malformed: skip`` a counted skip), and every ``model_config`` suits its tokenizer."""

from __future__ import annotations

import logging

import pytest

from mrl_llm.config import config_from_mapping
from mrl_llm.data import DataError, Problem
from mrl_llm.preflight import check_model_configs, fit_prompts
from mrl_llm.run_setup import setup_warnings
from mrl_llm.trainer import resolve_problems
from mrl_llm.worker import LLMPolicyWorker, WorkerConfig
from shared_interfaces.config_io import ConfigError
from tests.llm.helpers import tiny


def config(max_prompt_len: int = 30, **top):
    return config_from_mapping({"policies": [
        {"name": "a", "model_config": tiny("llama"), "tokenizer_dir": "utf8-bytes", "max_prompt_len": max_prompt_len,
         "template": {"text": "{question}\n"}},
        {"name": "b", "model_config": tiny("llama"), "tokenizer_dir": "utf8-bytes", "max_prompt_len": 1000,
         "template": {"text": "Q: {question}\nA:"}}], **top})


def probs(*questions: str) -> list[Problem]:
    return [Problem(prompt_id=f"p{i}", question=q, gold="1", verifier="arithmetic") for i, q in enumerate(questions)]


def test_the_count_is_the_workers_count():
    cfg = config(max_prompt_len=8)
    ok = probs("1234567")  # 7 bytes + newline = 8 tokens under policy a's template
    assert fit_prompts(cfg, ok, on_malformed="error", source="data") == (ok, [])
    worker = LLMPolicyWorker("a", WorkerConfig(policy=cfg.policies[0], track_ref_kl=False), seed=0)
    assert len(worker.render(ok[0])[1]) == 8
    with pytest.raises(ValueError, match="max_prompt_len 8"):
        worker.render(probs("12345678")[0])
    with pytest.raises(DataError, match=r"train\.jsonl: policy 'a': prompt 'p0' has 9 tokens > max_prompt_len 8"):
        fit_prompts(cfg, probs("12345678"), on_malformed="error", source="train.jsonl")


def test_skip_mode_drops_and_counts_the_long_prompts(caplog):
    cfg = config(max_prompt_len=10)
    ps = probs("short", "x" * 20, "also", "y" * 30)
    with caplog.at_level(logging.WARNING):
        kept, skipped = fit_prompts(cfg, ps, on_malformed="skip", source="d.jsonl")
    assert [p.prompt_id for p in kept] == ["p0", "p2"]
    assert [(s.policy, s.prompt_id, s.n_tokens) for s in skipped] == [("a", "p1", 21), ("a", "p3", 31)]
    assert any("skipped 2 of 4 prompts" in r.getMessage() and "d.jsonl" in r.getMessage() for r in caplog.records)


def test_empty_and_all_too_long():
    cfg = config(max_prompt_len=3)
    assert fit_prompts(cfg, [], on_malformed="error", source="data") == ([], [])
    with pytest.raises(DataError, match="no prompt of d.jsonl fits"):
        fit_prompts(cfg, probs("long one", "longer one"), on_malformed="skip", source="d.jsonl")


class _NoTokens:
    """A tokenizer that encodes every text to no tokens (a malformed template/tokenizer pairing)."""

    def __call__(self, texts, add_special_tokens=True):
        return type("Enc", (), {"input_ids": [[] for _ in texts]})()


def test_a_prompt_that_encodes_to_nothing_is_refused_or_skipped():
    cfg = config()
    with pytest.raises(DataError, match="policy 'a': prompt 'p0' encodes to no tokens; check the template"):
        fit_prompts(cfg, probs("x"), on_malformed="error", source="data", tokenizers={"a": _NoTokens(), "b": None})
    with pytest.raises(DataError, match="no prompt of data fits"):
        fit_prompts(cfg, probs("x"), on_malformed="skip", source="data", tokenizers={"a": _NoTokens(), "b": None})


def test_resolve_problems_checks_training_and_eval_sets():
    cfg = config(max_prompt_len=10, data={"path": "unused.jsonl", "on_malformed": "skip"}, prompts_per_step=2)
    got = resolve_problems(cfg, probs("a", "b" * 20, "c"), probs("d" * 20, "e"))
    assert [p.question for p in got.train] == ["a", "c"] and [p.question for p in got.eval] == ["e"]
    assert (got.use["train"].rows, got.use["train"].skipped_prompts, got.use["train"].problems) == (3, 1, 2)
    assert (got.use["eval"].rows, got.use["eval"].skipped_prompts, got.use["eval"].problems) == (2, 1, 1)
    strict = config(max_prompt_len=10, prompts_per_step=2)
    with pytest.raises(DataError, match="prompt 'p1'"):
        resolve_problems(strict, probs("a", "b" * 20), None)
    with pytest.raises(ConfigError, match="the run has no training problems"):  # the empty case
        resolve_problems(strict, [], None)
    # a step cannot take more prompts than remain (10**12 of 2 built a list until memory ran out)
    for b in (3, 10**12):
        with pytest.raises(ConfigError, match=rf"prompts_per_step {b} exceeds the 2 training prompts .* set "
                                              r"prompts_per_step <= 2 or add data"):
            resolve_problems(config(max_prompt_len=10, data={"path": "unused.jsonl", "on_malformed": "skip"},
                                    prompts_per_step=b), probs("a", "b" * 20, "c"), None)


def test_the_data_use_counts_every_skip(tmp_path):
    """What summary.json's ``data`` holds: rows read, rows the loader skipped (malformed, unusable gold),
    prompts too long for a policy, problems used; for the training set and the evaluation set."""
    import json

    rows = [{"id": "p0", "question": "1+1", "answer": "2"}, {"id": "p1", "question": "x" * 40, "answer": "3"},
            {"id": "p2", "question": "2+2"}, {"id": "p3", "question": "3+3", "answer": "not a number"},
            {"id": "p4", "question": "4+4", "answer": "8"}]
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + "not json\n")
    data = {"path": str(path), "verifier": "arithmetic", "on_malformed": "skip"}
    got = resolve_problems(config(max_prompt_len=20, data=data, prompts_per_step=1), None, None)
    assert [p.prompt_id for p in got.train] == ["p0", "p4"] and got.eval == got.train
    train = got.use["train"]
    assert (train.source, train.rows, train.skipped_rows, train.skipped_prompts, train.problems) == (
        str(path), 6, 3, 1, 2)
    assert (got.use["eval"].source, got.use["eval"].problems) == ("the training problems", 2)
    ev = resolve_problems(config(max_prompt_len=20, data=data, prompts_per_step=1,
                                 eval={"data": {**data, "path": str(path)}, "max_prompts": 1}), None, None)
    assert (ev.use["eval"].rows, ev.use["eval"].skipped_rows, ev.use["eval"].problems) == (6, 3, 1)


def test_model_configs_checked_against_their_tokenizers():
    check_model_configs(config())
    bad = config_from_mapping({"policies": [{"name": "a", "model_config": tiny("llama", vocab_size=100),
                                             "tokenizer_dir": "utf8-bytes"}]})
    with pytest.raises(ConfigError, match=r"policy 'a': model_config.vocab_size 100 is smaller than its tokenizer's"):
        check_model_configs(bad)


def test_legacy_keys_transformers_converts_are_accepted():
    from mrl_llm.byte_tokenizer import byte_tokenizer
    from mrl_llm.config import PolicyConfig
    from mrl_llm.models import fresh_config

    pol = PolicyConfig(name="a", model_config=tiny("qwen2", rope_theta=12345.0, tie_word_embeddings=True),
                       tokenizer_dir="utf8-bytes")
    built = fresh_config(pol, byte_tokenizer())
    # transformers 5 moves the legacy key into rope_parameters; 4.x keeps it as an attribute
    rope = getattr(built, "rope_parameters", None) or {"rope_theta": built.rope_theta}
    assert rope["rope_theta"] == 12345.0
    with pytest.raises(ConfigError, match=r"\['gradient_checkpointing'\] that a 'qwen2' config does not have"):
        fresh_config(PolicyConfig(name="a", model_config=tiny("qwen2", gradient_checkpointing=True)), byte_tokenizer())


def test_a_model_config_larger_than_memory_is_refused_before_it_is_built(monkeypatch):
    """1e12 layers hung in transformers building per-layer lists: beyond any machine, refused at the config check
    (also on a Ray driver); beyond this machine, refused where the model is built (a worker's node may hold more)."""
    import mrl_llm.models as models
    from mrl_llm.byte_tokenizer import byte_tokenizer
    from mrl_llm.config import PolicyConfig
    from mrl_llm.models import build_model, check_fits_host, fresh_config, host_memory_bytes

    huge = PolicyConfig(name="a", model_config=tiny("qwen2", num_hidden_layers=10**12), tokenizer_dir="utf8-bytes")
    with pytest.raises(ConfigError, match=r"policy 'a': model_config describes a model of .* GiB in fp32.*more than "
                                          r"any machine holds .*lower num_hidden_layers"):
        fresh_config(huge, byte_tokenizer())
    small = PolicyConfig(name="a", model_config=tiny("qwen2", vocab_size=300), tokenizer_dir="utf8-bytes")
    fresh_config(small, byte_tokenizer())
    assert host_memory_bytes() is None or host_memory_bytes() > 0
    # ~0.2M parameters are 0.8 MB in fp32: they fit 10 MB, not 100 kB
    check_fits_host(small.model_config, "policy 'a'", ram_bytes=10**7)
    with pytest.raises(ConfigError, match=r"more than this machine's memory"):
        check_fits_host(small.model_config, "policy 'a'", ram_bytes=10**5)
    check_fits_host({"model_type": "qwen2"}, "policy 'a'", ram_bytes=1)  # a shape it cannot read is not checked
    from transformers import AutoConfig

    default = AutoConfig.for_model("qwen2").num_hidden_layers
    assert models.shape_dict("qwen2", {})["num_hidden_layers"] == default  # nothing given: the model type's defaults
    assert models.shape_dict("gpt2", {"hidden_size": 64})["n_embd"] == 64  # an alias under its canonical name
    monkeypatch.setattr(models, "host_memory_bytes", lambda: 10**5)
    fresh_config(small, byte_tokenizer())  # the config check does not look at this machine
    with pytest.raises(ConfigError, match=r"policy 'a': .* more than this machine's memory \(9.31e-05 GiB\)"):
        build_model(small, byte_tokenizer(), seed=0)


def test_a_prompt_must_leave_the_model_room_to_generate(tmp_path):
    """A prompt under max_prompt_len but of the model's whole context left no response token: the update then
    failed deep in backward ("element 0 of tensors does not require grad")."""
    import json

    from mrl_llm.preflight import context_lengths

    cfg = config_from_mapping({"policies": [
        {"name": "a", "model_config": tiny("llama", max_position_embeddings=16), "tokenizer_dir": "utf8-bytes",
         "max_prompt_len": 1000, "template": {"text": "{question}\n"}}]})
    assert context_lengths(cfg) == {"a": 16}
    fits = probs("x" * 14)  # 14 + newline = 15 tokens: one left to generate
    assert fit_prompts(cfg, fits, on_malformed="error", source="d.jsonl") == (fits, [])
    with pytest.raises(DataError, match=r"prompt 'p0' has 16 tokens, leaving no room to generate in the model's "
                                        r"context of 16 tokens"):
        fit_prompts(cfg, probs("x" * 15), on_malformed="error", source="d.jsonl")
    kept, skipped = fit_prompts(cfg, probs("x" * 15, "y"), on_malformed="skip", source="d.jsonl")
    assert [p.prompt_id for p in kept] == ["p1"] and [s.n_tokens for s in skipped] == [16]
    # a model directory's config.json (GPT-2's n_positions), a hub id (unknown: max_prompt_len alone)
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_positions": 64}))
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text("")  # unreadable: unknown here, the model load names it
    dirs = config_from_mapping({"policies": [
        {"name": "d", "model_dir": str(tmp_path / "m")}, {"name": "h", "model_dir": "org/some-model"},
        {"name": "e", "model_dir": str(tmp_path / "bad")}]})
    assert context_lengths(dirs) == {"d": 64, "h": None, "e": None}
    # the model type's default where model_config leaves it out
    assert context_lengths(config()) == {"a": tiny_default_context(), "b": tiny_default_context()}


def tiny_default_context() -> int:
    from transformers import LlamaConfig

    return tiny("llama").get("max_position_embeddings", LlamaConfig().max_position_embeddings)


def test_a_vllm_policy_on_the_cpu_needs_a_head_size_its_attention_supports():
    """Head size 16 (tiny()'s) failed inside vLLM's worker process, named only in its log."""
    from mrl_llm.preflight import check_vllm_cpu_head_size
    from tests.llm.helpers import require_vllm

    require_vllm()
    pols = config_from_mapping({"policies": [
        {"name": "v", "model_config": tiny("llama"), "tokenizer_dir": "utf8-bytes", "engine": "vllm", "device": "cpu"},
        {"name": "ok", "model_config": tiny("llama", hidden_size=256), "tokenizer_dir": "utf8-bytes",
         "engine": "vllm", "device": "cpu"},
        {"name": "h", "model_config": tiny("llama"), "tokenizer_dir": "utf8-bytes"}]}).policies
    with pytest.raises(ConfigError, match=r"policy 'v': vLLM's CPU attention supports head sizes \[32, 64.*\], this "
                                          r"model's is 16 .*hidden_size = 4 x 64\) or set engine: hf"):
        check_vllm_cpu_head_size(pols[0])
    check_vllm_cpu_head_size(pols[1])  # 256 / 4 = 64
    check_vllm_cpu_head_size(pols[2])  # the hf engine: any head size


def test_setup_warnings():
    """A nucleus-sampling peer under prp_thl (full-vocabulary mu), and the core's idle-signal cases."""
    assert setup_warnings(config()) == []
    top = {"policies": [{"name": n, "model_config": tiny("llama"), "tokenizer_dir": "utf8-bytes",
                         "sampling": {"top_p": tp}} for n, tp in (("a", 0.9), ("b", 1.0))]}
    (msg,) = setup_warnings(config_from_mapping({**top, "regime": {"name": "prp_thl+sgt"}}))
    assert msg.startswith("regime prp_thl+sgt: policies ['a'] sample with top_p < 1") and "prp_snapshot" in msg
    for name in ("prp_snapshot", "xgrpo", "grpo"):  # no mu in their updates
        assert setup_warnings(config_from_mapping({**top, "regime": {"name": name}})) == []
    one = config_from_mapping({"policies": [{"name": "a", "model_config": tiny("llama"), "tokenizer_dir": "utf8-bytes",
                                             "group_size": 1, "sampling": {"top_p": 0.5}}], "regime": {"name": "prp_thl"}})
    assert [m.split(":")[1].split(",")[0].strip() for m in setup_warnings(one)] == [
        "the run has one policy and no peers", "group_size 1 for ['a'] under own-group statistics"]
