"""``bandit_sim sweep`` (:mod:`bandit_sim.sweep`): one file per point, resume, failing points, the CLI.
The Ray runtime's tests are in ``test_sweep_ray.py`` (slow)."""

from __future__ import annotations

import csv
import functools
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from bandit_sim.cli import main
from bandit_sim.sweep import point_key, run_sweep
from bandit_sim.sweep_config import load_grid
from tests.bandit.sweep_helpers import fail_first_try, fail_on_overlap

GRID = """base: smoke
overrides: {steps: %d, seeds: 2, record_every: 10}
axes: {overlap: [0.2, 0.5, 0.8], thl_sigma: [0.0, 1.0]}
"""


def grid_file(tmp_path, steps=20):
    f = tmp_path / "grid.yaml"
    f.write_text(GRID % steps)
    return f


def read_csv(path):
    with open(path) as fh:
        return list(csv.DictReader(fh))


def test_one_file_per_point_in_grid_order(tmp_path):
    grid = load_grid(grid_file(tmp_path))
    res = run_sweep(grid, tmp_path / "s", progress=False)
    keys = [point_key(p) for p in grid.points()]
    assert sorted(f.stem for f in (tmp_path / "s" / "points").glob("*.json")) == sorted(keys)
    assert not list((tmp_path / "s").rglob("*.tmp"))
    assert res.failures == [] and res.ran == 6 and len(res.rows) == 6 * 5 * 2
    # rows come in grid order, whatever order the points finished in
    assert [(r["overlap"], r["thl_sigma"]) for r in res.rows[::10]] == [tuple(p.values()) for p in grid.points()]
    one = json.loads((tmp_path / "s" / "points" / f"{keys[0]}.json").read_text())
    assert one["point"] == grid.points()[0] and one["attempts"] == 1 and len(one["rows"]) == 10
    summary = json.loads((tmp_path / "s" / "sweep.json").read_text())
    assert summary["finished"] == 6 and summary["rows"] == res.rows


def test_resume_skips_finished_points_and_equals_a_full_run(tmp_path):
    grid = load_grid(grid_file(tmp_path))
    full = run_sweep(grid, tmp_path / "full", progress=False)
    part = tmp_path / "part"
    run_sweep(grid, part, progress=False)
    for k in [point_key(p) for p in grid.points()][2:]:
        (part / "points" / f"{k}.json").unlink()
    again = run_sweep(grid, part, resume=True, progress=False)
    assert again.ran == 4
    assert read_csv(part / "sweep.csv") == read_csv(tmp_path / "full" / "sweep.csv") and again.rows == full.rows


@pytest.mark.slow
def test_resume_after_a_kill_equals_an_uninterrupted_sweep(tmp_path):
    """A real SIGKILL in the middle of a sweep process; --resume finishes it with the same table (1-4 min on a
    busy 2-core machine)."""
    gf = grid_file(tmp_path, steps=200)
    out = tmp_path / "killed"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "bandit_sim", "sweep", "--grid", str(gf), "--quiet"]
    proc = subprocess.Popen(cmd + ["--out", str(out)], env=env, stderr=subprocess.PIPE, stdout=subprocess.PIPE)
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if len(list((out / "points").glob("*.json"))) >= 2:
            break
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    n_done = len(list((out / "points").glob("*.json")))
    assert 0 < n_done < 6, f"the kill should land mid-sweep, {n_done} of 6 points were done"
    assert not (out / "sweep.csv").exists()
    resumed = subprocess.run(cmd[:-1] + ["--resume", str(out)], env=env, capture_output=True, text=True,
                             timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    assert f"({6 - n_done} run now" in resumed.stdout
    whole = run_sweep(load_grid(gf), tmp_path / "whole", progress=False)
    assert read_csv(out / "sweep.csv") == read_csv(tmp_path / "whole" / "sweep.csv")
    assert json.loads((out / "sweep.json").read_text())["rows"] == whole.rows


def test_failing_point_is_retried_once_then_listed(tmp_path):
    grid = load_grid(grid_file(tmp_path))
    res = run_sweep(grid, tmp_path / "s", progress=False, point_fn=fail_on_overlap)
    assert [f["point"] for f in res.failures] == [{"overlap": 0.8, "thl_sigma": 0.0}, {"overlap": 0.8, "thl_sigma": 1.0}]
    for f in res.failures:
        assert f["attempts"] == 2
        assert f["error"].startswith("RuntimeError: injected failure at overlap 0.8 (at sweep_helpers.py:")
    assert len(res.rows) == 4 * 10
    summary = json.loads((tmp_path / "s" / "sweep.json").read_text())
    assert summary["finished"] == 4 and len(summary["failures"]) == 2
    assert len(list((tmp_path / "s" / "failed").glob("*.json"))) == 2
    # a resume retries the failed points; once they succeed their failure files go
    again = run_sweep(grid, tmp_path / "s", resume=True, progress=False)
    assert again.ran == 2 and again.failures == [] and not list((tmp_path / "s" / "failed").glob("*.json"))


def test_a_point_failing_once_succeeds_on_the_retry(tmp_path):
    grid = load_grid(grid_file(tmp_path))
    (tmp_path / "markers").mkdir()
    fn = functools.partial(fail_first_try, marker_dir=str(tmp_path / "markers"))
    res = run_sweep(grid, tmp_path / "s", progress=False, point_fn=fn)
    assert res.failures == [] and len(res.rows) == 60
    files = [json.loads(f.read_text()) for f in (tmp_path / "s" / "points").glob("*.json")]
    assert {f["attempts"] for f in files} == {2}


def test_cli_sweep_errors(tmp_path, capsys):
    gf = grid_file(tmp_path)
    assert main(["sweep", "--grid", str(gf)]) == 2
    assert "exactly one of --out DIR" in capsys.readouterr().err
    assert main(["sweep", "--grid", str(gf), "--out", str(tmp_path / "a"), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["sweep", "--grid", str(gf), "--out", str(tmp_path / "a"), "--quiet"]) == 2
    assert f"continue it with --resume {tmp_path / 'a'}" in capsys.readouterr().err
    assert main(["sweep", "--grid", "smoke", "--resume", str(tmp_path / "a"), "--quiet"]) == 2
    assert "made by another grid" in capsys.readouterr().err
    assert main(["sweep", "--resume", str(tmp_path), "--quiet"]) == 2
    assert "no grid.json there" in capsys.readouterr().err
    assert main(["sweep", "--grid", "smoke", "--out", str(tmp_path / "b"), "--ray-address", "x:1"]) == 2
    assert "--ray-address needs --runtime ray" in capsys.readouterr().err
    with socket.socket() as s:  # a port nothing listens on: named at once, before the sweep directory is made
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert main(["sweep", "--grid", "smoke", "--out", str(tmp_path / "b"), "--runtime", "ray", "--ray-address",
                 f"127.0.0.1:{port}"]) == 2
    assert "no Ray cluster answers there" in capsys.readouterr().err and not (tmp_path / "b").exists()
    (tmp_path / "bad.yaml").write_text("base: smoke\naxes: {temperature: [1]}\n")
    assert main(["sweep", "--grid", str(tmp_path / "bad.yaml"), "--out", str(tmp_path / "c")]) == 2
    assert "unknown axis 'temperature'" in capsys.readouterr().err


def test_cli_resume_reads_the_recorded_grid(tmp_path, capsys):
    gf = grid_file(tmp_path)
    assert main(["sweep", "--grid", str(gf), "--out", str(tmp_path / "a"), "--quiet"]) == 0
    first = read_csv(tmp_path / "a" / "sweep.csv")
    (tmp_path / "a" / "points" / "overlap=0.5,thl_sigma=1.json").unlink()
    capsys.readouterr()
    assert main(["sweep", "--resume", str(tmp_path / "a"), "--quiet"]) == 0
    assert "6/6 points (1 run now" in capsys.readouterr().out
    assert read_csv(tmp_path / "a" / "sweep.csv") == first


@pytest.mark.parametrize(("content", "msg"), [("{not json", "is not valid JSON"), ("", "is not valid JSON"),
                                              ("{}", "is not a sweep point's result"),
                                              ("[]", "is not a sweep point's result"),
                                              ('{"rows": [1]}', "is not a sweep point's result")])
def test_corrupt_point_file_names_itself(tmp_path, capsys, content, msg):
    gf = grid_file(tmp_path)
    assert main(["sweep", "--grid", str(gf), "--out", str(tmp_path / "a"), "--quiet"]) == 0
    table = (tmp_path / "a" / "sweep.csv").read_text()
    (tmp_path / "a" / "points" / "overlap=0.2,thl_sigma=0.json").write_text(content)
    capsys.readouterr()
    assert main(["sweep", "--resume", str(tmp_path / "a"), "--quiet"]) == 2
    assert f"overlap=0.2,thl_sigma=0.json {msg}" in capsys.readouterr().err
    assert (tmp_path / "a" / "sweep.csv").read_text() == table


@pytest.mark.parametrize(("content", "msg"), [("{not json", "grid.json is not valid JSON"),
                                              ("", "grid.json is not valid JSON"),
                                              ('{"name": "g", "base": {}, "axes": {"lr": 5}}', "not a grid record"),
                                              ("[]", "not a grid record")])
def test_corrupt_grid_record_names_itself(tmp_path, capsys, content, msg):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "grid.json").write_text(content)
    assert main(["sweep", "--resume", str(tmp_path / "a"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert msg in err and "Traceback" not in err


def test_resume_with_the_axes_in_another_order_is_refused(tmp_path, capsys):
    gf = grid_file(tmp_path, steps=2)
    assert main(["sweep", "--grid", str(gf), "--out", str(tmp_path / "a"), "--quiet"]) == 0
    gf.write_text((GRID % 2).replace("axes: {overlap: [0.2, 0.5, 0.8], thl_sigma: [0.0, 1.0]}",
                                     "axes: {thl_sigma: [0.0, 1.0], overlap: [0.2, 0.5, 0.8]}"))
    capsys.readouterr()
    assert main(["sweep", "--grid", str(gf), "--resume", str(tmp_path / "a"), "--quiet"]) == 2
    assert "list them in the recorded order" in capsys.readouterr().err


def test_close_axis_values_get_their_own_point_files(tmp_path):
    """``:g`` keeps 6 digits: 0.1234561 and 0.1234562 shared one point file, and the table showed one value's
    result under both."""
    assert point_key({"lr": 0.1234561}) != point_key({"lr": 0.1234562})
    assert [point_key({"overlap": v, "group_size": 4}) for v in (0.2, 5.0, 1e-7)] == [
        "overlap=0.2,group_size=4", "overlap=5,group_size=4", "overlap=1e-07,group_size=4"]
    gf = tmp_path / "g.yaml"
    gf.write_text("base: smoke\noverrides: {steps: 2, seeds: 1, regimes: [grpo]}\naxes: {lr: [0.1234561, 0.1234562]}\n")
    res = run_sweep(load_grid(gf), tmp_path / "s", progress=False)
    assert len(list((tmp_path / "s" / "points").glob("*.json"))) == 2
    assert sorted({r["lr"] for r in res.rows}) == [0.1234561, 0.1234562]


def test_sweep_out_and_resume_paths_are_checked(tmp_path, capsys):
    """A file or a foreign non-empty directory as --out, and an empty --out / --resume, are refused before anything
    runs (a file gave a FileExistsError traceback, ``--out ""`` wrote the sweep into the working directory,
    ``--resume ""`` a TypeError traceback)."""
    gf = grid_file(tmp_path, steps=2)
    (tmp_path / "afile").write_text("x")
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "notes.txt").write_text("mine")
    for flag, out, msg in (("--out", tmp_path / "afile", "is a file; give a directory"),
                           ("--out", tmp_path / "afile" / "sub", "is a file, not a directory"),
                           ("--out", tmp_path / "home", "is a non-empty directory that holds no sweep"),
                           ("--out", "", "--out is empty"), ("--resume", "", "--resume is empty")):
        assert main(["sweep", "--grid", str(gf), flag, str(out), "--quiet"]) == 2
        err = capsys.readouterr().err
        assert msg in err and "Traceback" not in err, (flag, out, err)
    assert sorted(p.name for p in (tmp_path / "home").iterdir()) == ["notes.txt"]
    assert (tmp_path / "afile").read_text() == "x"


@pytest.mark.parametrize("content", ['{"rows": [{"x": 1}]}', '{"rows": []}'])
def test_point_file_with_foreign_rows_names_itself(tmp_path, capsys, content):
    """Rows that are not this grid's (other fields, none at all) were taken as finished: a resume then failed in the
    CSV writer ("dict contains fields not in fieldnames") or counted a point with no rows as done."""
    gf = grid_file(tmp_path, steps=2)
    assert main(["sweep", "--grid", str(gf), "--out", str(tmp_path / "a"), "--quiet"]) == 0
    (tmp_path / "a" / "points" / "overlap=0.2,thl_sigma=0.json").write_text(content)
    capsys.readouterr()
    assert main(["sweep", "--resume", str(tmp_path / "a"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "overlap=0.2,thl_sigma=0.json is not a sweep point's result of this grid" in err and "delete it" in err


def _corrupt_copy(points):
    (points / "overlap=0.2,thl_sigma=0.json").write_text((points / "overlap=0.8,thl_sigma=1.json").read_text())


def _corrupt_bytes(points):
    f = points / "overlap=0.2,thl_sigma=0.json"
    f.write_bytes(f.read_bytes().replace(b'"rows"', b'"r\xffows"'))


def _corrupt_value(value):
    def corrupt(points):
        f = points / "overlap=0.2,thl_sigma=0.json"
        data = json.loads(f.read_text())
        data["rows"][1]["accuracy"] = "0.5"
        f.write_text(json.dumps(data).replace('"0.5"', value))
    return corrupt


def _corrupt_dir(points):
    (points / "overlap=0.2,thl_sigma=0.json").unlink()
    (points / "overlap=0.2,thl_sigma=0.json").mkdir()


@pytest.mark.parametrize(("corrupt", "msg"), [
    (_corrupt_copy, "holds the result of point 'overlap=0.8,thl_sigma=1'"),
    (_corrupt_bytes, "is not valid JSON (not UTF-8 text"),
    (_corrupt_value('"0.5"'), "rows[1].accuracy = '0.5' is not this point's value"),
    (_corrupt_value("NaN"), "is not valid JSON (NaN is not a number JSON allows)"),
    (_corrupt_value("Infinity"), "is not valid JSON (Infinity is not a number JSON allows)"),
    (_corrupt_dir, "is not a file (a directory"),
], ids=["copied", "bytes", "string", "nan", "inf", "dir"])
def test_a_point_file_is_checked_against_its_name_before_anything_is_replaced(tmp_path, capsys, corrupt, msg):
    """A point file copied over another point's name was taken as that point; non-UTF-8 bytes, a string or NaN
    value, or a directory in a point file's place gave a traceback, after ``sweep.csv`` had been replaced."""
    gf = grid_file(tmp_path, steps=2)
    assert main(["sweep", "--grid", str(gf), "--out", str(tmp_path / "a"), "--quiet"]) == 0
    before = {n: (tmp_path / "a" / n).read_bytes() for n in ("sweep.csv", "sweep.json", "sweep.png")}
    corrupt(tmp_path / "a" / "points")
    capsys.readouterr()
    assert main(["sweep", "--resume", str(tmp_path / "a"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "overlap=0.2,thl_sigma=0.json" in err and msg in err and "Traceback" not in err, err
    assert err.count("\n") == 1 and ("delete it" in err or "remove it" in err)
    assert {n: (tmp_path / "a" / n).read_bytes() for n in before} == before


def test_a_point_file_of_a_point_not_in_the_grid_is_refused(tmp_path, capsys):
    gf = grid_file(tmp_path, steps=2)
    assert main(["sweep", "--grid", str(gf), "--out", str(tmp_path / "a"), "--quiet"]) == 0
    points = tmp_path / "a" / "points"
    data = json.loads((points / "overlap=0.2,thl_sigma=0.json").read_text())
    data["point"]["overlap"], data["key"] = 0.3, "overlap=0.3,thl_sigma=0"
    for r in data["rows"]:
        r["overlap"] = 0.3
    (points / "overlap=0.3,thl_sigma=0.json").write_text(json.dumps(data))
    capsys.readouterr()
    assert main(["sweep", "--resume", str(tmp_path / "a"), "--quiet"]) == 2
    assert "overlap=0.3,thl_sigma=0 is not a point of this grid" in capsys.readouterr().err
