"""The package layout the design promises: exported names, and imports in one direction only."""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import pytest

import cellblock

PACKAGE = Path(cellblock.__file__).parent
MODULES = sorted(m.name for m in pkgutil.walk_packages([str(PACKAGE)], "cellblock."))


@pytest.mark.parametrize("name", MODULES)
def test_every_module_declares_what_it_exports(name: str) -> None:
    module = importlib.import_module(name)
    exported = getattr(module, "__all__", None)
    assert exported is not None, f"{name} has no __all__"
    missing = [n for n in exported if not hasattr(module, n)]
    assert not missing, f"{name}.__all__ names what it does not define: {missing}"


def imports_of(package: str) -> set[str]:
    found: set[str] = set()
    for path in (PACKAGE / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module:
                found.add(node.module)
    return found


def roots(modules: set[str]) -> set[str]:
    return {m.split(".")[0] if not m.startswith("cellblock.") else ".".join(m.split(".")[:2]) for m in modules}


def test_policy_is_pure() -> None:
    bad = roots(imports_of("policy")) & {"mcp", "mcp_types", "anyio", "cellblock.sandbox", "cellblock.gateway"}
    assert not bad, f"policy imports {bad}"


def test_sandbox_does_not_speak_mcp() -> None:
    bad = roots(imports_of("sandbox")) & {"mcp", "mcp_types", "cellblock.gateway"}
    assert not bad, f"sandbox imports {bad}"
