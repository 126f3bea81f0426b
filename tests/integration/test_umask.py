"""A first start as an ordinary user, under the umask users have (Ubuntu's 002, and 022): the
directories Cellblock makes get the modes it requires, and one it did not make keeps its own.

Root runs each command as `nobody` with a home of nobody's own and only PATH and HOME set, as a
client starts it. The test's Python may live under a directory only root can enter (root's home):
the command then runs in a mount namespace of its own where that directory is a bare tmpfs that
holds only what the command needs, bound back.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from cellblock.sandbox.installer import REGISTRY_ENV
from tests.integration.conftest import PROBE, ROOT, probe_server, write_config

pytestmark = [pytest.mark.anyio, pytest.mark.jail]
NOBODY = 65534


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def place() -> Iterator[Path]:
    """A directory every user can enter, with `home`, nobody's own (pytest's tmp_path is root's alone)."""
    if os.getuid() != 0 or shutil.which("runuser") is None or shutil.which("unshare") is None:
        pytest.skip("running a command as another user needs root, runuser and unshare")
    path = Path(tempfile.mkdtemp(prefix="cellblock-umask-"))
    path.chmod(0o755)
    (path / "home").mkdir(mode=0o755)
    os.chown(path / "home", NOBODY, NOBODY)
    try:
        yield path
    finally:
        shutil.rmtree(path)


def _closed_to_others(paths: list[str]) -> tuple[str, set[str]] | None:
    """The one directory on the way to `paths` that others cannot enter (and the entries in it
    that lead to them), or None when every path is open."""
    closed: dict[str, set[str]] = {}
    for path in paths:
        parts = Path(path).parts
        for depth in range(1, len(parts)):
            directory = os.path.join(*parts[:depth])
            if not os.stat(directory).st_mode & stat.S_IXOTH:
                closed.setdefault(directory, set()).add(parts[depth])
                break
    if len(closed) > 1:
        pytest.skip(f"more than one directory on the way to the test's Python is closed to others: {sorted(closed)}")
    return next(iter(closed.items()), None)


def as_nobody(umask: str, home: Path, *argv: str) -> list[str]:
    """`argv` as nobody under `umask`, with only PATH, HOME (and the registry's settings) set."""
    env = ["PATH=/usr/bin:/bin", f"HOME={home}", *(f"{k}={os.environ[k]}" for k in REGISTRY_ENV if k in os.environ)]
    run = ["runuser", "-u", "nobody", "--", "env", "-i", *env, "/bin/sh", "-c", f'umask {umask}; exec "$@"', "sh"]
    closed = _closed_to_others([os.path.realpath(sys.executable), sys.prefix, str(ROOT)])
    if closed is None:
        return [*run, *argv]
    directory, entries = closed
    keep = " && ".join(
        f'mkdir -p "$k/{e}" "{directory}/{e}" && mount --rbind "{directory}/{e}" "$k/{e}"' for e in sorted(entries)
    )
    back = " && ".join(f'mount --rbind "$k/{e}" "{directory}/{e}"' for e in sorted(entries))
    script = (
        f"k=$(mktemp -d) && {keep} && mount -t tmpfs -o mode=0755 tmpfs {shlex.quote(directory)} && "
        + " && ".join(f'mkdir "{directory}/{e}"' for e in sorted(entries))
        + f' && {back} && exec "$@"'
    )
    return ["unshare", "--mount", "--propagation", "private", "/bin/sh", "-c", script, "sh", *run, *argv]


def cellblock(umask: str, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`cellblock ARGS` as nobody under `umask`, its output captured."""
    argv = as_nobody(umask, home, sys.executable, "-m", "cellblock.gateway.cli.main", *args)
    return subprocess.run(argv, input="", capture_output=True, text=True, timeout=600, check=False)


def serve(umask: str, home: Path, config: Path) -> StdioServerParameters:
    argv = as_nobody(umask, home, sys.executable, "-m", "cellblock.gateway.cli.main", "serve", "--config", str(config))
    return StdioServerParameters(command=argv[0], args=argv[1:])


def modes(home: Path, *paths: str) -> dict[str, str]:
    return {p: oct(stat.S_IMODE((home / p).stat().st_mode)) for p in paths}


def text(result: Any) -> str:
    return " ".join(getattr(c, "text", "") for c in result.content)


STATE = (".local", ".local/state", ".local/state/cellblock", ".local/state/cellblock/run")


@pytest.mark.parametrize("umask", ["002", "022"])
async def test_a_first_serve_as_a_user_makes_its_directories_private_and_starts(place: Path, umask: str) -> None:
    home = place / "home"
    config = write_config(place, {"probe": probe_server()})
    async with Client(serve(umask, home, config), mode="legacy") as client:
        assert text(await client.call_tool("probe__echo", {"message": "first start"})) == "first start"
    assert modes(home, *STATE) == dict.fromkeys(STATE, "0o700")
    assert (home / ".local").stat().st_uid == NOBODY


async def test_a_users_own_local_keeps_its_mode(place: Path) -> None:
    home = place / "home"
    (home / ".local").mkdir()
    (home / ".local").chmod(0o755)
    os.chown(home / ".local", NOBODY, NOBODY)
    config = write_config(place, {"probe": probe_server()})
    async with Client(serve("002", home, config), mode="legacy") as client:
        assert text(await client.call_tool("probe__echo", {"message": "up"})) == "up"
    assert modes(home, ".local", ".local/state", ".local/state/cellblock") == {
        ".local": "0o755",  # the user's, as it was
        ".local/state": "0o700",
        ".local/state/cellblock": "0o700",
    }


def test_a_state_parent_the_umask_left_open_is_refused(place: Path) -> None:
    """The control: `~/.local/state` as mkdir under umask 002 leaves it (0775), which is what
    Cellblock's first start made before, is still refused: the check that broke the first start
    stands, and only the directories Cellblock makes changed."""
    home = place / "home"
    for directory in (home / ".local", home / ".local" / "state"):
        directory.mkdir()
        directory.chmod(0o775)
        os.chown(directory, NOBODY, NOBODY)
    config = write_config(place, {"probe": probe_server()})
    refused = cellblock("002", home, "serve", "--config", str(config))
    assert refused.returncode != 0
    assert f"{home}/.local/state is writable by others (mode 775)" in refused.stderr
    assert modes(home, ".local/state") == {".local/state": "0o775"}  # not ours: left as it was


async def test_wrap_then_its_entry_starts_under_umask_002(place: Path) -> None:
    home = place / "home"
    client_config = home / "claude_desktop_config.json"
    client_config.write_text(json.dumps({"mcpServers": {"probe": {"command": sys.executable, "args": [str(PROBE)]}}}))
    os.chown(client_config, NOBODY, NOBODY)
    wrapped = await anyio.to_thread.run_sync(cellblock, "002", home, "wrap", str(client_config))
    assert wrapped.returncode == 0, wrapped.stderr
    assert modes(home, ".config", ".config/cellblock") == {".config": "0o700", ".config/cellblock": "0o700"}
    entry = json.loads(client_config.read_text())["mcpServers"]["cellblock"]
    config = Path(entry["args"][entry["args"].index("--config") + 1])
    async with Client(serve("002", home, config), mode="legacy") as client:
        # wrap holds the catalog for review: the gateway is up and offers its own status tool
        assert "cellblock__status" in [t.name for t in (await client.list_tools()).tools]
    assert modes(home, *STATE) == dict.fromkeys(STATE, "0o700")


@pytest.mark.slow
def test_an_install_as_a_user_under_umask_002_leaves_no_directory_others_can_write(place: Path) -> None:
    home = place / "home"
    config = place / "cellblock.yaml"
    config.write_text("version: 1\nservers:\n  cow:\n    install: {pypi: cowsay==6.1}\n    command: cowsay\n")
    done = cellblock("002", home, "install", "--config", str(config), "cow")
    assert done.returncode == 0, done.stderr
    data = home / ".local" / "share" / "cellblock"
    assert modes(home, ".local/share", ".local/share/cellblock") == dict.fromkeys(
        (".local/share", ".local/share/cellblock"), "0o700"
    )
    made = [data, *(p for p in data.rglob("*") if p.is_dir() and not p.is_symlink())]
    assert [str(p) for p in made if p.stat().st_mode & 0o022] == []
