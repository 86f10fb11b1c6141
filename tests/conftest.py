"""Shared test fixtures.

``shared_dir`` is the read-only ``../shared`` folder beside the checkout (tokenizers, MATH-500). Tests
that need it skip when it is absent on a developer machine, and fail when ``CI=true``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def find_shared_dir() -> Path | None:
    for cand in (os.environ.get("MRL_SHARED_DIR"), REPO.parent / "shared", REPO / "shared"):
        if cand and (Path(cand) / "tokenizers").is_dir():
            return Path(cand)
    return None


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    found = find_shared_dir()
    if found is None:
        msg = "../shared (tokenizers, data) not found beside the checkout; set MRL_SHARED_DIR"
        if os.environ.get("CI") == "true":
            pytest.fail(msg + " (required in CI)")
        pytest.skip(msg)
    return found
