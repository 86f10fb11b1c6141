"""``shared_interfaces.config_io`` refuses YAML aliases (alias bombs), non-finite floats and integers that
do not fit in 64 bits, each with an error naming the file or the key."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import pytest

from shared_interfaces.config_io import ConfigError, from_mapping, load_yaml

BOMB = "\n".join(
    ["l0: &l0 [" + ", ".join(["lol"] * 10) + "]"]
    + [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]" for i in range(1, 30)]
    + ["policies: [*l29]"]
) + "\n"


def test_alias_bomb_fails_fast_naming_the_file(tmp_path):
    p = tmp_path / "bomb.yaml"
    p.write_text(BOMB)
    assert 500 < len(BOMB) < 4000  # a ~2 KB file that would expand to 10**30 strings
    t0 = time.perf_counter()
    with pytest.raises(ConfigError, match=r"bomb\.yaml:1:.*anchor.*alias") as err:
        load_yaml(p)
    assert time.perf_counter() - t0 < 1.0
    assert "\n" not in str(err.value)


def test_aliases_and_merge_keys_are_refused(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("base: {lr: 1}\nother: *x\n")  # an undefined alias is still named
    with pytest.raises(ConfigError, match=r"c\.yaml:2"):
        load_yaml(p)
    p.write_text("base: &b {lr: 1}\nother:\n  <<: *b\n")
    with pytest.raises(ConfigError, match=r"c\.yaml:1.*anchor &b"):
        load_yaml(p)


def test_plain_yaml_and_empty_file_still_load(tmp_path):
    p = tmp_path / "ok.yaml"
    p.write_text("a: [1, 2]\nb: {c: 'x & y *z'}\n")
    assert load_yaml(p) == {"a": [1, 2], "b": {"c": "x & y *z"}}
    p.write_text("")
    assert load_yaml(p) == {}


def test_exponent_numbers_are_floats_as_in_yaml_1_2(tmp_path):
    """``lr: 1e-6`` is how learning rates are written; PyYAML (YAML 1.1) alone reads it as the string '1e-6'."""
    p = tmp_path / "c.yaml"
    p.write_text("a: 1e-6\nb: -2E+3\nc: 3.e4\nd: 1.0e-6\ne: 12\nf: '1e-6'\ng: 1e3x\nh: [1e-3, 2]\n")
    assert load_yaml(p) == {"a": 1e-6, "b": -2000.0, "c": 3e4, "d": 1e-6, "e": 12, "f": "1e-6", "g": "1e3x",
                            "h": [1e-3, 2]}
    assert from_mapping(_Cfg, {"x": load_yaml(p)["a"]}, where="cfg").x == 1e-6
    with pytest.raises(ConfigError, match=r"cfg\.n: expected an integer, got 1000\.0; write it as 1000"):
        from_mapping(_Cfg, {"n": 1e3}, where="cfg")
    with pytest.raises(ConfigError, match=r"cfg\.n: expected an integer, got 1\.5$"):
        from_mapping(_Cfg, {"n": 1.5}, where="cfg")


def test_a_key_given_twice_is_refused_naming_both_lines(tmp_path):
    """YAML keeps the last of two equal keys without a word: ``steps: 0`` appended to a config won."""
    p = tmp_path / "c.yaml"
    p.write_text("steps: 10\nseed: 1\npolicies:\n  - {name: a, seed: 2}\nsteps: 0\n")
    with pytest.raises(ConfigError, match=r"c\.yaml:5: key 'steps' is given twice \(first on line 1\); keep one"):
        load_yaml(p)
    p.write_text("policies:\n  - name: a\n    name: b\n")
    with pytest.raises(ConfigError, match=r"c\.yaml:3: key 'name' is given twice \(first on line 2\)"):
        load_yaml(p)
    p.write_text("a: {x: 1}\nb: {x: 1}\n")  # equal keys in different mappings are fine
    assert load_yaml(p) == {"a": {"x": 1}, "b": {"x": 1}}


def test_a_directory_is_not_a_config_file(tmp_path):
    with pytest.raises(ConfigError, match=r"is a directory; give a YAML file"):
        load_yaml(tmp_path)


def test_malformed_yaml_names_the_file(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("a: [1, 2\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml.*not valid YAML"):
        load_yaml(p)
    p.write_text("a:\n\tb: 1\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml is not valid YAML .*; indent with spaces: YAML does not allow tabs"):
        load_yaml(p)
    p.write_bytes(b"a: \xff\xfe\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml.*UTF-8"):
        load_yaml(p)


@dataclass(frozen=True)
class _Cfg:
    x: float = 1.0
    y: float | None = None
    n: int = 0
    xs: tuple[float, ...] = ()


@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan])
def test_non_finite_floats_are_refused_for_every_float_field(bad):
    for key, value in (("x", bad), ("y", bad), ("xs", [1.0, bad])):
        with pytest.raises(ConfigError, match=rf"cfg\.{key}.*finite") as err:
            from_mapping(_Cfg, {key: value}, where="cfg")
        assert "\n" not in str(err.value)


def test_integers_beyond_64_bits_are_refused():
    with pytest.raises(ConfigError, match=r"cfg\.n: 1180591620717411303424 .*64-bit"):
        from_mapping(_Cfg, {"n": 1180591620717411303424}, where="cfg")
    assert from_mapping(_Cfg, {"n": 2**63 - 1, "x": 1e308}, where="cfg").n == 2**63 - 1


@pytest.mark.parametrize("text, says", [
    ("steps: 010\n", r"c\.yaml:1: '010' has a leading zero, which YAML 1.1 reads as an octal number"),  # was 8
    ("a: 1\nsteps: 1:30\n", r"c\.yaml:2: '1:30' is a base-60 number in YAML 1\.1"),  # was 90
    ("lr: -1:30.5\n", r"c\.yaml:1: '-1:30\.5' is a base-60 number"),  # was -90.5
])
def test_numbers_yaml_1_1_reads_as_other_numbers_are_refused(tmp_path, text, says):
    p = tmp_path / "c.yaml"
    p.write_text(text)
    with pytest.raises(ConfigError, match=says):
        load_yaml(p)


def test_numbers_that_read_the_same_in_yaml_1_1_and_1_2_still_load(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("a: 0\nb: -0\nc: 0.5\nd: 00.5\ne: 0x1F\nf: 1_000\ng: '010'\nh: '1:30'\ni: 10:30 am\n")
    assert load_yaml(p) == {"a": 0, "b": 0, "c": 0.5, "d": 0.5, "e": 31, "f": 1000, "g": "010", "h": "1:30",
                            "i": "10:30 am"}


def test_integers_too_long_to_read_or_print_are_named(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("a: 1\nsteps: " + "9" * 5000 + "\n")  # int() refuses more than 4300 digits
    with pytest.raises(ConfigError, match=r"c\.yaml:2: the integer 9+\.\.\. has 5000 digits, too many to read"):
        load_yaml(p)
    p.write_text("n: 0x" + "f" * 5000 + "\n")  # reads (base 16 has no limit) but str() of it would raise
    with pytest.raises(ConfigError, match=r"cfg\.n: an integer of 20000 bits does not fit a signed 64-bit integer"):
        from_mapping(_Cfg, load_yaml(p), where="cfg")


def test_yaml_nested_too_deeply_is_named(tmp_path):
    p = tmp_path / "c.yaml"
    for text in ("a: " + "[" * 50_000 + "]" * 50_000 + "\n", "a: " + "{b: " * 5_000 + "1" + "}" * 5_000 + "\n"):
        p.write_text(text)
        with pytest.raises(ConfigError, match=r"c\.yaml: YAML nested too deeply to read"):
            load_yaml(p)
