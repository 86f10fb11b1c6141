"""``experiments/real/task_probe.py``: the draw of prompts and few-shot examples (single families, mixes, examples
with distinct answers), the pair table, and the engine sampler's distribution and newline stop (on a random tiny
model; the real models are not needed)."""

from __future__ import annotations

import json
import random

import pytest
import torch

from experiments.real import task_probe as tp


def ids(prompts):
    return [p.problem.prompt_id for p in prompts]


def test_families_of_a_task_and_its_errors():
    assert tp.families_of("add") == ["add"]
    assert tp.families_of("add+mul") == ["add", "mul"]
    for bad, words in (("div", "unknown family ['div']"), ("add+", "unknown family ['']"), ("", "unknown family"),
                       ("add+add", "twice")):
        with pytest.raises(SystemExit, match=words.replace("[", r"\[").replace("]", r"\]")):
            tp.families_of(bad)


def test_fixed_shots_draw_as_before_and_are_shared_by_the_family():
    problems = [tp.TASKS["add"].problem(a, b) for a, b in tp.TASKS["add"].pairs()]
    before = random.Random("0:add").sample(problems, 50 + tp.SHOTS)  # the draw of the rows in screen.jsonl
    prompts = tp.draw_prompts("add", 50, 0)
    assert ids(prompts) == [p.prompt_id for p in before[tp.SHOTS:]]
    assert {p.shots for p in prompts} == {tuple(before[:tp.SHOTS])}
    assert not {s.prompt_id for s in prompts[0].shots} & set(ids(prompts))


def test_a_mix_splits_the_prompts_evenly_and_draws_each_family_as_alone():
    mix = tp.draw_prompts("add+mul", 51, 0)
    assert [p.problem.family for p in mix] == ["add"] * 26 + ["mul"] * 25
    assert ids(mix[:26]) == ids(tp.draw_prompts("add", 26, 0))
    assert ids(mix[26:]) == ids(tp.draw_prompts("mul", 25, 0))
    for p in mix:
        assert {s.family for s in p.shots} == {p.problem.family}
    assert len({p.shots for p in mix}) == 2  # fixed: one triple per family
    assert len(tp.draw_prompts("add+mul+sub", 200, 3)) == 200


def test_distinct_shots_differ_from_each_other_and_from_the_answer():
    fixed, distinct = tp.draw_prompts("add+mul", 200, 0), tp.draw_prompts("add+mul", 200, 0, "distinct")
    assert ids(distinct) == ids(fixed)  # the same prompts: only the examples change
    prompt_ids = set(ids(distinct))
    for p in distinct:
        golds = [s.gold for s in p.shots]
        assert len(golds) == tp.SHOTS == len(set(golds)) and p.problem.gold not in golds
        assert {s.family for s in p.shots} == {p.problem.family}
        assert not {s.prompt_id for s in p.shots} & prompt_ids
    assert len({p.shots for p in distinct}) > 100  # drawn per prompt
    assert tp.draw_prompts("add", 50, 0, "distinct") == tp.draw_prompts("add", 50, 0, "distinct")


def test_too_few_problems_or_answers_is_a_one_line_error():
    with pytest.raises(SystemExit, match="ask for at most 197 prompts"):
        tp.draw_prompts("mul", 198, 0)
    with pytest.raises(SystemExit, match="ask for at most 394 prompts"):
        tp.draw_prompts("add+mul", 396, 0)
    same = [tp.TASKS["add"].problem(a, 10 - a) for a in range(5)]  # every example answers 10
    with pytest.raises(SystemExit, match=r"has 1 example answers other than its own \(3\), fewer than few_shot.shots"):
        tp.distinct_shots(tp.TASKS["add"].problem(1, 2), same, 0)
    with pytest.raises(SystemExit, match="unknown --shots 'few'"):
        tp.draw_prompts("add", 5, 0, "few")


def test_empty_cases():
    assert tp.draw_prompts("add+mul", 0, 0) == [] == tp.draw_prompts("add", 0, 0, "distinct")
    assert tp.family_accuracy([], [], 8) == {}
    assert tp.pair_table([]) == [] and tp.table_lines([]) == []
    with pytest.raises(SystemExit, match=r"has 0 example answers other than its own"):
        tp.distinct_shots(tp.TASKS["add"].problem(1, 2), [], 0)


def _render_as_in_item_2(tok, fmt, question, shots):
    """The probe's own rendering before it used the trainer's templates (the prompts of screen.jsonl)."""
    if fmt == "plain":
        return "".join(f"Q: {s.question}\nA: \\boxed{{{s.gold}}}\n\n" for s in shots) + f"Q: {question}\nA:"
    turns = []
    for s in shots:
        turns += [{"role": "user", "content": s.question}, {"role": "assistant", "content": f"\\boxed{{{s.gold}}}"}]
    turns.append({"role": "user", "content": question})
    return tok.apply_chat_template(turns, tokenize=False, add_generation_prompt=True)


@pytest.mark.parametrize("shots", ["fixed", "distinct"])
def test_prompts_render_through_the_trainer_template_exactly_as_in_item_2(shots):
    from transformers import AutoTokenizer

    from mrl_llm.config import find_shared_dir

    tok = AutoTokenizer.from_pretrained(find_shared_dir() / "tokenizers" / "qwen1.5")  # it has a chat template
    prompts = tp.draw_prompts("add+mul", 12, 0, shots)
    for fmt in ("plain", "chat"):
        for p in prompts:
            assert tp.render(tok, fmt, p.with_shots()) == _render_as_in_item_2(tok, fmt, p.problem.question, p.shots)
    assert "<|im_start|>assistant\n\\boxed{" in tp.render(tok, "chat", prompts[0].with_shots())
    tok.chat_template = None
    assert tp.render(tok, "chat", prompts[0].with_shots()) is None  # no chat format without a chat template
    with pytest.raises(SystemExit, match="unknown format 'html'"):
        tp.render(tok, "html", prompts[0].with_shots())


def row(model, right, fmt="plain", shots=None, task="add+mul", seconds=10.0):
    r = {"model": model, "task": task, "format": fmt, "temperature": 0.5, "prompts": len(right), "k": 4, "seed": 0,
         "ids": [f"add:{i}+1" if i % 2 else f"mul:{i}*1" for i in range(len(right))], "right": right,
         "seconds": seconds}
    if shots is not None:
        r["shots"] = shots
    return r


def test_pair_table_counts_what_each_model_solves_that_the_other_does_not():
    smol = row(tp.MODELS[0], [0, 1, 2, 0, 0, 0, 0, 0, 4, 0], fmt="chat", shots="distinct")
    gemma = row(tp.MODELS[1], [1, 0, 0, 0, 1, 0, 0, 0, 4, 0], shots="distinct")
    (t,) = tp.pair_table([smol, gemma, row(tp.MODELS[1], [1] * 10, shots="fixed")])  # other shots: not paired
    assert (t["task"], t["shots"], t["formats"], t["prompts"], t["k"]) == ("add+mul", "distinct", "chat/plain", 10, 4)
    assert t["acc_smol"] == pytest.approx(7 / 40) and t["acc_gemma"] == pytest.approx(6 / 40)
    assert (t["solved_smol"], t["solved_gemma"]) == (0.3, 0.3)
    assert t["smol_only"] == pytest.approx(2 / 7)  # Gemma's 0/k: prompts 1,2,3,5,6,7,9; SmolLM2 solves 1, 2
    assert t["gemma_only"] == pytest.approx(2 / 7)  # SmolLM2's 0/k: 0,3,4,5,6,7,9; Gemma solves 0, 4
    assert t["qualifies"]
    assert tp.family_accuracy(smol["ids"], smol["right"], 4) == {"mul": 0.3, "add": 0.05}
    lines = tp.table_lines([t])
    assert lines[0] == tp.HEADER and lines[1].count("|") == lines[0].count("|")
    assert lines[2].startswith("| add+mul | distinct | chat/plain | 0.5 | 10 x 4 | 0.175 | 0.150 |")
    assert lines[2].endswith("| 0.29 | 0.29 | 10+10 | yes |")


def test_pair_table_rejects_a_one_sided_or_out_of_range_pair_and_reads_rows_without_shots_as_fixed():
    rescued = [1, 1, 0, 0, 0, 0, 0, 0, 0, 0]
    (t,) = tp.pair_table([row(tp.MODELS[0], rescued), row(tp.MODELS[1], [0] * 10, shots="fixed")])
    assert t["shots"] == "fixed" and t["smol_only"] == 0.2 and t["gemma_only"] == 0.0 and not t["qualifies"]
    (t,) = tp.pair_table([row(tp.MODELS[0], [4] * 5 + [0] * 5), row(tp.MODELS[1], [0] * 5 + [4] * 5)])
    assert t["smol_only"] == t["gemma_only"] == 1.0 and t["acc_smol"] == 0.5 and t["qualifies"]
    (t,) = tp.pair_table([row(tp.MODELS[0], [4] * 7 + [0] * 3), row(tp.MODELS[1], [0] * 7 + [4] * 3)])
    assert t["acc_smol"] == 0.7 and not t["qualifies"]  # over 60 %


def test_resumed_rows_are_keyed_by_shots(tmp_path):
    path = tmp_path / "screen.jsonl"
    path.write_text(json.dumps(row(tp.MODELS[0], [1, 0])) + "\n\n", encoding="utf-8")
    (r,) = tp.read_rows(path)
    assert tp.row_key(r) == (tp.MODELS[0], "add+mul", "fixed", "plain", 0.5, 2, 4, 0)
    assert tp.row_key(dict(r, shots="distinct"))[2] == "distinct"
    assert tp.read_rows(tmp_path / "absent.jsonl") == []


class _Tok:
    """What the engine and the probe use of a tokenizer: id 5 is a newline, 3 EOS, the rest letters."""

    eos_token_id, pad_token_id = 3, 0

    def __init__(self):
        self.decoded: list[list[int]] = []  # every id list the engine decoded

    def __call__(self, text, add_special_tokens=True, return_tensors=None, padding=False):
        if isinstance(text, str):
            return {"input_ids": [1] + [6 + ord(c) % 30 for c in text]}
        rows = [self(t)["input_ids"] for t in text]  # a batch, left-padded, as the loop asks for it
        width = max(len(r) for r in rows)
        return {"input_ids": torch.tensor([[0] * (width - len(r)) + r for r in rows]),
                "attention_mask": torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])}

    def batch_decode(self, batch, skip_special_tokens=True):
        return [self.decode(r, skip_special_tokens) for r in batch.tolist()]

    def decode(self, ids, skip_special_tokens=True):
        self.decoded.append(list(ids))
        return "".join("\n" if i == 5 else chr(ord("A") + i) for i in ids if i not in (0, 3))


@pytest.fixture(scope="module")
def tiny():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128,
                      eos_token_id=3, bos_token_id=1, pad_token_id=0, tie_word_embeddings=False)
    m = Qwen2ForCausalLM(cfg).float()
    with torch.no_grad():  # a newline likely enough to end most samples early
        m.lm_head.weight[5] += 1.0
    return m.eval()


def test_engine_sampler_stops_at_a_newline_and_keeps_the_prefix_it_would_draw_without_the_stop(tiny):
    tok = _Tok()
    texts = ["What is 1+2?", "Q"]
    got = tp.sample_engine(tok, tiny, texts, 6, 0.7, 12, 4, True, [5], seed=1)
    stopped = [s for s in tok.decoded if 5 in s]
    assert stopped and all(s.index(5) == len(s) - 1 for s in stopped)  # the newline ends the sequence
    tok.decoded = []
    full = tp.sample_engine(tok, tiny, texts, 6, 0.7, 12, 4, True, [], seed=1)  # EOS only: runs on past newlines
    assert any(s.count(5) >= 1 and s[-1] != 5 for s in tok.decoded)
    assert [len(g) for g in got] == [6, 6]
    assert got == full  # each draw is a pure function of (prompt, seed, step): the stop changes only the length


def test_loop_sampler_stops_at_a_newline(tiny):
    tok = _Tok()
    got = tp.sample_loop(tok, tiny, ["What is 1+2?", "Q"], 6, 0.7, 12, 1, True, [5, 3], seed=1)
    assert [len(g) for g in got] == [6, 6] and not any("\n" in t for g in got for t in g)
    ended = [s for s in tok.decoded if 5 in s]
    assert ended and all(set(s[s.index(5) + 1:]) <= {0} for s in ended)  # only pads after the newline


@pytest.mark.parametrize("sampler", ["loop", "engine"])
def test_samplers_draw_softmax_of_logits_over_temperature(tiny, sampler):
    import copy

    peaked = copy.deepcopy(tiny)
    with torch.no_grad():  # far from uniform, so that the temperature shows
        peaked.lm_head.weight *= 8
    tok, n = _Tok(), 4000
    fn = tp.sample_loop if sampler == "loop" else tp.sample_engine
    fn(tok, peaked, ["ab"], n, 0.7, 1, 1 if sampler == "loop" else 512, True, [5], seed=0)
    first = [s[0] for s in tok.decoded]
    freq = torch.bincount(torch.tensor(first), minlength=40).float() / n
    with torch.no_grad():
        logits = peaked(torch.tensor([tok("ab")["input_ids"]])).logits[0, -1]
    tv = {t: 0.5 * float((freq - torch.softmax(logits / t, -1)).abs().sum()) for t in (0.5, 0.7, 1.0)}
    assert len(first) == n and tv[0.7] < 0.06 < min(tv[0.5], tv[1.0]), tv  # total variation


def test_cli_refuses_empty_runs_and_bad_tasks_before_loading_a_model(tmp_path, capsys):
    for argv, words in ((["--prompts", "0"], "at least 1"), (["--bench", "0"], "at least 1"),
                        (["--models", "absent"], "is not prepared; run python -m mrl_llm models prepare")):
        with pytest.raises(SystemExit, match=words):
            tp.main(["--models-dir", str(tmp_path), *argv])
    for name in tp.MODELS:
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text("{}")
    with pytest.raises(SystemExit, match="unknown family"):
        tp.main(["--models-dir", str(tmp_path), "--tasks", "add,addd"])
    tp.main(["--table", str(tmp_path / "none.jsonl")])
    assert "no candidate measured for both models yet" in capsys.readouterr().out


def test_the_real_step_benches_render_their_prompts_with_task_probe():
    """``experiments/bench/real_step_stages.py`` (and ``real_step.py``, the same call) render through ``render``: a
    change of its signature broke both silently once (they have no other default-suite test)."""
    from transformers import AutoTokenizer

    from experiments.bench.real_step_stages import prompt_texts
    from mrl_llm.config import find_shared_dir

    tok = AutoTokenizer.from_pretrained(find_shared_dir() / "tokenizers" / "qwen1.5")
    assert prompt_texts(tok, "plain", 0, 0) == []
    plain, chat = prompt_texts(tok, "plain", 4, 0), prompt_texts(tok, "chat", 4, 0)
    assert len(plain) == len(chat) == 4 and all(t.count("Q: ") == 4 for t in plain)
    assert all(t.count("<|im_start|>user") == 4 for t in chat)
