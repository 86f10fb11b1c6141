"""Version 2 of the success matrix: ``split`` and ``kernel`` (:mod:`shared_interfaces.success_kernel`); a
version-1 file still reads; every malformed new field is one error naming the key."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest

from shared_interfaces.success_matrix import (
    SuccessMatrixError,
    from_dict,
    read_success_matrix,
    validate,
    write_success_matrix,
)
from tests.core.test_success_matrix import good


def kernel_section() -> dict:
    k0 = [[2.0, 0.5, -0.25], [0.5, 1.0, 0.0], [-0.25, 0.0, 3.0]]
    return {"projection_dim": None, "seed": 0, "lr_weighted": True, "seconds": 1.5, "peak_rss_mb": 300.0,
            "policies": [{"preconditioner": "adam", "parameters": 1000, "target": ["gold", "success", "gold"],
                          "seconds": 0.7, "matrix": k0}, None]}


def good_v2() -> dict:
    return {**good(), "version": 2, "split": ["train", "train", "heldout"], "kernel": kernel_section()}


def test_version_1_still_reads_with_no_split_and_no_kernel():
    m = from_dict(good())
    assert m.split is None and m.kernel is None and m.kernel_meta is None
    with pytest.raises(SuccessMatrixError, match="has no 'split'.*mrl_llm success-matrix"):
        m.train_index  # noqa: B018


def test_version_2_round_trips(tmp_path):
    m = from_dict(good_v2())
    assert m.split == ("train", "train", "heldout")
    assert m.train_index.tolist() == [0, 1] and m.heldout_index.tolist() == [2]
    assert m.kernel.shape == (2, 3, 3) and m.kernel[0, 0, 2] == -0.25 and np.isnan(m.kernel[1]).all()
    assert m.kernel_meta["policies"][0]["target"] == ["gold", "success", "gold"]
    assert m.kernel_meta["policies"][1] is None and "matrix" not in m.kernel_meta["policies"][0]
    back = read_success_matrix(write_success_matrix(tmp_path / "m.json", m))
    assert back.to_dict() == good_v2()
    assert json.loads((tmp_path / "m.json").read_text())["version"] == 2


def test_no_split_and_no_kernel_in_version_2():
    m = from_dict({**good(), "version": 2, "split": None, "kernel": None})
    assert m.split is None and m.kernel is None


def test_an_all_heldout_split_has_an_empty_train_index():
    m = from_dict({**good_v2(), "split": ["heldout"] * 3})
    assert m.train_index.tolist() == [] and m.train_index.dtype == np.int64 and m.heldout_index.tolist() == [0, 1, 2]


def _v2(path: str, value) -> dict:
    d = good_v2()
    obj = d
    keys = path.split(".")
    for k in keys[:-1]:
        obj = obj[int(k)] if isinstance(obj, list) else obj[k]
    if value is KeyError:
        del obj[keys[-1]]
    else:
        obj[keys[-1]] = value
    return d


def _matrix(**cells) -> list:
    m = copy.deepcopy(kernel_section()["policies"][0]["matrix"])
    for rc, v in cells.items():
        m[int(rc[1])][int(rc[2])] = v
    return m


@pytest.mark.parametrize(("data", "needle"), [
    (_v2("split", ["train", "train"]), "'split' must be null or a list of 3 entries"),
    (_v2("split", ["train", "pool", "heldout"]), "'split' must be null or a list of 3 entries"),
    (_v2("kernel", [1]), "'kernel' must be null or an object"),
    (_v2("kernel.seconds", KeyError), "'kernel' has unknown key(s) [] / lacks ['seconds']"),
    (_v2("kernel.extra", 1), "'kernel' has unknown key(s) ['extra']"),
    (_v2("kernel.projection_dim", 0), "kernel.projection_dim must be a positive integer or null"),
    (_v2("kernel.seed", -1), "kernel.seed must be an integer"),
    (_v2("kernel.lr_weighted", False), "kernel.lr_weighted must be true"),
    (_v2("kernel.peak_rss_mb", -1.0), "kernel.peak_rss_mb must be a number >= 0"),
    (_v2("kernel.policies", [None]), "kernel.policies must be a list of 2 entries"),
    (_v2("kernel.policies.0.matrix", KeyError), "kernel.policies[0] must be null or an object with"),
    (_v2("kernel.policies.0.preconditioner", "sgd"), "kernel.policies[0].preconditioner must be one of"),
    (_v2("kernel.policies.0.parameters", 0), "kernel.policies[0].parameters must be a positive integer"),
    (_v2("kernel.policies.0.target", ["gold", "gold"]), "kernel.policies[0].target must be a list of 3 entries"),
    (_v2("kernel.policies.0.target", ["gold", "peer", "gold"]), "kernel.policies[0].target must be a list of 3"),
    (_v2("kernel.policies.0.seconds", "1"), "kernel.policies[0].seconds must be a number >= 0"),
    (_v2("kernel.policies.0.logprob", [0.0, -1.0]), "kernel.policies[0].logprob must be a list of 3"),
    (_v2("kernel.policies.0.logprob", [0.0, 2.0, -1.0]), "kernel.policies[0].logprob must be a list of 3"),
    (_v2("kernel.policies.0.matrix", [[1.0, 0.0], [0.0, 1.0]]), "kernel.policies[0].matrix must be a [C, C] = [3, 3]"),
    (_v2("kernel.policies.0.matrix", _matrix(m01=None)), "kernel.policies[0].matrix[0][1] must be a finite number"),
    (_v2("kernel.policies.0.matrix", _matrix(m01=float("nan"))), "matrix[0][1] must be a finite number, got nan"),
    (_v2("kernel.policies.0.matrix", _matrix(m01=True)), "matrix[0][1] must be a finite number, got True"),
    (_v2("kernel.policies.0.matrix", _matrix(m01=0.6)), "kernel.policies[0].matrix is not symmetric: [0][1] = 0.6"),
    (_v2("kernel.policies.0.matrix", _matrix(m11=-1.0)), "kernel.policies[0].matrix[1][1] = -1.0 is negative"),
])
def test_malformed_version_2_fields_name_the_key_and_the_fix(data, needle):
    with pytest.raises(SuccessMatrixError) as err:
        validate(copy.deepcopy(data), where="m.json")
    msg = str(err.value)
    assert msg.startswith("m.json: ") and needle in msg and "\n" not in msg


def test_symmetry_is_checked_within_a_relative_tolerance():
    m = _matrix(m01=0.5 * (1 + 1e-9))  # a float round-off, not an asymmetry
    assert from_dict(_v2("kernel.policies.0.matrix", m)).kernel[0, 0, 1] == pytest.approx(0.5)


def test_a_version_1_file_with_version_2_keys_says_so():
    with pytest.raises(SuccessMatrixError, match=r"\['kernel'\] need version 2"):
        validate({**good(), "kernel": None})


def test_kernel_and_its_metadata_go_together():
    m = from_dict(good_v2())
    from dataclasses import replace
    with pytest.raises(SuccessMatrixError, match="'kernel' and 'kernel_meta' go together"):
        replace(m, kernel_meta=None)
