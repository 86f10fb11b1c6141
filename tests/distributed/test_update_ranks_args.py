"""``experiments/bench/update_ranks.py``: its layouts are the trainer's (unknown or empty lists refused before
anything starts), malformed sizes are refused, and a tiny real run prints every ratio it promises."""

from __future__ import annotations

import pytest

from experiments.bench.update_ranks import LAYOUTS, main, parse_layouts


def test_layouts_parse_and_cover_the_trainers_units_and_syncs():
    from mrl_llm.parallel.fsdp import FSDP_UNITS
    from mrl_llm.parallel.share import GRAD_SYNCS

    assert parse_layouts("layer/mini_batch, none") == [("layer", "mini_batch"), ("none", "micro_batch")]
    assert {u for u, _ in parse_layouts(",".join(LAYOUTS))} == set(FSDP_UNITS)
    assert {s for _, s in parse_layouts(",".join(LAYOUTS))} == set(GRAD_SYNCS)
    for bad in ("", " , ", "layer", "block/micro_batch", "layer/step"):
        with pytest.raises(SystemExit, match="--layouts must list some of"):
            parse_layouts(bad)


@pytest.mark.parametrize("argv", [["--ranks", "1"], ["--steps", "3", "--warmup", "3"], ["--rows", "0"],
                                  ["--max-response", "0"], ["--vocab", "1"], ["--warmup", "-1"]])
def test_malformed_sizes_are_refused_before_anything_runs(argv):
    with pytest.raises(SystemExit, match="--ranks must be >= 2"):
        main(argv)


def test_hidden_must_split_over_the_heads():
    with pytest.raises(SystemExit, match="--hidden must be a multiple of the 4 attention heads, got 6"):
        main(["--hidden", "6"])


def test_a_tiny_run_prints_the_layouts_ratios(capsys):
    assert main(["--layouts", "layer/mini_batch", "--rows", "6", "--micro-batch", "2", "--hidden", "16",
                 "--layers", "1", "--vocab", "32", "--max-response", "4", "--steps", "2", "--warmup", "1"]) == 0
    out = capsys.readouterr().out
    assert "1 process: update" in out and "2 processes side by side without a group" in out
    assert "2 ranks layer/mini_batch / 1 process = " in out and "/ 2 processes without a group = " in out
