"""One real local Ray cluster (2 CPUs, no dashboard) per test module that asks for it."""

from __future__ import annotations

import pytest

from tests.llm.helpers import local_ray


@pytest.fixture(scope="module")
def ray_local():
    with local_ray("mrl-tests") as ray:
        yield ray
