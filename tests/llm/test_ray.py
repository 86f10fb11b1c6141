"""The trainer on the Ray runtime (``runtime: {backend: ray}``) on a real local Ray cluster (2 CPUs):

* two tiny LLM policies, 2 synchronous steps through :func:`mrl_llm.trainer.train`: the run directory
  equals the single-process loop's (metrics and eval rows up to timings, the exchange's records,
  bit-identical final weights), and the regimes really shared experience (PRP rows, SGT activations);
* three LLM policies in asynchronous mode with staleness 1, one of them joining late;
* an LLM policy's actor crashing mid-run: Ray restarts it from its last checkpoint, the other policy
  continues without its records (a ``gap``), it rejoins with its checkpoint's weights (``rejoin`` with
  the lost steps) and the run finishes with every file written;
* a Ray run stopped after step 1 and resumed (``--resume``) ends equal to an uninterrupted one.

One Ray cluster for the module; its workers register the test verifier ``short8`` at start-up.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from safetensors.torch import load_file

from mrl_llm.config import config_from_mapping
from mrl_llm.contract import learner_tokenizer_dir
from mrl_llm.distributed.actors import FaultInjection
from mrl_llm.distributed.ray_trainer import train_on_ray
from mrl_llm.metrics import TIMING_KEYS
from mrl_llm.trainer import train
from shared_interfaces.dynamics import read_dynamics
from tests.llm.helpers import local_ray, problems, tiny

pytestmark = [pytest.mark.ray, pytest.mark.slow]

PROBLEMS = problems(6, verifier="short8")


@pytest.fixture(scope="module")
def ray_llm():
    with local_ray("mrl-tests", test_verifiers=True) as ray:
        yield ray


def policy(name: str, model_type: str, tokenizer: str, max_new_tokens: int) -> dict:
    return {"name": name, "model_config": tiny(model_type), "tokenizer_dir": tokenizer, "group_size": 2,
            "sampling": {"max_new_tokens": max_new_tokens}, "train": {"lr": 1e-3}}


def config(pols: list[dict], *, steps: int = 2, regime: str = "prp_thl+sgt", runtime: dict | None = None, **extra):
    return config_from_mapping({
        "seed": 5, "steps": steps, "prompts_per_step": 2, "regime": {"name": regime}, "threads": 1,
        "tensorboard": False, "progress": False, "policies": pols,
        "runtime": runtime or {"backend": "ray"}, **extra,
    })


def run_files(d, names):
    rows = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
    evals = [json.loads(x) for x in (d / "eval.jsonl").read_text().splitlines()]
    weights = {n: load_file(d / "policies" / n / "model.safetensors") for n in names}
    records = sorted((d / "exchange.jsonl").read_text().split("\n")[:-1])  # publishers run concurrently under Ray
    return [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in rows], evals, weights, records


def test_ray_runtime_equals_the_single_process_loop(ray_llm, tmp_path):
    pols = [policy("a", "llama", "utf8-bytes", 4), policy("b", "qwen2", learner_tokenizer_dir(), 16)]
    cfg = config(pols, eval={"k": 2, "max_prompts": 3, "every": 1})
    train(replace(cfg, runtime=replace(cfg.runtime, backend="local")), tmp_path / "local", problems=PROBLEMS)
    summary = train(cfg, tmp_path / "ray", problems=PROBLEMS)

    rows_l, evals_l, w_l, recs_l = run_files(tmp_path / "local", "ab")
    rows_r, evals_r, w_r, recs_r = run_files(tmp_path / "ray", "ab")
    assert rows_r == rows_l
    assert evals_r == evals_l and {e["step"] for e in evals_r} == {0, 1, 2}
    assert recs_r == recs_l
    for n in "ab":
        assert w_r[n].keys() == w_l[n].keys() and all(w_r[n][k].equal(w_l[n][k]) for k in w_l[n]), n
    # the regimes really shared experience, and the weights moved
    train_rows = {(r["step"], r["policy"]): r for r in rows_r if r["kind"] == "train"}
    assert sorted(train_rows) == [(0, "a"), (0, "b"), (1, "a"), (1, "b")]
    assert all(r["peer_rows"] == 4 and r["grad_norm"] > 0 for r in train_rows.values())
    assert all(train_rows[(s, "a")]["reward_mean"] == 1.0 for s in (0, 1))  # short texts: a always succeeds
    assert sum(train_rows[(s, "b")]["sgt_activations"] for s in (0, 1)) >= 1
    assert summary["runtime"] == "ray" and [p["name"] for p in summary["policies"]] == ["a", "b"]
    assert summary["policies"][1]["compute"]["optimizer_steps"] == 2 and summary["events"] == []
    plan = (tmp_path / "ray" / "plan.txt").read_text()
    assert "a" in plan and "b" in plan
    dyn = read_dynamics(tmp_path / "ray" / "dynamics.json")  # the run's end writes it on Ray too
    assert dyn.to_dict() == read_dynamics(tmp_path / "local" / "dynamics.json").to_dict() and dyn.steps.tolist() == [0, 1, 2]


def test_three_policies_async_with_a_late_joiner(ray_llm, tmp_path):
    pols = [policy("a", "llama", "utf8-bytes", 4), policy("b", "qwen2", learner_tokenizer_dir(), 12),
            {**policy("c", "mistral", "utf8-bytes", 6), "join_step": 1}]
    cfg = config(pols, steps=3, regime="sgt+xgrpo", eval={"enabled": False},
                 runtime={"backend": "ray", "mode": "async", "max_staleness": 1})
    train(cfg, tmp_path, problems=PROBLEMS)
    rows = {(r["step"], r["policy"]): r for r in map(json.loads, (tmp_path / "metrics.jsonl").read_text().splitlines())}
    assert sorted(rows) == sorted([(0, "a"), (0, "b"), (1, "a"), (1, "b"), (1, "c"), (2, "a"), (2, "b"), (2, "c")])
    assert rows[(2, "c")]["version"] == 2 and rows[(2, "a")]["version"] == 3
    assert all(r["stale_dropped"] == 0 for r in rows.values())
    recs = [json.loads(x) for x in (tmp_path / "exchange.jsonl").read_text().split("\n")[:-1]]
    lags = {r["step"] - r["policy_version"] for r in recs if r["policy_id"] != "c"}
    assert lags <= {0, 1} and 1 in lags  # generation really ran one step ahead of training
    assert {r["step"] for r in recs if r["policy_id"] == "c"} == {1, 2}
    events = [json.loads(x) for x in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert [(e["event"], e["policy"], e["step"]) for e in events if e["policy"] == "c"] == [("join", "c", 1)]
    assert json.loads((tmp_path / "summary.json").read_text())["policies"][2]["compute"]["optimizer_steps"] == 2


def test_a_crashed_llm_policy_restarts_from_its_checkpoint_and_the_run_finishes(ray_llm, tmp_path):
    pols = [policy("a", "llama", "utf8-bytes", 4), policy("b", "qwen2", learner_tokenizer_dir(), 12)]
    cfg = config(pols, steps=4, eval={"enabled": False}, checkpoint_every=2)
    summary = train_on_ray(cfg, tmp_path, problems=PROBLEMS, faults={"b": FaultInjection(step=2, phase="train")})
    events = [json.loads(x) for x in (tmp_path / "events.jsonl").read_text().splitlines()]
    gaps = [e for e in events if e["event"] == "gap"]
    rejoins = [e for e in events if e["event"] == "rejoin"]
    assert [(g["step"], g["policy"], g["phase"]) for g in gaps] == [(2, "b", "train")]
    # checkpoints after steps 1 and 3: b comes back at step 3 with step 1's weights (version 2)
    assert [(r["step"], r["policy"], r["checkpoint_step"], r["version"], r["lost_steps"]) for r in rejoins] == [
        (3, "b", 1, 2, [2])]
    rows = {(r["step"], r["policy"]): r for r in map(json.loads, (tmp_path / "metrics.jsonl").read_text().splitlines())}
    assert sorted(rows) == [(0, "a"), (0, "b"), (1, "a"), (1, "b"), (2, "a"), (3, "a"), (3, "b")]
    assert rows[(3, "b")]["version"] == 3 and rows[(3, "a")]["version"] == 4
    assert rows[(3, "a")]["peer_rows"] > 0  # b's records are back in a's batch after the rejoin
    recs = [json.loads(x) for x in (tmp_path / "exchange.jsonl").read_text().split("\n")[:-1]]
    assert {r["policy_version"] for r in recs if r["policy_id"] == "b" and r["step"] == 3} == {2}
    assert (tmp_path / "policies" / "b" / "model.safetensors").is_file()
    assert [(e["event"], e["policy"]) for e in summary["events"]] == [("gap", "b"), ("rejoin", "b")]


def test_a_stopped_ray_run_resumed_equals_an_uninterrupted_one(ray_llm, tmp_path):
    pols = [policy("a", "llama", "utf8-bytes", 4), policy("b", "qwen2", learner_tokenizer_dir(), 12)]
    cfg = config(pols, steps=3, eval={"k": 2, "max_prompts": 3, "every": 1}, checkpoint_every=2)
    train(cfg, tmp_path / "whole", problems=PROBLEMS)
    train(replace(cfg, steps=2), tmp_path / "parts", problems=PROBLEMS)  # no checkpoint step: saved at its end
    with pytest.raises(FileExistsError, match="--resume"):
        train(cfg, tmp_path / "parts", problems=PROBLEMS)
    summary = train(cfg, tmp_path / "parts", resume=True, problems=PROBLEMS)

    whole, parts = run_files(tmp_path / "whole", "ab"), run_files(tmp_path / "parts", "ab")
    assert parts[0] == whole[0] and parts[1] == whole[1] and parts[3] == whole[3]
    for n in "ab":
        assert all(parts[2][n][k].equal(whole[2][n][k]) for k in whole[2][n]), n
    assert [p["compute"] for p in summary["policies"]] == [
        p["compute"] for p in json.loads((tmp_path / "whole" / "summary.json").read_text())["policies"]]
    events = [json.loads(x) for x in (tmp_path / "parts" / "events.jsonl").read_text().splitlines()]
    assert [(e["event"], e["step"], e["checkpoint_step"]) for e in events if e["event"] == "resume"] == [("resume", 2, 1)]


def test_a_ray_run_killed_after_its_last_checkpoint_resumes_into_its_end(ray_llm, tmp_path):
    """As a kill after the last step's record leaves it (no final evaluation, no export): the resume on Ray runs no
    step and does the end again — the same evaluation rows, weights and compute as the whole run."""
    import shutil

    pols = [policy("a", "llama", "utf8-bytes", 4), policy("b", "qwen2", learner_tokenizer_dir(), 12)]
    cfg = config(pols, steps=2, eval={"k": 2, "max_prompts": 3})
    whole = train(cfg, tmp_path / "whole", problems=PROBLEMS)
    run = tmp_path / "cut"
    shutil.copytree(tmp_path / "whole", run)
    shutil.rmtree(run / "policies")
    (run / "summary.json").unlink()
    (run / "dynamics.json").unlink()
    for name, drop in (("eval.jsonl", lambda r: r["step"] == 2),
                       ("metrics.jsonl", lambda r: r["kind"] == "eval" and r["step"] == 2)):
        rows = [x for x in (run / name).read_text().splitlines(keepends=True) if not drop(json.loads(x))]
        (run / name).write_text("".join(rows))
    summary = train(cfg, run, resume=True, problems=PROBLEMS)
    got, want = run_files(run, "ab"), run_files(tmp_path / "whole", "ab")
    assert got[0] == want[0] and got[1] == want[1] and got[3] == want[3]
    for n in "ab":
        assert all(got[2][n][k].equal(want[2][n][k]) for k in want[2][n]), n
    assert [p["compute"] for p in summary["policies"]] == [p["compute"] for p in whole["policies"]]
    assert read_dynamics(run / "dynamics.json").to_dict() == read_dynamics(tmp_path / "whole" / "dynamics.json").to_dict()


def test_rolled_back_rows_are_marked_and_an_edited_ray_run_is_not_resumed(ray_llm, tmp_path):
    """Issue 13, item 6: b dies in step 2 before its first checkpoint (step 2, ``checkpoint_every: 3``) and
    restarts from its initial weights, so its updates of steps 0 and 1 are gone: their rows are marked
    ``rolled_back`` and readers skip them. Items 3-5 on Ray: a resume of the finished run refuses an
    edited exchange log, a flipped bit in a checkpoint file and an edited dataset, changing nothing."""
    import shutil

    from mrl_llm.metrics import read_metrics
    from mrl_llm.runstate import CheckpointError

    pols = [policy("a", "llama", "utf8-bytes", 4), policy("b", "qwen2", learner_tokenizer_dir(), 12)]
    cfg = config(pols, steps=4, eval={"enabled": False}, checkpoint_every=3)
    summary = train_on_ray(cfg, tmp_path / "run", problems=PROBLEMS, faults={"b": FaultInjection(step=2)})
    run = tmp_path / "run"
    events = [json.loads(x) for x in (run / "events.jsonl").read_text().splitlines()]
    assert [(e["step"], e["checkpoint_step"], e["lost_steps"], e["rolled_back_steps"])
            for e in events if e["event"] == "rejoin"] == [(3, None, [0, 1, 2], [0, 1])]
    rows = read_metrics(run / "metrics.jsonl", rolled_back=True)
    assert {(r["step"], r["policy"]) for r in rows if r.get("rolled_back")} == {(0, "b"), (1, "b")}
    kept = read_metrics(run / "metrics.jsonl")
    assert sorted((r["step"], r["policy"]) for r in kept) == [(0, "a"), (1, "a"), (2, "a"), (3, "a"), (3, "b")]
    assert summary["policies"][1]["sgt_activations"] == sum(r.get("sgt_activations") or 0 for r in kept
                                                             if r["policy"] == "b")
    from mrl_llm.resume import resume_step

    assert "3" in json.loads((run / "checkpoints" / "run_state.json").read_text())["steps"]
    assert resume_step(cfg, run) == 3  # b has no checkpoint of step 2 (it died in it)

    def refused(name, edit, err, match, probs=PROBLEMS):
        d = tmp_path / name
        shutil.copytree(run, d)
        edit(d)
        before = {p: p.read_bytes() for p in d.rglob("*") if p.is_file()}
        with pytest.raises(err, match=match):
            train_on_ray(replace(cfg, steps=5), d, resume=True, problems=probs)
        assert {p: p.read_bytes() for p in d.rglob("*") if p.is_file()} == before

    def edit_log(d):  # a wrong answer of step 1 claimed correct
        lines = (d / "exchange.jsonl").read_text().split("\n")
        k = next(i for i, x in enumerate(lines) if '"step":1,' in x and '"reward":0.0' in x)
        lines[k] = lines[k].replace('"reward":0.0', '"reward":1.0')
        (d / "exchange.jsonl").write_text("\n".join(lines))

    def flip_bit(d):
        f = d / "checkpoints" / "a" / "step_3" / "optimizer.pt"
        data = bytearray(f.read_bytes())
        data[-20] ^= 1
        f.write_bytes(bytes(data))

    refused("log", edit_log, CheckpointError, r"exchange\.jsonl was edited")
    refused("bit", flip_bit, CheckpointError, r"a/step_3/optimizer\.pt does not match its digest")
    other = [replace(p, gold="7") if i == 1 else p for i, p in enumerate(PROBLEMS)]
    refused("data", lambda d: None, ValueError, "the problems given to train.. differs", probs=other)
