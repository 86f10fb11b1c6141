"""One real local Ray cluster (2 CPUs, no dashboard) per test module that asks for it."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="module")
def ray_local():
    ray = pytest.importorskip("ray")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    if ray.is_initialized():
        ray.shutdown()
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             namespace="mrl-tests")
    try:
        yield ray
    finally:
        ray.shutdown()
