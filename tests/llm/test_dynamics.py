"""``mrl_llm``'s per-prompt dynamics of a run directory (:mod:`mrl_llm.dynamics`): the split, skipped and damaged
rows, the command, and the file every run writes at its end (a tiny real run, and its resume that does the end
again)."""

from __future__ import annotations

import json
import logging
import shutil

import numpy as np
import pytest

from mrl_llm.cli import main
from mrl_llm.dynamics import FILE_NAME, dynamics_from_run, write_run_dynamics
from mrl_llm.resume import restore_run_dir
from mrl_llm.trainer import train
from shared_interfaces.dynamics import DynamicsError, read_dynamics
from tests.crosscheck.helpers import POLICIES, eval_rows, llm_config
from tests.llm.helpers import ShortAnswerVerifier, install_verifier, problems
from tests.llm.test_resume import small_config

POOL = ["add:0", "add:1", "sub:0", "sub:1"]
HELD = ["add:9", "sub:9"]
PROMPTS = POOL + HELD


def _lines(rows) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


def fabricate(d, *, summary_data="exchange", trained=POOL, steps=(0, 5, 10), cfg=None):
    """A finished run directory of policies alpha, beta evaluated on PROMPTS at ``steps`` (successes: step index,
    capped at k = 4; greedy: alpha only), the exchange holding ``trained``'s prompts, and ``summary.json``'s ``data``
    saying the problems were given to train() (``"exchange"``), the evaluation was on the training problems
    (``"eval_on_train"``), absent (``None``: a run stopped before its end)."""
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps(cfg or llm_config("sgt")))
    rows = []
    for j, t in enumerate(steps):
        s = np.full((2, len(PROMPTS)), min(j, 4))
        rows += eval_rows(t, s, np.array([[True] * len(PROMPTS), [False] * len(PROMPTS)]), 4, PROMPTS)
    (d / "eval.jsonl").write_text(_lines(rows))
    train_rows = [{"kind": "train", "step": s, "policy": p, "entropy": 0.5 - 0.01 * s + (p == "beta")}
                  for s in range(10) for p in POLICIES]
    (d / "metrics.jsonl").write_text(_lines(train_rows + [{"kind": "eval", "step": 0, "policy": "alpha"}]))
    (d / "exchange.jsonl").write_text(_lines({"prompt_id": p, "step": 0} for p in trained for _ in range(2)))
    if summary_data is not None:
        sources = {"exchange": ("the problems given to train()", "the evaluation problems given to train()"),
                   "eval_on_train": ("data/train.jsonl", "the training problems")}[summary_data]
        data = {"train": {"source": sources[0], "problems": len(POOL)}, "eval": {"source": sources[1]}}
        (d / "summary.json").write_text(json.dumps({"regime": "sgt", "data": data}))
    return d


def test_dynamics_of_a_run(tmp_path):
    dyn = dynamics_from_run(fabricate(tmp_path / "r"))
    order = sorted(PROMPTS)
    assert dyn.policies == POLICIES and list(dyn.prompts) == order and dyn.steps.tolist() == [0, 5, 10]
    assert dyn.split == tuple("train" if p in POOL else "heldout" for p in order)
    assert dyn.families == tuple(p.split(":")[0] for p in order)
    assert (dyn.samples == 4).all() and dyn.successes[:, :, 0].tolist() == [[0, 1, 2]] * 2
    assert (dyn.greedy_correct[0] == 1).all() and (dyn.greedy_correct[1] == 0).all() and (dyn.skipped == 0).all()
    assert dyn.entropy_steps.tolist() == list(range(10))
    assert dyn.entropy[0].tolist() == pytest.approx([0.5 - 0.01 * s for s in range(10)])
    assert dyn.entropy[1, 0] == pytest.approx(1.5)
    assert dyn.run["seed"] == 0 and dyn.run["regime"]["name"] == "sgt" and dyn.run["eval_k"] == 4
    assert (dyn.run["name"], dyn.run["steps"], dyn.run["prompts_per_step"], dyn.run["group_size"]) == ("fab", 10, 4, 4)
    assert "exchange.jsonl" in dyn.run["split_from"]
    assert dyn.accuracy("heldout")[:, -1].tolist() == [0.5, 0.5]


def test_every_prompt_is_train_when_the_run_evaluated_its_training_problems(tmp_path):
    dyn = dynamics_from_run(fabricate(tmp_path / "a", summary_data="eval_on_train", trained=POOL[:1]))
    assert set(dyn.split) == {"train"} and "summary.json" in dyn.run["split_from"]
    cfg = llm_config("sgt")
    cfg["data"] = {"path": "gone.jsonl", "verifier": "math"}  # a run of `train`, stopped: no summary.json
    dyn = dynamics_from_run(fabricate(tmp_path / "b", summary_data=None, cfg=cfg))
    assert set(dyn.split) == {"train"} and "config.json" in dyn.run["split_from"]


def test_the_split_from_the_training_data_file_of_a_stopped_run(tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_text(_lines({"id": p, "question": f"q {p}", "answer": "1"} for p in POOL))
    cfg = llm_config("grpo")
    cfg["data"] = {"path": str(data), "verifier": "math"}
    cfg["eval"]["data"] = {"path": str(tmp_path / "eval.jsonl"), "verifier": "math"}
    d = fabricate(tmp_path / "r", summary_data=None, trained=POOL[:2], cfg=cfg)
    dyn = dynamics_from_run(d)
    assert [p for p, s in zip(dyn.prompts, dyn.split, strict=True) if s == "train"] == sorted(POOL)
    assert str(data) in dyn.run["split_from"]
    data.unlink()  # the file gone, and the run stopped before its end: nothing says which prompts it trained on
    with pytest.raises(DynamicsError, match=r"cannot tell its training prompts from its held-out ones: it has no "
                                            r"summary.json .* is not there to read; run it to its end"):
        dynamics_from_run(d)


def test_refused_when_the_run_did_not_draw_its_whole_pool(tmp_path, caplog):
    d = fabricate(tmp_path / "r", trained=POOL[:3])
    with pytest.raises(DynamicsError, match="it trained on 3 of its 4 training prompts"):
        dynamics_from_run(d)
    with caplog.at_level(logging.WARNING):
        assert write_run_dynamics(d) is None  # at a run's end without its problems: logged, the run succeeded
    assert "no dynamics.json written" in caplog.text and not (d / FILE_NAME).exists()
    dyn = read_dynamics(write_run_dynamics(d, train_prompts=POOL))  # the runner gives its training problems
    assert dyn.split.count("train") == 4 and "at its end" in dyn.run["split_from"]
    (d / "exchange.jsonl").unlink()
    with pytest.raises(DynamicsError, match=r"its exchange.jsonl \(the prompts it trained on\) is gone; use the dynamics.json the run wrote"):
        dynamics_from_run(d)
    (d / "summary.json").unlink()  # stopped before its end, problems given to train(): nothing to read the pool from
    with pytest.raises(DynamicsError, match="it has no summary.json"):
        dynamics_from_run(d)


def test_skipped_rows_are_counted(tmp_path, caplog):
    d = fabricate(tmp_path / "r")
    rows = [json.loads(x) for x in (d / "eval.jsonl").read_text().splitlines()]
    for r in rows:
        if r["step"] == 5 and r["policy"] == "beta" and r["prompt_id"] in ("add:0", "sub:9"):
            r.update(skipped=True, samples=0, successes=0)
            del r["greedy_correct"]
    (d / "eval.jsonl").write_text(_lines(rows))
    with caplog.at_level(logging.WARNING):
        dyn = read_dynamics(write_run_dynamics(d))
    assert dyn.skipped.tolist() == [[0, 0, 0], [0, 2, 0]]
    c = dyn.prompts.index("add:0")
    assert dyn.samples[1, 1, c] == 0 and np.isnan(dyn.greedy_correct[1, 1, c]) and dyn.samples[1, 2, c] == 4
    assert "2 evaluation rows were skipped" in caplog.text


def test_damaged_logs_name_the_file_and_line(tmp_path):
    d = fabricate(tmp_path / "r")
    ev = (d / "eval.jsonl").read_text()
    (d / "eval.jsonl").write_text(ev + ev.splitlines(keepends=True)[0])  # a repeated row
    with pytest.raises(DynamicsError, match=r"eval.jsonl, line 37: a second row for step 0, policy 'alpha'"):
        dynamics_from_run(d)
    (d / "eval.jsonl").write_text(ev + '{"step": 10, "pol')  # a torn last line
    with pytest.raises(DynamicsError, match="line 37: not a JSON row .* torn last line"):
        dynamics_from_run(d)
    (d / "eval.jsonl").write_text(ev)
    m = (d / "metrics.jsonl").read_text()
    for extra, says in ((json.dumps({"kind": "train", "step": 3, "policy": "alpha", "entropy": 1}), "appears twice"),
                        (json.dumps({"kind": "train", "step": 3, "policy": "gamma"}), "not a step number and one of"),
                        (json.dumps({"kind": "train", "step": 10, "policy": "alpha", "entropy": "x"}),
                         "has entropy 'x', not a number >= 0 or null"),
                        (json.dumps({"kind": "train", "step": 10, "policy": "alpha", "entropy": -0.5}),
                         "has entropy -0.5"),
                        ('{"kind": "tr', "line 22: not a JSON row")):
        (d / "metrics.jsonl").write_text(m + extra + "\n")
        with pytest.raises(DynamicsError, match=says):
            dynamics_from_run(d)
    rolled = {"kind": "train", "step": 3, "policy": "alpha", "entropy": 9.0, "rolled_back": True}
    null = {"kind": "train", "step": 10, "policy": "alpha", "entropy": None}
    (d / "metrics.jsonl").write_text(m + _lines([rolled, null]))
    dyn = dynamics_from_run(d)
    assert dyn.entropy[0, 3] == pytest.approx(0.47) and np.isnan(dyn.entropy[0, 10]) and np.isnan(dyn.entropy[1, 10])
    ex = (d / "exchange.jsonl").read_text()
    (d / "exchange.jsonl").write_text(ex + '{"step": 0}\n')
    with pytest.raises(DynamicsError, match=r"exchange.jsonl, line 9: not an exchange record with a prompt_id"):
        dynamics_from_run(d)
    (d / "exchange.jsonl").write_text(ex)
    (d / "summary.json").write_text("{")
    with pytest.raises(DynamicsError, match=r"summary.json: not JSON .*; the run writes it at its end"):
        dynamics_from_run(d)
    (d / "summary.json").unlink()
    (d / "metrics.jsonl").unlink()
    with pytest.raises(DynamicsError, match="metrics.jsonl does not exist"):
        dynamics_from_run(d)


def test_no_evaluation(tmp_path):
    d = tmp_path / "noeval"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(llm_config("grpo")))
    assert write_run_dynamics(d) is None and not (d / FILE_NAME).exists()  # eval disabled: none, no failure
    with pytest.raises(DynamicsError, match="is not a run directory with an evaluation"):
        dynamics_from_run(d)
    (d / "eval.jsonl").write_text(_lines(eval_rows(5, np.zeros((2, 1)), np.zeros((2, 1)), 4, ["x"])))
    with pytest.raises(DynamicsError, match="has no step-0 evaluation"):
        dynamics_from_run(d)
    (d / "config.json").write_text(json.dumps({**llm_config("grpo"), "steps": "ten"}))
    with pytest.raises(DynamicsError, match=r"config.json: steps is 'ten', not a whole number >= 1; train writes it"):
        dynamics_from_run(d)


def test_the_command(tmp_path, capsys):
    d = fabricate(tmp_path / "r")
    out = tmp_path / "out"
    out.mkdir()
    assert main(["dynamics", "--run", str(d), "--out", str(out)]) == 0  # a directory: dynamics.json in it
    said = capsys.readouterr().out
    assert said.startswith(f"dynamics: {out / FILE_NAME} (2 policies, 6 prompts (4 train, 2 held-out; split: ")
    assert said.rstrip().endswith("3 evaluations, 0 skipped evaluation rows)")
    assert read_dynamics(out / FILE_NAME).to_dict() == dynamics_from_run(d).to_dict()
    assert [p.name for p in out.iterdir()] == [FILE_NAME]
    assert main(["dynamics", "--run", str(d)]) == 0 and (d / FILE_NAME).is_file()  # default: into the run
    (out / FILE_NAME).unlink()
    (out / FILE_NAME).mkdir()
    assert main(["dynamics", "--run", str(d), "--out", str(out)]) == 2
    assert "is a directory; remove it or pass --out FILE" in capsys.readouterr().err
    assert main(["dynamics", "--run", str(tmp_path / "missing")]) == 2
    assert "is not a run directory with an evaluation" in capsys.readouterr().err
    (d / "summary.json").unlink()
    assert main(["dynamics", "--run", str(d), "--out", str(tmp_path / "x.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("mrl_llm dynamics: ") and "cannot tell its training prompts" in err and err.count("\n") == 1


@pytest.fixture
def verifier(monkeypatch):
    v = ShortAnswerVerifier(max_chars=8)
    install_verifier(monkeypatch, v)
    return v


def test_every_run_writes_it_at_its_end_and_a_resume_that_does_the_end_again_too(tmp_path, verifier):
    """A tiny real run (2 steps) evaluated on two of its 4 training prompts and two held-out ones: ``dynamics.json``
    round-trips, matches ``eval.jsonl`` / ``metrics.jsonl``, equals what the command extracts from the directory;
    killed after its last checkpoint and resumed, the run writes the same file again."""
    probs = problems(4)
    evp = probs[:2] + problems(2, prefix="e")
    cfg = small_config(2, eval={"k": 2, "max_prompts": 4, "every": 1})
    train(cfg, tmp_path / "a", problems=probs, eval_problems=evp)
    a = tmp_path / "a"
    dyn = read_dynamics(a / FILE_NAME)
    assert dyn.prompts == ("e0", "e1", "p0", "p1") and dyn.split == ("heldout", "heldout", "train", "train")
    assert dyn.steps.tolist() == [0, 1, 2] and (dyn.samples == 2).all() and (dyn.skipped == 0).all()
    evals = [json.loads(x) for x in (a / "eval.jsonl").read_text().splitlines()]
    assert sorted((r["step"], r["policy"], r["prompt_id"], r["successes"]) for r in evals) == sorted(
        (int(t), p, x, int(dyn.successes[i, k, c])) for i, p in enumerate(dyn.policies)
        for k, t in enumerate(dyn.steps) for c, x in enumerate(dyn.prompts))
    train_rows = [json.loads(x) for x in (a / "metrics.jsonl").read_text().splitlines()]
    want = {(r["step"], r["policy"]): r["entropy"] for r in train_rows if r["kind"] == "train"}
    assert dyn.entropy_steps.tolist() == [0, 1] and all(
        dyn.entropy[dyn.policies.index(p), s] == pytest.approx(v) for (s, p), v in want.items())
    assert dyn.run["steps"] == 2 and dyn.run["seed"] == 11 and dyn.run["regime"]["name"] == "prp_thl+sgt"
    # the directory alone gives the same file: the exchange holds all 4 training prompts (2 steps x 2)
    extracted = dynamics_from_run(a).to_dict()
    assert {**extracted, "run": None} == {**dyn.to_dict(), "run": None}
    # a resume cuts the directory back: the end's dynamics (every evaluation's) go until the new end
    c = tmp_path / "c"
    shutil.copytree(a, c)
    restore_run_dir(cfg, c, 0)
    assert not (c / FILE_NAME).exists() and (a / FILE_NAME).exists()
    # killed after the last checkpoint: no final evaluation, export or summary; the resume writes the file again
    b = tmp_path / "b"
    shutil.copytree(a, b)
    shutil.rmtree(b / "policies")
    (b / "summary.json").unlink()
    for name, drop in (("eval.jsonl", lambda r: r["step"] == 2),
                       ("metrics.jsonl", lambda r: r["kind"] == "eval" and r["step"] == 2)):
        rows = [x for x in (b / name).read_text().splitlines(keepends=True) if not drop(json.loads(x))]
        (b / name).write_text("".join(rows))
    train(cfg, b, resume=True, problems=probs, eval_problems=evp)
    assert read_dynamics(b / FILE_NAME).to_dict() == dyn.to_dict()
