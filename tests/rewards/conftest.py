from __future__ import annotations

import pytest

from mrl_llm.rewards.math_verifier import MathVerifier


@pytest.fixture(scope="module")
def math_verifier():
    v = MathVerifier(timeout_s=5.0)
    yield v
    v.close()
