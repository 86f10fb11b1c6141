"""shared_interfaces.json_file: the read / write of the interface formats' JSON documents."""

from __future__ import annotations

import gzip

import pytest

from shared_interfaces.json_file import read_json_document, write_json_document


class Err(ValueError):
    pass


@pytest.mark.parametrize("name", ["d.json", "d.json.gz"])
def test_round_trip_and_no_temporary_left(tmp_path, name):
    p = write_json_document(tmp_path / "sub" / name, {"a": [1, 2.5, None]})
    assert read_json_document(p, Err, "doc", "fix it") == {"a": [1, 2.5, None]}
    assert p.name.endswith(".gz") == (p.read_bytes()[:2] == b"\x1f\x8b") and not list(p.parent.glob(".*tmp"))
    with pytest.raises(ValueError):
        write_json_document(tmp_path / "nan.json", {"x": float("nan")})


@pytest.mark.parametrize(("name", "data", "needle"), [
    ("empty.json", b"", "is not valid JSON"),
    ("bad.json", b'{"a": ', "is not valid JSON"),
    ("bytes.json", b"\xff\xfe{}", "is not valid JSON"),
    ("cut.json.gz", gzip.compress(b'{"a": 1}')[:8], "is not a readable gzip file"),
    ("deep.json", b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
])
def test_malformed_files_are_one_line_errors_with_the_hint(tmp_path, name, data, needle):
    (tmp_path / name).write_bytes(data)
    with pytest.raises(Err, match=needle) as info:
        read_json_document(tmp_path / name, Err, "doc", "fix it")
    assert str(info.value).startswith(f"doc {tmp_path / name} ") and str(info.value).endswith("; fix it")
    assert "\n" not in str(info.value)
