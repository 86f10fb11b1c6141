"""Hugging Face hub ids as model / tokenizer / dataset sources.

A config value is a **hub id** when it reads ``owner/name`` (one slash, letters, digits, ``._-``; not
starting with ``.``, ``/`` or ``~``) and no such path exists relative to the config file. A hub model is
loaded with ``from_pretrained(id)``: the library looks in the hub cache first (``HF_HOME`` /
``HF_HUB_CACHE``) and downloads into it when it may; with ``HF_HUB_OFFLINE=1`` it uses the cache only.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


def is_hub_id(value: str | None, base: str | Path | None = None) -> bool:
    """Whether ``value`` names a hub repository rather than a path (module docstring)."""
    if not value or not _HUB_ID.match(value) or ".." in value:
        return False
    if Path(value).exists():
        return False
    return base is None or not (Path(base) / value).exists()


def offline() -> bool:
    """Whether ``HF_HUB_OFFLINE`` forbids downloads (the library reads the same variable)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def hub_hint(repo: str) -> str:
    """What to do when ``repo`` cannot be loaded."""
    if offline():
        return (f"HF_HUB_OFFLINE is set and {repo!r} is not in the hub cache; download it once with network "
                "access (or unset HF_HUB_OFFLINE), or give a local directory")
    return f"check the id {repo!r}, network access to the hub and HF_TOKEN for gated models, or give a local directory"
