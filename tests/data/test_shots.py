"""Few-shot examples (``mrl_llm.data.shots``): the draw in both modes, its determinism, its errors, and the empty
cases; the templates' rendering of them (chat turns, plain blocks) and the byte-identical prompts without them."""

from __future__ import annotations

import random
import re

import pytest

from mrl_llm.data import DataConfig, Problem
from mrl_llm.data.shots import (
    FewShotConfig,
    ShotsError,
    attach_shots,
    check_apart,
    check_run_section,
    draw_shots,
)
from mrl_llm.rewards.arithmetic import ArithmeticTask
from mrl_llm.templates import PromptTemplate, TemplateConfig, TemplateError, render_prompt

TASK = ArithmeticTask(families=("add", "sub"), eval_fraction=0.2, seed=0)
TRAIN = TASK.problems("train")
POOL, EXAMPLES = TRAIN[::5], [p for i, p in enumerate(TRAIN) if i % 5]
DISTINCT = FewShotConfig(shots=3, mode="distinct", seed=0)


def test_distinct_examples_are_of_the_family_with_answers_apart_and_fixed_by_seed_and_prompt():
    out = attach_shots(POOL, EXAMPLES, DISTINCT)
    assert [p.prompt_id for p in out] == [p.prompt_id for p in POOL]
    for p in out:
        golds = [s.gold for s in p.shots]
        assert len(golds) == 3 == len(set(golds)) and p.gold not in golds
        assert {s.family for s in p.shots} == {p.family} and not {s.prompt_id for s in p.shots} & {p.prompt_id}
    assert len({p.shots for p in out}) > len(out) // 2  # drawn per prompt
    assert attach_shots(POOL[::-1], EXAMPLES, DISTINCT)[::-1] == out  # per prompt: not by position or batch
    again = attach_shots(POOL, EXAMPLES, FewShotConfig(shots=3, mode="distinct", seed=1))
    assert [p.shots for p in again] != [p.shots for p in out]
    # the rule spelled out: the family's examples in Random("<seed>:<prompt id>")'s order, first distinct answers
    p = POOL[0]
    order = random.Random(f"0:{p.prompt_id}").sample([e for e in EXAMPLES if e.family == p.family],
                                                      sum(e.family == p.family for e in EXAMPLES))
    want, seen = [], {p.gold}
    for e in order:
        if e.gold not in seen and len(want) < 3:
            want.append(e)
            seen.add(e.gold)
    assert out[0].shots == tuple(want)


def test_fixed_examples_are_one_sample_per_family():
    out = attach_shots(POOL, EXAMPLES, FewShotConfig(shots=2, mode="fixed", seed=3))
    by_family = {p.family: {q.shots for q in out if q.family == p.family} for p in out}
    assert all(len(s) == 1 for s in by_family.values()) and set(by_family) == {"add", "sub"}
    adds = [e for e in EXAMPLES if e.family == "add"]
    assert by_family["add"] == {tuple(random.Random("3:add").sample(adds, 2))}


def test_no_shots_is_no_change_and_no_problems_no_examples():
    assert attach_shots(POOL, EXAMPLES, FewShotConfig()) == POOL
    assert all(p.shots == () for p in attach_shots(POOL, [], FewShotConfig(shots=0)))
    assert attach_shots([], EXAMPLES, DISTINCT) == [] == attach_shots([], [], DISTINCT)
    assert draw_shots(POOL[0], [], FewShotConfig()) == ()
    check_apart([], POOL, "the pool")
    check_apart(EXAMPLES, [], "the pool")


def test_too_few_examples_name_the_prompt_the_key_and_the_fix():
    p = Problem("add:1+2", "What is 1+2?", "3", "arithmetic", family="add")
    same = [Problem(f"add:{a}+{10 - a}", f"What is {a}+{10 - a}?", "10", "arithmetic", family="add") for a in range(5)]
    with pytest.raises(ShotsError, match=r"prompt 'add:1\+2' \(family 'add'\) has 1 example answers other than its "
                                         r"own \(3\), fewer than few_shot.shots = 3; lower few_shot.shots, use "
                                         r"few_shot.mode: fixed, or add examples"):
        draw_shots(p, same, DISTINCT)
    with pytest.raises(ShotsError, match="has 2 examples, fewer than few_shot.shots = 3; lower few_shot.shots or add"):
        draw_shots(p, same[:2], FewShotConfig(shots=3, mode="fixed"))
    with pytest.raises(ShotsError, match=r"\(no family\) has 0 example"):  # other families' examples do not count
        attach_shots([Problem("x", "x?", "1", "arithmetic")], same, DISTINCT)


def test_bad_settings_are_one_line_errors_naming_the_key():
    for kw, words in (({"shots": -1}, "few_shot.shots must be an integer >= 0"),
                      ({"shots": True}, "few_shot.shots must be an integer"),
                      ({"mode": "random"}, "few_shot.mode 'random' is not a mode; use 'fixed'"),
                      ({"seed": -2}, "few_shot.seed must be an integer >= 0")):
        with pytest.raises(ShotsError, match=words):
            FewShotConfig(**kw)
    with pytest.raises(ShotsError, match="few_shot.shots is 3 but few_shot.data names no examples; add few_shot.data"):
        check_run_section(DISTINCT)
    check_run_section(FewShotConfig(shots=3, data=DataConfig(path="x.jsonl")))


def test_an_example_that_is_a_problem_of_the_run_is_refused():
    first = re.escape(POOL[0].prompt_id)
    with pytest.raises(ShotsError, match=rf"few_shot.data holds 1 problem\(s\) of the RL pool, e.g. '{first}'"):
        check_apart(EXAMPLES + [POOL[0]], POOL[:1], "the RL pool")
    twin = Problem("other-id", POOL[0].question, POOL[0].gold, "arithmetic", family="add")  # the same question
    with pytest.raises(ShotsError, match="'other-id'"):
        check_apart([twin], POOL, "the evaluated prompts")


# -- rendering -------------------------------------------------------------------------------------------------
Q = Problem("add:3+5", "What is 3+5?", "8", "arithmetic", family="add")
SHOTS = (Problem("add:19+1", "What is 19+1?", "20", "arithmetic", family="add"),
         Problem("add:10+5", "What is 10+5?", "15", "arithmetic", family="add"))
PLAIN = TemplateConfig(text="Q: {question}\nA:")


def test_plain_examples_are_blocks_before_the_text_after_the_system_line():
    got = render_prompt(PLAIN, Problem(**{**Q.__dict__, "shots": SHOTS}))
    assert got == "Q: What is 19+1?\nA: \\boxed{20}\n\nQ: What is 10+5?\nA: \\boxed{15}\n\nQ: What is 3+5?\nA:"
    cfg = TemplateConfig(text="{question}\n", system="Answer.", shot_text="{question} = {gold}; ")
    got = render_prompt(cfg, Problem(**{**Q.__dict__, "shots": SHOTS}))
    assert got == "Answer.\n\nWhat is 19+1? = 20; What is 10+5? = 15; What is 3+5?\n"


def test_without_examples_the_prompts_are_byte_identical_to_before():
    """Pinned: these are the prompts of the templates before few-shot examples existed."""
    assert render_prompt(TemplateConfig(), Q) == "What is 3+5?\nPut the final answer in \\boxed{}.\n"
    assert render_prompt(PLAIN, Q) == "Q: What is 3+5?\nA:"
    assert render_prompt(TemplateConfig(system="S"), "x") == "S\n\nx\nPut the final answer in \\boxed{}.\n"


class ChatTok:
    """A tokenizer stand-in whose chat template lists the turns (role: content)."""

    chat_template = "yes"

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True):
        return "".join(f"<{m['role']}>{m['content']}</{m['role']}>" for m in messages) + "<assistant>"


def test_chat_examples_are_earlier_user_and_assistant_turns():
    cfg = TemplateConfig(text="{question}\n{instruction}\n", chat="require", system="Be brief.")
    got = PromptTemplate(cfg, ChatTok()).render(Problem(**{**Q.__dict__, "shots": SHOTS}))
    inst = "Put the final answer in \\boxed{}."
    assert got == (f"<system>Be brief.</system><user>What is 19+1?\n{inst}</user><assistant>\\boxed{{20}}</assistant>"
                   f"<user>What is 10+5?\n{inst}</user><assistant>\\boxed{{15}}</assistant>"
                   f"<user>What is 3+5?\n{inst}</user><assistant>")
    without = PromptTemplate(cfg, ChatTok()).render(Q)
    assert without == f"<system>Be brief.</system><user>What is 3+5?\n{inst}</user><assistant>"


def test_shot_formats_are_checked():
    for kw, words in (({"shot_text": "Q: {question}\n"}, r"shot_text .* has no \{gold\} placeholder"),
                      ({"shot_text": "{gold}"}, r"has no \{question\} placeholder"),
                      ({"shot_reply": "ok"}, r"shot_reply 'ok' has no \{gold\} placeholder"),
                      ({"shot_reply": "\\boxed{gold}"}, r"would read \\boxed19; write \\boxed\{\{gold\}\}"),
                      ({"shot_text": "{question} {answer} {gold}"}, r"has \{answer\}, which no example fills")):
        with pytest.raises(TemplateError, match=words):
            TemplateConfig(**kw)


def test_the_data_fingerprint_covers_the_examples_and_is_unchanged_without_them():
    import hashlib
    import json

    from mrl_llm.data import fingerprint

    old = hashlib.sha256()  # the fingerprint as it was before examples existed
    for p in POOL:
        old.update(json.dumps([p.prompt_id, p.question, p.gold, list(p.choices), p.verifier]).encode("utf-8") + b"\n")
    assert fingerprint(POOL) == old.hexdigest()
    a, b = (attach_shots(POOL, EXAMPLES, FewShotConfig(shots=3, seed=s)) for s in (0, 1))
    assert len({fingerprint(POOL), fingerprint(a), fingerprint(b)}) == 3  # a resume with other examples is caught
