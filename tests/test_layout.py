"""The package layout the design promises: exported names, and imports in one direction only."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import re
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


GATEWAY = PACKAGE / "gateway"
# Each folder of the gateway and the folders it may import, in the direction of the architecture
# (docs/architecture.md). The shared modules at the gateway's top level are open to every folder.
MAY_IMPORT: dict[str, set[str]] = {
    "wire": set(),
    "audit": set(),
    "config": {"audit"},
    "ask": set(),
    "downstream": {"wire", "audit", "config", "ask"},
    # the ranking of tool search: plain code and its data, no SDK and nothing of the gateway's
    "search": set(),
    "serve": {"wire", "audit", "config", "ask", "downstream", "search"},
    "clients": {"config", "downstream"},
    "scan": {"config", "downstream"},
    # the page talks to the gateways only as the CLI does: through serve's control-socket client;
    # it reads the audit log with the audit's own reader, as `cellblock audit` does; the scan
    # reports `cellblock scan` keeps, with scan's modules that are free of the SDK (saved, verdict)
    "dashboard": {"serve", "audit", "scan"},
    "cli": {"wire", "audit", "config", "ask", "downstream", "serve", "clients", "scan", "dashboard", "search"},
}
# what must stay free of the MCP SDK: other tools' config files, the config, the audit log, the page
NO_SDK = {"clients", "config", "audit", "dashboard", "search"}
SHARED_MAX = 8  # the gateway's top-level modules, shared by every folder
MODULE_MAX_LINES = 500


def folder_imports(folder: str) -> dict[str, set[str]]:
    """Each module of a gateway folder, and the gateway folders it imports (top level: "")."""
    found: dict[str, set[str]] = {}
    for path in (GATEWAY / folder).rglob("*.py"):
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                parts = name.split(".")
                if parts[:2] == ["cellblock", "gateway"] and len(parts) > 2:
                    targets.add(parts[2] if (GATEWAY / parts[2]).is_dir() else "")
                elif parts[0] in ("mcp", "mcp_types"):
                    targets.add("mcp")
                elif parts[:2] == ["cellblock", "policy"] and parts[2:3] not in (["jsontext"], ["text"]):
                    targets.add("policy")  # its pure text and JSON helpers are not decisions
        found[path.name] = targets
    return found


def test_the_gateway_folders_are_the_ones_the_architecture_names() -> None:
    folders = {p.name for p in GATEWAY.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders == set(MAY_IMPORT)
    shared = [p.name for p in GATEWAY.glob("*.py") if p.name != "__init__.py"]
    assert len(shared) <= SHARED_MAX, f"the gateway keeps {len(shared)} modules beside its folders: {sorted(shared)}"


@pytest.mark.parametrize("folder", sorted(MAY_IMPORT))
def test_gateway_folders_import_in_one_direction(folder: str) -> None:
    allowed = MAY_IMPORT[folder] | {folder, "", "mcp", "policy"}
    if folder in NO_SDK:
        allowed.discard("mcp")
    if folder == "wire":
        allowed.discard("policy")  # bytes and framing: no decisions
    bad = {module: sorted(targets - allowed) for module, targets in folder_imports(folder).items() if targets - allowed}
    assert not bad, f"gateway/{folder} imports what it may not: {bad}"


def test_the_shared_modules_import_no_folder() -> None:
    bad = {}
    for path in GATEWAY.glob("*.py"):
        tree = ast.parse(path.read_text())
        modules = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
        folders = {m.split(".")[2] for m in modules if m.startswith("cellblock.gateway.")}
        if folders & set(MAY_IMPORT) or any(m.split(".")[0] in ("mcp", "mcp_types") for m in modules):
            bad[path.name] = sorted(folders & set(MAY_IMPORT))
    assert not bad, f"shared gateway modules import a folder or the SDK: {bad}"


def module_graph() -> dict[str, set[str]]:
    """Every cellblock module and the cellblock modules it imports (TYPE_CHECKING imports too)."""
    graph: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                deps.add(node.module)
                deps.update(f"{node.module}.{a.name}" for a in node.names)
            elif isinstance(node, ast.Import):
                deps.update(a.name for a in node.names)
        graph[name] = deps
    return {name: {d for d in deps if d in graph and d != name} for name, deps in graph.items()}


def test_no_module_imports_itself_through_others() -> None:
    graph = module_graph()
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the path being walked, 2: done

    def walk(name: str, path: list[str]) -> None:
        state[name] = 1
        for dep in sorted(graph[name]):
            if state.get(dep) == 1:
                cycles.append([*path[path.index(dep) :], dep])
            elif dep not in state:
                walk(dep, [*path, dep])
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            walk(name, [name])
    assert not cycles, f"import cycles: {cycles}"


def test_modules_stay_small() -> None:
    sizes = {str(p.relative_to(PACKAGE)): len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.py")}
    big = sorted(name for name, lines in sizes.items() if lines > MODULE_MAX_LINES)
    assert not big, f"over {MODULE_MAX_LINES} lines, split along their concerns: {big}"


def test_the_architecture_page_names_what_exists() -> None:
    page = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    folders = set(re.findall(r"^\| `(\w+)/` \|", page, re.M))
    assert folders == set(MAY_IMPORT), "docs/architecture.md's table of folders is not the layout's"
    named = set(re.findall(r"`((?:\w+/)*\w+\.py)", page))
    tree = {str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")}
    missing = {
        n for n in named if not any(t == n or t.endswith("/" + n) for t in tree) and not (PACKAGE.parent / n).exists()
    }
    assert not missing, f"docs/architecture.md names files that do not exist: {sorted(missing)}"


def test_the_gateway_tests_mirror_its_folders() -> None:
    """A folder's tests are in the folder of the same name under tests/gateway (those of the shared
    modules at the top), so a reader finds a behaviour's tests where they find its code."""
    tests = PACKAGE.parent / "tests" / "gateway"
    folders = {p.name for p in tests.iterdir() if p.is_dir() and any(p.glob("test_*.py"))}
    assert folders <= set(MAY_IMPORT), f"tests/gateway folders with no source folder: {folders - set(MAY_IMPORT)}"
    shared = {p.stem for p in GATEWAY.glob("*.py")}
    loose = {p.stem.removeprefix("test_") for p in tests.glob("test_*.py")}
    assert loose <= shared, f"tests at the top of tests/gateway that belong in a folder: {loose - shared}"
