"""The Ray runtime of ``bandit_sim sweep`` on real local clusters (slow: a cluster start costs seconds)."""

from __future__ import annotations

import csv
import os

import pytest

from bandit_sim.sweep import run_sweep
from bandit_sim.sweep_config import load_grid
from tests.bandit.sweep_helpers import fail_on_overlap, niceness_point

pytestmark = [pytest.mark.slow, pytest.mark.ray]

GRID = "base: smoke\noverrides: {steps: 20, seeds: 2, record_every: 10}\naxes: {overlap: [0.2, 0.8], thl_sigma: [0.0, 1.0]}\n"


@pytest.fixture
def grid(tmp_path):
    pytest.importorskip("ray")
    f = tmp_path / "grid.yaml"
    f.write_text(GRID)
    return load_grid(f)


def _rows(path):
    with open(path) as fh:
        return list(csv.DictReader(fh))


def test_ray_and_sequential_give_equal_rows_and_failures_are_listed(tmp_path, grid):
    import ray

    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    seq = run_sweep(grid, tmp_path / "seq", progress=False, workers=2)
    par = run_sweep(grid, tmp_path / "ray", runtime="ray", progress=False)
    assert not ray.is_initialized()  # the local cluster it started is shut down
    assert par.rows == seq.rows and _rows(tmp_path / "ray" / "sweep.csv") == _rows(tmp_path / "seq" / "sweep.csv")
    bad = run_sweep(grid, tmp_path / "bad", runtime="ray", progress=False, point_fn=fail_on_overlap)
    assert [f["point"]["overlap"] for f in bad.failures] == [0.8, 0.8]
    assert all(f["attempts"] == 2 and "injected failure at overlap 0.8" in f["error"] for f in bad.failures)
    assert bad.rows == [r for r in seq.rows if r["overlap"] == 0.2]


def test_two_node_cluster_runs_points_on_both_nodes(tmp_path, grid):
    """Two Ray nodes of one logical CPU each on this machine; points ask one CPU and spread."""
    import json

    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    cluster.add_node(num_cpus=1)
    try:
        ray.init(address=cluster.address, log_to_driver=False)
        res = run_sweep(grid, tmp_path / "two", runtime="ray", ray_address=cluster.address, progress=False)
        assert ray.is_initialized()  # an existing cluster is left running
        nodes = {json.loads(f.read_text())["node"] for f in (tmp_path / "two" / "points").glob("*.json")}
        assert res.failures == [] and len(res.rows) == 40
        assert nodes == {n["NodeID"] for n in ray.nodes() if n["Alive"]} and len(nodes) == 2
    finally:
        ray.shutdown()
        cluster.shutdown()


def test_runtime_bench_alternates_and_compares_the_tables(tmp_path, grid, capsys):
    """``experiments/bench/sweep_runtimes.py``: rounds alternate the runtimes' order, each sweep.csv is compared."""
    import json

    from experiments.bench.sweep_runtimes import main

    f = tmp_path / "grid.yaml"
    assert main(["--grid", str(f), "--rounds", "2", "--first", "ray", "--out", str(tmp_path / "b")]) == 0
    bench = json.loads((tmp_path / "b" / "bench.json").read_text())
    assert [(r["round"], r["runtime"]) for r in bench["runs"]] == [(0, "ray"), (0, "sequential"),
                                                                  (1, "sequential"), (1, "ray")]
    assert all(r["csv_equal_to_first"] and r["finished"] == 4 and r["wall_s"] > 0 for r in bench["runs"])
    out = capsys.readouterr().out
    assert out.count("Ray throughput / sequential") == 2
    with pytest.raises(SystemExit, match="exists"):
        main(["--grid", str(f), "--out", str(tmp_path / "b")])
    with pytest.raises(SystemExit, match="--rounds must be >= 1"):
        main(["--grid", str(f), "--rounds", "0", "--out", str(tmp_path / "c")])


def test_local_cluster_runs_points_at_the_sequential_runtimes_priority(tmp_path, grid):
    """Ray's default worker niceness is 15 (its points starve beside other jobs); a local cluster the sweep
    starts runs them at niceness 0, like the sequential runtime."""
    import json

    res = run_sweep(grid, tmp_path / "nice", runtime="ray", progress=False, point_fn=niceness_point)
    assert res.failures == []
    nice = {json.loads(f.read_text())["nice"] for f in (tmp_path / "nice" / "points").glob("*.json")}
    assert nice == {os.nice(0)} == {0}
