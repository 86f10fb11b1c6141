"""The seeds of a rank: one 63-bit seed per purpose, a pure function of its parts.

``derive_seed(run_seed, policy, "rollout", step)`` seeds a step's sampling, ``(..., "rollout", step,
prompt_id, g)`` one sample (``sampling.seeding: sample``), ``(..., "eval", step)`` the eval samples,
``(..., "engine")`` the vLLM engine and ``(..., "init")`` a fresh ``model_config`` model.
"""

from __future__ import annotations

import hashlib
from typing import Any


def derive_seed(*parts: Any) -> int:
    """A 63-bit seed from ``parts`` (stable across processes and Python versions):
    ``int.from_bytes(sha256("\\x1f".join(map(str, parts)))[:8], "little") >> 1``."""
    h = hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(h[:8], "little") >> 1
