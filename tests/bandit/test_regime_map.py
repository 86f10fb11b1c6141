"""``experiments.bandit.regime_map`` on a small real sweep: cells, claims, stability table and the files."""

from __future__ import annotations

import json
import math

from bandit_sim.sweep import run_sweep
from bandit_sim.sweep_config import load_grid
from experiments.bandit.regime_map import _verdict, combine, main, regime_map


def test_combine_and_verdict():
    rows = [{"a": 1.0, "a_ci95": 0.3}, {"a": 3.0, "a_ci95": 0.4}, {"a": None}]
    assert combine(rows, "a") == (2.0, 0.25)
    assert math.isnan(combine([], "a")[0])
    assert _verdict(0.1, 0.05) == "win" and _verdict(-0.1, 0.05) == "loss" and _verdict(0.04, 0.05) == "tie"
    assert _verdict(1e-18, 0.0) == "tie"  # below the practical threshold
    assert _verdict(math.nan, 0.0) is None


def test_regime_map_of_the_smoke_grid(tmp_path, capsys):
    run_sweep(load_grid("smoke"), tmp_path / "s", progress=False)
    res = regime_map(tmp_path / "s")
    assert res["points"] == res["grid_points"] == 4
    assert len(res["maps"]) == 2 and all(len(m["cells"]) == 4 for m in res["maps"])
    for m in res["maps"]:
        for c in m["cells"]:
            vals = {g: v[0] for g, v in c["values"].items()}
            assert c["winner"] == max(vals, key=vals.get) and c["margin"] >= 0
    for c in res["claims"]:
        assert c["of"] == 4 and 0 <= c["points"] <= 4
    assert {s["regime"] for s in res["stability"]} == set(res["regimes"])
    assert main(["--sweep", str(tmp_path / "s"), "--out", str(tmp_path / "m")]) == 0
    assert "# Regime map" in (tmp_path / "m" / "regime_map.md").read_text()
    assert json.loads((tmp_path / "m" / "regime_map.json").read_text())["points"] == 4
    # the committed form (sweep.json without the point files) maps the same
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "sweep.json").write_text((tmp_path / "s" / "sweep.json").read_text())
    assert regime_map(tmp_path / "c")["claims"] == res["claims"]
