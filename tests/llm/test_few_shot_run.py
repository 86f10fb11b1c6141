"""A run with few-shot examples and ``stop_at_newline``, end to end on two tiny policies: the Qwen1.5 vocabulary with
its chat template (examples as earlier turns) and the Llama-2 vocabulary in plain text (example blocks). The
records' prompts are the templates' renderings of each problem with the examples drawn for it, responses end at
their first newline, rewards grade the text before it, and ``problems.json`` keeps the examples. Plus the
``few_shot`` section's errors at load and before any model loads."""

from __future__ import annotations

import json

import pytest

from mrl_llm.config import config_from_mapping
from mrl_llm.data import DataError, write_jsonl
from mrl_llm.data.shots import FewShotConfig, draw_shots
from mrl_llm.rewards.arithmetic import ArithmeticTask, ArithmeticVerifier, arithmetic_reward
from mrl_llm.rollout.base import graded_text, newline_token_ids
from mrl_llm.run_problems import read_run_problems
from mrl_llm.run_setup import resolve_problems
from mrl_llm.templates import PromptTemplate, TemplateConfig
from mrl_llm.trainer import train
from shared_interfaces.config_io import ConfigError
from shared_interfaces.exchange import DiskLogExchange
from tests.llm.helpers import install_verifier, tiny

TASK = ArithmeticTask(families=("add",), eval_fraction=0.2, seed=0)
CHAT = {"text": "{question}", "chat": "require"}
PLAIN = {"text": "Q: {question}\nA:"}


def files(tmp_path):
    train_split = TASK.problems("train")
    paths = {name: tmp_path / f"{name}.jsonl" for name in ("pool", "heldout", "examples")}
    write_jsonl(train_split[:4], paths["pool"])
    write_jsonl(TASK.problems("eval")[:2], paths["heldout"])
    write_jsonl(train_split[4:], paths["examples"])
    return paths


def mapping(shared_dir, paths, regime="sgt", shots=2):
    toks = shared_dir / "tokenizers"
    sampling = {"temperature": 1.0, "max_new_tokens": 12, "stop_at_newline": True}
    return {
        "name": "few-shot", "seed": 1, "steps": 1, "prompts_per_step": 2, "regime": {"name": regime},
        "data": {"path": str(paths["pool"]), "verifier": "arithmetic"},
        "eval": {"data": {"path": str(paths["heldout"]), "verifier": "arithmetic"}, "k": 1, "max_prompts": 2},
        "few_shot": {"shots": shots, "mode": "distinct", "seed": 0,
                     "data": {"path": str(paths["examples"]), "verifier": "arithmetic"}},
        "tensorboard": False, "progress": False, "checkpoint_every": 0,
        "policies": [
            {"name": "qwen", "model_config": tiny("qwen2"), "tokenizer_dir": str(toks / "qwen1.5"), "group_size": 2,
             "template": CHAT, "sampling": sampling, "train": {"lr": 1e-3, "micro_batch": 4}},
            {"name": "llama", "model_config": tiny("llama"), "tokenizer_dir": str(toks / "llama2"), "group_size": 2,
             "template": PLAIN, "sampling": sampling, "train": {"lr": 1e-3, "micro_batch": 4}},
        ],
    }


class RecordingVerifier(ArithmeticVerifier):
    """The arithmetic verifier, keeping every text it grades."""

    def __init__(self) -> None:
        super().__init__()
        self.graded: list[str] = []

    def score(self, response, gold, **kw):
        self.graded.append(response)
        return super().score(response, gold, **kw)


def test_a_few_shot_run_renders_chat_turns_and_plain_blocks_and_stops_at_newlines(shared_dir, tmp_path, monkeypatch):
    from transformers import AutoTokenizer

    verifier = RecordingVerifier()
    install_verifier(monkeypatch, verifier)
    paths = files(tmp_path)
    out = tmp_path / "run"
    train(config_from_mapping(mapping(shared_dir, paths)), out)
    examples = TASK.problems("train")[4:]
    problems = {p.prompt_id: p for p in TASK.problems("all")}
    cfg = FewShotConfig(shots=2, mode="distinct", seed=0)
    toks = {n: AutoTokenizer.from_pretrained(shared_dir / "tokenizers" / d) for n, d in
            (("qwen", "qwen1.5"), ("llama", "llama2"))}
    templates = {"qwen": PromptTemplate(TemplateConfig(**CHAT), toks["qwen"]),
                 "llama": PromptTemplate(TemplateConfig(**PLAIN), toks["llama"])}
    newlines = {n: set(newline_token_ids(t)) for n, t in toks.items()}
    ex = DiskLogExchange(out / "exchange.jsonl")
    recs = list(ex.records())
    ex.close()
    assert len(recs) == 2 * 2 * 2  # prompts x samples x policies
    for r in recs:
        prob = problems[r.prompt_id]
        shots = draw_shots(prob, examples, cfg)
        want = templates[r.policy_id].render(type(prob)(**{**prob.__dict__, "shots": shots}))
        assert r.prompt_text == want
        assert r.prompt_text.count("\\boxed{") == 2
        assert not newlines[r.policy_id] & set(r.token_ids[:-1])  # a newline token can only be the last
        assert r.reward == arithmetic_reward(graded_text(r.response_text, True), prob.gold)
    # responses end at a newline token (kept), and what the verifier saw is the text before the first newline
    assert any("\n" in r.response_text for r in recs)  # this run's seed samples some (else nothing is tested)
    assert verifier.graded and not any("\n" in t for t in verifier.graded)
    qwen = next(r.prompt_text for r in recs if r.policy_id == "qwen")
    assert qwen.count("<|im_start|>assistant\n\\boxed{") == 2 and qwen.endswith("<|im_start|>assistant\n")
    llama = next(r.prompt_text for r in recs if r.policy_id == "llama")
    assert llama.startswith("Q: What is ") and llama.count("}\n\nQ: What is ") == 2 and llama.endswith("?\nA:")
    _, evaluated = read_run_problems(out)  # the evaluated prompts keep their examples, for re-rendering
    for pid, p in evaluated.items():
        assert p.shots == draw_shots(problems[pid], examples, cfg) and len(p.shots) == 2
    rows = [json.loads(x) for x in (out / "eval.jsonl").read_text().splitlines()]
    assert {r["prompt_id"] for r in rows} == set(evaluated)


def test_few_shot_errors_come_at_load_or_before_any_model_loads(shared_dir, tmp_path):
    paths = files(tmp_path)
    base = mapping(shared_dir, paths)
    for few, words in (({"shots": -1}, "few_shot.shots must be an integer >= 0"),
                       ({"mode": "random"}, "few_shot.mode: 'random' is not one of"),
                       ({"shots": 3, "data": None}, "few_shot.shots is 3 but few_shot.data names no examples")):
        with pytest.raises(ConfigError, match=words):
            config_from_mapping({**base, "few_shot": {**base["few_shot"], **few}})
    write_jsonl(TASK.problems("train")[:1] + TASK.problems("train")[4:], paths["examples"])  # a pool prompt
    with pytest.raises(ConfigError, match=r"few_shot.data holds 1 problem\(s\) of the RL pool \(data\)"):
        resolve_problems(config_from_mapping(base), None, None)
    write_jsonl(TASK.problems("eval")[:1] + TASK.problems("train")[4:], paths["examples"])  # a held-out prompt
    with pytest.raises(ConfigError, match=r"of the evaluated prompts \(eval.data\)"):
        resolve_problems(config_from_mapping(base), None, None)
    write_jsonl(TASK.problems("train")[4:5], paths["examples"])  # one example for two shots
    with pytest.raises(ConfigError, match="fewer than few_shot.shots = 2; lower few_shot.shots"):
        resolve_problems(config_from_mapping(base), None, None)
    write_jsonl(TASK.problems("train")[4:5], paths["examples"])
    got = resolve_problems(config_from_mapping({**base, "few_shot": {"shots": 0}}), None, None)
    assert all(p.shots == () for p in got.train + got.eval)  # no examples: the problems as loaded


def test_prompt_lengths_count_the_examples(shared_dir, tmp_path):
    paths = files(tmp_path)
    base = mapping(shared_dir, paths)
    base["policies"][1]["max_prompt_len"] = 20  # the plain question fits, with two example blocks it does not
    resolve_problems(config_from_mapping({**base, "few_shot": {"shots": 0}}), None, None)
    with pytest.raises(DataError, match=r"policy 'llama': prompt .* tokens > max_prompt_len 20 \(template applied\)"):
        resolve_problems(config_from_mapping(base), None, None)


def test_a_run_saved_before_few_shot_existed_resumes_and_a_changed_section_does_not(shared_dir, tmp_path):
    from mrl_llm.rundir import check_run_dir
    from shared_interfaces.config_io import to_mapping

    paths = files(tmp_path)
    m = mapping(shared_dir, paths)
    for p in m["policies"]:
        p["sampling"] = {**p["sampling"], "stop_at_newline": False}
    cfg = config_from_mapping({**m, "few_shot": {"shots": 0}})
    old = to_mapping(cfg)
    del old["few_shot"]  # what a run of the version before wrote
    for p in old["policies"]:
        del p["template"]["shot_text"], p["template"]["shot_reply"], p["sampling"]["stop_at_newline"]
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.json").write_text(json.dumps(old))
    check_run_dir(cfg, out, resume=True)  # the new keys at their defaults are no difference
    with pytest.raises(ConfigError, match=r"differs from the run's in \['few_shot'\]"):
        check_run_dir(config_from_mapping(m), out, resume=True)
