"""Hugging Face hub ids as model / tokenizer / dataset sources.

A config value is a **hub id** when it reads ``owner/name`` (one slash, letters, digits, ``._-``; not
starting with ``.``, ``/`` or ``~``) and no such path exists relative to the config file. A hub model is
loaded with ``from_pretrained(id)``: the library looks in the hub cache first (``HF_HOME`` /
``HF_HUB_CACHE``) and downloads into it when it may; with ``HF_HUB_OFFLINE=1`` it uses the cache only.
:func:`cached_file` finds a repository's file in that cache the same way (its ``refs/main`` snapshot), so the
checks before a run (:mod:`mrl_llm.preflight`) read a cached model's ``config.json`` as they read a local one.

A value that *looks like a path* (:func:`looks_like_path`: it starts with ``.``, ``/`` or ``~``, has more than
one ``/`` or ends with a data file's suffix) is never taken for a hub id where a hub id is one choice among
files (``data prepare --source``): a mistyped path is an error naming it, not a hub download.
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


#: Suffixes of data files: a ``--source`` ending in one is a path, not a dataset id.
DATA_SUFFIXES = (".json", ".jsonl", ".parquet", ".csv", ".txt")


def looks_like_path(value: str) -> bool:
    """Whether ``value`` reads as a file path rather than a hub id ``owner/name`` (module docstring)."""
    v = value.strip()
    return (v.startswith((".", "/", "~")) or v.count("/") > 1 or os.sep in v.replace("/", "")
            or (os.altsep is not None and os.altsep != "/" and os.altsep in v) or v.lower().endswith(DATA_SUFFIXES))


def cached_file(repo: str, filename: str = "config.json") -> Path | None:
    """``repo``'s ``filename`` in the hub cache (the snapshot ``refs/main`` names), or None when the cache has
    no such file: what ``from_pretrained(repo)`` finds with ``HF_HUB_OFFLINE=1``."""
    from huggingface_hub import try_to_load_from_cache

    try:
        found = try_to_load_from_cache(repo, filename)
    except Exception:  # noqa: BLE001 - an id the hub library refuses: not in the cache
        return None
    return Path(found) if isinstance(found, str) and Path(found).is_file() else None


def download_file(repo: str, filename: str = "config.json") -> Path | None:
    """``repo``'s ``filename`` downloaded into the hub cache, as ``from_pretrained(repo)`` would first; None when the
    hub does not give it (no such repository or file, no network, a gated repository without ``HF_TOKEN``)."""
    from huggingface_hub import hf_hub_download

    try:
        return Path(hf_hub_download(repo, filename))
    except Exception:  # noqa: BLE001 - every way the hub can refuse: the caller names the id and the fixes
        return None


def hub_cache_dir() -> str:
    """The hub cache directory this process uses (``HF_HUB_CACHE``, else ``HF_HOME/hub``)."""
    from huggingface_hub import constants

    return str(constants.HF_HUB_CACHE)


def offline() -> bool:
    """Whether ``HF_HUB_OFFLINE`` forbids downloads (the library reads the same variable)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def hub_hint(repo: str) -> str:
    """What to do when ``repo`` cannot be loaded."""
    if offline():
        return (f"HF_HUB_OFFLINE is set (offline) and {repo!r} is not in the hub cache {hub_cache_dir()}; download "
                f"it once with network access (`huggingface-cli download {repo}`, or unset HF_HUB_OFFLINE), point "
                "HF_HUB_CACHE / HF_HOME at the cache that holds it, or give a local directory")
    return f"check the id {repo!r}, network access to the hub and HF_TOKEN for gated models, or give a local directory"
