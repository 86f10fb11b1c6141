"""Sweep grids as YAML (:mod:`bandit_sim.sweep_config`): the named grids and malformed files."""

from __future__ import annotations

import pytest

from bandit_sim.presets import get_preset
from bandit_sim.sweep_config import apply_point, grid_from_mapping, load_grid, named_grids
from shared_interfaces.config_io import ConfigError


def test_named_grids_load():
    assert {"paper", "paper-full", "smoke"} <= set(named_grids())
    paper, full = load_grid("paper"), load_grid("paper-full")
    assert len(paper.points()) == 108 and len(full.points()) == 108
    assert paper.axes == full.axes
    # paper-full's points have the paper preset's full size; paper is the smaller problem
    assert full.base == get_preset("paper")
    assert (paper.base.generator.n_contexts, paper.base.seeds, paper.base.steps) == (128, 16, 400)
    assert load_grid("smoke").points() == [{"overlap": 0.2, "thl_sigma": 0.0}, {"overlap": 0.2, "thl_sigma": 1.0},
                                           {"overlap": 0.8, "thl_sigma": 0.0}, {"overlap": 0.8, "thl_sigma": 1.0}]


def test_grid_file(tmp_path):
    f = tmp_path / "g.yaml"
    f.write_text("base: smoke\noverrides: {steps: 7, sgt: {weight: 0.3}}\naxes: {lr: [1.0, 2.0], group_size: [2]}\n")
    grid = load_grid(f)
    assert grid.base.steps == 7 and grid.base.sgt.weight == 0.3
    assert grid.points() == [{"lr": 1.0, "group_size": 2}, {"lr": 2.0, "group_size": 2}]
    cfg = apply_point(grid.base, grid.points()[1])
    assert (cfg.lr, cfg.group_size) == (2.0, 2)


def test_overlap_caps_unsolved():
    base = get_preset("smoke")
    cfg = apply_point(base, {"overlap": 0.95})
    assert cfg.generator.overlap == 0.95 and cfg.generator.unsolved == pytest.approx(0.05)


@pytest.mark.parametrize(("data", "needle"), [
    ({}, "'base' must name a run preset"),
    ([1, 2], "expected a mapping"),
    ({"base": "smoke", "axes": {"lr": [1.0]}, "extra": 1}, "unknown key(s) ['extra']"),
    ({"base": "nope", "axes": {"lr": [1.0]}}, "unknown preset 'nope'"),
    ({"base": "smoke", "axes": {"temperature": [1.0]}}, "unknown axis 'temperature'"),
    ({"base": "smoke", "axes": {}}, "'axes' must be a non-empty mapping"),
    ({"base": "smoke", "axes": {"lr": []}}, "axis lr must be a non-empty list"),
    ({"base": "smoke", "axes": {"lr": "fast"}}, "axis lr must be a non-empty list"),
    ({"base": "smoke", "axes": {"lr": [1.0, "x"]}}, "non-numeric value(s) ['x']"),
    ({"base": "smoke", "axes": {"lr": [1.0, 1.0]}}, "lists a value twice"),
    ({"base": "smoke", "overrides": {"stepz": 3}, "axes": {"lr": [1.0]}}, "unknown key(s) ['stepz']"),
    ({"base": "smoke", "overrides": [1], "axes": {"lr": [1.0]}}, "'overrides' must be a mapping"),
    ({"base": "smoke", "axes": {"lr": [1.0, -2.0]}}, "lr must be > 0"),
    ({"base": "smoke", "axes": {"lr": [1.0, float("inf")]}}, "axis lr: inf is not a finite number"),
    ({"base": "smoke", "axes": {"thl_sigma": [float("nan")]}}, "axis thl_sigma: nan is not a finite number"),
    ({"base": "smoke", "axes": {"group_size": [4, 4.2]}}, "axis group_size: 4.2 is not a whole number"),
    ({"base": "smoke", "overrides": {"batch_prompts": 64}, "axes": {"lr": [1.0]}},
     "batch_prompts 64 exceeds the generated scenario's 32 contexts"),
    ({"base": "smoke", "overrides": {"scenario": "s.npz"}, "axes": {"overlap": [0.2, 0.8]}},
     "axis overlap changes the generated scenario, but the config reads scenario s.npz"),
])
def test_malformed_grids_name_the_problem(data, needle):
    with pytest.raises(ConfigError) as err:
        grid_from_mapping(data)
    assert needle in str(err.value)


def test_missing_and_unknown_grid_files(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_grid(tmp_path / "none.yaml")
    with pytest.raises(ConfigError, match="unknown sweep grid 'huge'"):
        load_grid("huge")
    (tmp_path / "empty.yaml").write_text("")
    with pytest.raises(ConfigError, match="'base' must name a run preset"):
        load_grid(tmp_path / "empty.yaml")


def test_a_grid_past_the_point_limit_is_refused_before_its_product_is_built(tmp_path, capsys):
    """A 1.2 KB grid of 4 axes x 32 values (about a million points) was still loading after 90 s, and one of
    5 x 200 values exhausted memory: the whole product was built and validated before any size check."""
    import time

    from bandit_sim.cli import main

    axes = {"overlap": [round(0.01 * i, 2) for i in range(1, 201)], "group_size": list(range(2, 202)),
            "thl_sigma": [0.01 * i for i in range(200)], "sgt_weight": [0.01 * i for i in range(200)],
            "lr": [0.1 * (i + 1) for i in range(200)]}
    small = {k: v[:3] for k, v in list(axes.items())[:2]}
    with pytest.raises(ConfigError, match="3 x 3 = 9 points, more than the limit of 8"):
        grid_from_mapping({"base": "smoke", "axes": small}, max_points=8)
    assert len(grid_from_mapping({"base": "smoke", "axes": small}, max_points=9).points()) == 9
    t0 = time.perf_counter()
    with pytest.raises(ConfigError, match=r"200 x 200 x 200 x 200 x 200 = 320000000000 points, more than the limit "
                                          r"of 10000 .*pass --max-points 320000000000"):
        grid_from_mapping({"base": "smoke", "axes": axes})
    assert time.perf_counter() - t0 < 5
    f = tmp_path / "g.yaml"
    f.write_text("base: smoke\naxes:\n" + "".join(f"  {k}: {v[:32]}\n" for k, v in list(axes.items())[:4]))
    assert main(["sweep", "--grid", str(f), "--out", str(tmp_path / "s"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "32 x 32 x 32 x 32 = 1048576 points" in err and "--max-points 1048576" in err and not (tmp_path / "s").exists()
    with pytest.raises(SystemExit):
        main(["sweep", "--grid", str(f), "--out", str(tmp_path / "s"), "--quiet", "--max-points", "0"])
    assert "--max-points: must be >= 1, got 0" in capsys.readouterr().err


def test_a_recorded_grid_past_the_point_limit_is_refused(tmp_path, capsys):
    from bandit_sim.cli import main

    f = tmp_path / "g.yaml"
    f.write_text("base: smoke\noverrides: {steps: 2, seeds: 1, regimes: [grpo]}\naxes: {lr: [1.0, 2.0, 3.0]}\n")
    assert main(["sweep", "--grid", str(f), "--out", str(tmp_path / "s"), "--quiet"]) == 0
    assert main(["sweep", "--resume", str(tmp_path / "s"), "--quiet", "--max-points", "2"]) == 2
    assert "3 = 3 points, more than the limit of 2" in capsys.readouterr().err


@pytest.mark.parametrize(("axes", "msg"), [({"group_size": [2**64]}, "does not fit a signed 64-bit integer"),
                                           ({"lr": [10**400]}, "is not a finite number")])
def test_axis_integers_past_64_bits_are_refused_at_load(axes, msg):
    """An lr of 10**400 raised OverflowError (a traceback); a group_size of 2**64 loaded and failed in every run."""
    with pytest.raises(ConfigError, match=msg):
        grid_from_mapping({"base": "smoke", "axes": axes})
