"""What servers run on must start in every profile: a system program, node, a venv's Python
loading ssl, and a server from npx and from uvx (each answering `initialize`). Each start has its
control: the same command, unjailed, works (and fetches the package for the jailed start)."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.macos.jail import NPX_SERVER, UVX_SERVER, answered, handshake, plan, run

pytestmark = pytest.mark.macos


@dataclass(frozen=True)
class Start:
    name: str
    argv: Callable[[Path], list[str]]  # from the venv's python; a missing launcher skips
    env: dict[str, str]  # for the jailed start: launchers offline, as network: none leaves them
    server: bool = False  # an MCP server: answers `initialize`; else a program that exits 0


def launcher(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        pytest.skip(f"{name} is not on PATH")
    return found


STARTS = [
    Start("true", lambda _: ["/usr/bin/true"], {}),
    Start("node", lambda _: [launcher("node"), "-e", "1"], {}),
    Start("venv python, import ssl", lambda python: [str(python), "-c", "import ssl"], {}),
    Start("npx server", lambda _: [launcher("npx"), "-y", NPX_SERVER, "stdio"], {"npm_config_offline": "true"}, True),
    Start(
        "uvx server",
        lambda _: [launcher("uvx"), "--from", UVX_SERVER, "mcp-server-time", "--local-timezone", "UTC"],
        {"UV_OFFLINE": "1"},
        True,
    ),
]


def started(start: Start, argv: list[str], jail: dict[str, object] | bool, private: Path) -> tuple[bool, str]:
    """Whether `argv` started (and answered, for a server) as `jail` says, and what it said."""
    made = plan(argv, jail, private, start.env if jail is not False else None)
    if start.server:
        line = handshake(made)
        return answered(line), line
    done = run(made)
    return done.returncode == 0, f"status {done.returncode}: {done.stderr[-2000:]}"


@pytest.mark.parametrize("start", STARTS, ids=lambda s: s.name)
def test_it_starts_in_every_profile(start: Start, profile: dict[str, object], venv_python: Path, private: Path) -> None:
    argv = start.argv(venv_python)
    ok, said = started(start, argv, False, private)
    assert ok, f"the control (unjailed) did not start either: {said}"
    ok, said = started(start, argv, profile, private)
    assert ok, f"{start.name} did not start in the jail ({profile}): {said}"
