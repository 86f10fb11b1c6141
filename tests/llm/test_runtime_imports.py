"""One runtime, no import cycle (issue 15, item 6): the Ray backend and the shared run code never import
:mod:`mrl_llm.trainer`, at module level or inside a function; the run-setup module imports neither runtime."""

from __future__ import annotations

import ast
from pathlib import Path

import mrl_llm

ROOT = Path(mrl_llm.__file__).parent


def source(module: str) -> Path | None:
    """The file of ``mrl_llm`` module ``module`` (a package's ``__init__.py``), None when it has none."""
    base = ROOT.joinpath(*module.split(".")[1:])
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if module != "mrl_llm" and path.is_file():
            return path
    return None


def imports_of(module: str) -> set[str]:
    """Every ``mrl_llm`` module ``module`` imports anywhere in its source (module level and in functions)."""
    path = source(module)
    if path is None:
        return set()
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("mrl_llm")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("mrl_llm"):
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names if source(f"{node.module}.{a.name}")}
    return out


def reachable(start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        m = todo.pop()
        if m in seen or source(m) is None:
            continue
        seen.add(m)
        todo.extend(imports_of(m))
    return seen


def test_the_ray_backend_never_reaches_the_trainer():
    for m in ("mrl_llm.distributed.ray_trainer", "mrl_llm.runner", "mrl_llm.run_setup",
              "mrl_llm.distributed.driver", "mrl_llm.resume"):
        assert "mrl_llm.trainer" not in reachable(m), m


def test_run_setup_imports_neither_runtime():
    assert not {"mrl_llm.runner", "mrl_llm.distributed.ray_trainer", "mrl_llm.distributed.driver",
                "mrl_llm.trainer"} & reachable("mrl_llm.run_setup")


def test_the_trainer_reaches_both_backends():  # the check above is not vacuous: imports are found
    assert {"mrl_llm.runner", "mrl_llm.distributed.ray_trainer", "mrl_llm.run_setup"} <= reachable("mrl_llm.trainer")


def test_imports_of_an_empty_module(tmp_path, monkeypatch):
    (tmp_path / "empty.py").write_text("")
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    assert imports_of("mrl_llm.empty") == set() and reachable("mrl_llm.empty") == {"mrl_llm.empty"}
    assert reachable("mrl_llm.missing") == set()  # not a module of the package: nothing to follow
