"""``experiments/bench/ranks_overhead.py``'s arguments: the FSDP units it measures, empty and malformed lists refused
before any run starts; each k-rank config carries the unit and per-sample seeds."""

from __future__ import annotations

import pytest

from experiments.bench.ranks_overhead import main, with_ranks


@pytest.mark.parametrize("units", ["", " , ", "layer,block"])
def test_an_empty_or_unknown_unit_list_is_refused(units):
    with pytest.raises(SystemExit, match="--fsdp-units must list some of layer, model, none"):
        main(["--fsdp-units", units])


@pytest.mark.parametrize("syncs", ["", "micro_batch,step"])
def test_an_empty_or_unknown_grad_sync_list_is_refused(syncs):
    with pytest.raises(SystemExit, match="--grad-syncs must list some of micro_batch, mini_batch"):
        main(["--grad-syncs", syncs])


def test_the_bench_knows_every_unit_and_sync_the_trainer_does():
    import experiments.bench.ranks_overhead as bench
    from mrl_llm.parallel.fsdp import FSDP_UNITS
    from mrl_llm.parallel.share import GRAD_SYNCS

    assert (bench.FSDP_UNITS, bench.GRAD_SYNCS) == (FSDP_UNITS, GRAD_SYNCS)


def test_each_fsdp_unit_runs_with_each_sync_and_replicas_once():
    from experiments.bench.ranks_overhead import layouts

    assert layouts(["layer", "none"], ["micro_batch", "mini_batch"]) == [
        ("layer", "micro_batch"), ("layer", "mini_batch"), ("none", "micro_batch")]
    assert layouts([], ["micro_batch"]) == []


def test_the_k_rank_config_carries_ranks_unit_and_per_sample_seeds():
    from mrl_llm.config import config_from_mapping
    from tests.llm.helpers import tiny

    cfg = config_from_mapping({"policies": [{"name": "a", "model_config": tiny("llama"), "tokenizer_dir": "utf8-bytes"}]})
    p = with_ranks(cfg, 2, "model", "mini_batch").policies[0]
    assert (p.ranks, p.train.fsdp_unit, p.train.grad_sync, p.sampling.seeding) == (2, "model", "mini_batch", "sample")


def test_a_repeat_below_one_is_refused():
    with pytest.raises(SystemExit, match="--repeat at least 1"):
        main(["--repeat", "0"])


def fake_runs(monkeypatch, run):
    """The bench's training runs faked: ``run(config)`` gives ``(wall, rows)``, the step wall time of steps 1 and 2 and
    the metric rows (``kind: train`` added) each run writes; Ray is not started."""
    import json

    import ray

    import experiments.bench.step_overhead as step_overhead
    import mrl_llm.distributed.ray_trainer as ray_trainer
    from mrl_llm.config import config_from_mapping
    from tests.llm.helpers import tiny

    cfg = config_from_mapping({"policies": [{"name": "a", "model_config": tiny("llama"), "tokenizer_dir": "utf8-bytes"}]})

    def fake_run(c, out, problems=None):
        wall, rows = run(c)
        out.mkdir(parents=True)
        (out / "runtime.json").write_text(json.dumps({"step_wall_s": {"0": 9.0, "1": wall, "2": wall}}))
        zero = dict.fromkeys(("generation_s", "scoring_s", "exchange_thl_s", "update_s", "sync_s"), 0.0)
        (out / "metrics.jsonl").write_text("".join(json.dumps({"kind": "train", **zero, **r}) + "\n" for r in rows))
        (out / "plan.txt").write_text("MWRA plan: faked\n")

    monkeypatch.setattr(step_overhead, "bench_config", lambda args: (cfg, None))
    monkeypatch.setattr(ray_trainer, "train_on_ray", fake_run)
    monkeypatch.setattr(ray, "init", lambda **kw: None)
    monkeypatch.setattr(ray, "shutdown", lambda: None)


def test_repeated_rounds_interleave_the_runs_and_give_each_rounds_ratio_and_the_median(monkeypatch, capsys):
    """Step times by round and k: the order of the runs, one ratio per round against that round's one-rank run,
    and their median."""
    walls = iter([1.0, 1.2, 1.5, 2.0])  # round 1: k = 1, k = 2; round 2: k = 1, k = 2
    order = []

    def run(c):
        order.append(c.policies[0].ranks)
        return next(walls), [{"step": s, "policy": "a", "generation_s": 0.1, "step_s": 0.1} for s in (1, 2)]

    fake_runs(monkeypatch, run)
    assert main(["--steps", "3", "--fsdp-units", "model", "--grad-syncs", "mini_batch", "--repeat", "2"]) == 0
    assert order == [1, 2, 1, 2]
    out = capsys.readouterr().out
    assert "1.200 / 1.000 s = 1.20x (round 1)" in out and "2.000 / 1.500 s = 1.33x (round 2)" in out
    assert "ranks 2, fsdp_unit model, grad_sync mini_batch: median 1.27x -> MISSES the 1.15 target" in out
    assert "each policy's own step: a 0.100" in out and "slowest policy's own step" not in out  # one policy: even


def test_each_policys_own_step_and_how_uneven_they_are():
    from experiments.bench.ranks_overhead import imbalance, own_steps

    rows = [{"policy": "q", "step_s": 4.0}, {"policy": "l", "step_s": 1.0}, {"policy": "q", "step_s": 6.0}]
    assert own_steps(rows) == {"l": 1.0, "q": 5.0}
    assert imbalance(own_steps(rows)) == 5.0
    assert own_steps([]) == {} and imbalance({}) == 1.0 and imbalance({"q": 2.0}) == 1.0
    assert imbalance({"q": 2.0, "l": 0.0}) == 1.0  # no division by a zero step


def test_uneven_policies_at_one_rank_are_called_out(monkeypatch, capsys):
    """At k = 1 a 5:1 pair leaves a core idle most of the step; the bench says its ratios are not the overhead alone."""
    fake_runs(monkeypatch, lambda c: (5.0, [{"step": 1, "policy": n, "update_s": v, "step_s": v}
                                           for n, v in (("q", 5.0), ("l", 1.0))]))
    assert main(["--steps", "2", "--fsdp-units", "none"]) == 0
    out = capsys.readouterr().out
    assert "each policy's own step: l 1.000, q 5.000" in out
    assert "at k = 1 the slowest policy's own step is 5.0x the fastest's" in out
