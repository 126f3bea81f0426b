"""Shared pieces for driving `cellblock serve` as a real subprocess over stdio with the SDK client."""

from __future__ import annotations

import ctypes
import inspect
import os
import socket
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
import yaml
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from cellblock.sandbox.sockets import bound_sockets

ROOT = Path(__file__).resolve().parents[2]
PROBE = ROOT / "tests" / "servers" / "probe.py"


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


def probe_server(*args: str, writable: Path | None = None, **extra: Any) -> dict[str, Any]:
    """A config entry that runs the probe test server in a jail that shares its folder (and `writable`)."""
    jail: dict[str, Any] = {"read_only": [str(PROBE.parent)]}
    if writable is not None:
        jail["read_write"] = [str(writable)]
    return {"command": sys.executable, "args": [str(PROBE), *args], "jail": jail, **extra}


def asker_servers() -> dict[str, Any]:
    """The asker test server (tests/servers/asker.py) twice: `a` asking as a handshake server,
    `m` as a 2026-07-28 one."""
    asker = ROOT / "tests" / "servers" / "asker.py"
    jail = {"read_only": [str(asker.parent)]}
    return {
        "a": {"command": sys.executable, "args": [str(asker)], "protocol": "legacy", "jail": jail},
        "m": {"command": sys.executable, "args": [str(asker), "--era", "modern"], "jail": jail},
    }


# Tests about routing, jails and protocols open the policy and trust first contact; the policy
# and lock tests set their own.
OPEN_DEFAULTS = {"tools": {"default": "allow"}, "lock": {"enabled": False}}


def write_config(directory: Path, servers: dict[str, Any], **top: Any) -> Path:
    path = directory / "cellblock.yaml"
    path.write_text(yaml.safe_dump({"version": 1, "defaults": OPEN_DEFAULTS, "servers": servers, **top}))
    return path


# A user namespace of its own whose limit lets nothing in it make another: as where the kernel keeps
# unprivileged user namespaces from bwrap (AppArmor on Ubuntu 24.04, Docker's default profile)
NO_USERNS = (
    "unshare",
    "--user",
    "--map-root-user",
    "sh",
    "-c",
    'echo 0 > /proc/sys/user/max_user_namespaces && exec "$@"',
    "sh",
)


def no_landlock(tmp_path: Path) -> Path:
    """A folder for PYTHONPATH whose sitecustomize makes this kernel's Landlock look missing to
    the Cellblock it starts: a machine where neither backend can build a jail, with NO_USERNS."""
    folder = tmp_path / "no-landlock"
    folder.mkdir(parents=True)
    (folder / "sitecustomize.py").write_text(
        "import cellblock.sandbox.landlock as landlock\nlandlock.landlock_abi = lambda: 0\n"
    )
    return folder


@asynccontextmanager
async def gateway(
    config: Path,
    state: Path,
    *,
    mode: str = "auto",
    elicitation_callback: Callable[..., Awaitable[Any]] | None = None,
    env: dict[str, str] | None = None,
    stderr: Path | None = None,
    serve_args: tuple[str, ...] = (),
    prefix: Sequence[str] = (),
    **client_args: Any,
) -> AsyncIterator[Client]:
    """`cellblock serve` on `config`, connected with the SDK client in `mode` (legacy or auto).

    `stderr`: a file that collects the gateway's log (else it goes to the test's stderr).
    `prefix`: what the gateway runs under (`NO_USERNS`: a machine that refuses user namespaces).
    """
    command = [*prefix, sys.executable, "-m", "cellblock.gateway.cli.main", "serve", "--config", str(config)]
    command += serve_args
    if stderr is not None:
        command = ["/bin/sh", "-c", f'exec "$@" 2>>"{stderr}"', "sh", *command]
    params = StdioServerParameters(
        command=command[0], args=command[1:], env={"CELLBLOCK_STATE_DIR": str(state), **(env or {})}
    )
    async with Client(
        params, mode=mode, cache=None, elicitation_callback=elicitation_callback, **client_args
    ) as client:
        yield client


@asynccontextmanager
async def bearer_client(url: str, token: str, mode: str = "auto") -> AsyncIterator[Client]:
    """The SDK's client of `cellblock serve --http` at `url`, sending `token` as the bearer token."""
    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}) as http_client,
        Client(streamable_http_client(url, http_client=http_client), mode=mode) as client,
    ):
        yield client


def free_port() -> int:
    """A loopback port nothing listens on now, for a server a test starts."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


CLONE_NEWNET = 0x40000000


def hidden_service(path: Path) -> socket.socket:
    """A service's Unix socket listening at `path` (not accepting: a dial waits in its backlog),
    bound in a network namespace of its own, as a container's service on a shared directory is:
    the kernel lists it to no jail's start here (docs/jail.md, "Sockets": a GAP), so a jail shows
    it in a granted directory. Needs root (skipped otherwise)."""
    if os.geteuid() != 0:
        pytest.skip("a network namespace of the service's own needs root")
    made: list[socket.socket] = []
    failed: list[OSError] = []

    def bind() -> None:  # a thread of its own: unshare moves only the calling thread
        try:
            if ctypes.CDLL(None, use_errno=True).unshare(CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNET)")
            listening = socket.socket(socket.AF_UNIX)  # of that namespace, whatever thread uses it
            listening.bind(str(path))
            made.append(listening)
        except OSError as exc:
            failed.append(exc)

    thread = threading.Thread(target=bind)
    thread.start()
    thread.join()
    if failed:
        raise failed[0]
    listening = made[0]
    listening.listen(4)
    listening.setblocking(False)
    assert str(path) not in bound_sockets().at  # the premise: the jail's socket finder knows nothing of it
    return listening


async def eventually(check: Callable[[], bool | Awaitable[bool]], timeout: float = 10) -> None:
    """Wait until `check()` holds (awaited when it is a coroutine: a probe through a client); for
    effects seen only in files or other processes, no event exists."""
    with anyio.fail_after(timeout):
        while True:
            held = check()
            if await held if inspect.isawaitable(held) else held:
                return
            await anyio.sleep(0.02)  # the effect happens in another process; polling is the only way


def cli_env(tmp_path: Path, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """What a gateway and the CLI of one test share: `base` (a keyring, say), a private runtime dir
    (the control sockets) and the state dir, both under `tmp_path`."""
    run = tmp_path / "run"
    run.mkdir(mode=0o700, exist_ok=True)
    return {**(base or {}), "XDG_RUNTIME_DIR": str(run), "CELLBLOCK_STATE_DIR": str(tmp_path / "state")}


def cli(env: dict[str, str], *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """`cellblock ARGS` as a subprocess with `env` added, its output captured as text."""
    return subprocess.run(
        [sys.executable, "-m", "cellblock.gateway.cli.main", *args],
        input=stdin,
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=120,
        check=False,
    )


def run_as_user(env: dict[str, str], *args: str, prefix: Sequence[str] = ()) -> subprocess.CompletedProcess[str]:
    """`cellblock ARGS` from the user's shell: exactly `env` (under `prefix`: `NO_USERNS`, or nothing)."""
    command = [*prefix, sys.executable, "-m", "cellblock.gateway.cli.main", *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, check=False)


def own_address() -> str:
    """An IPv4 address of this machine beyond loopback (the one its route out leaves from); skips
    the test when it has none. A jail's loopback is its own, so a test host for a jailed server
    that ignores the proxy variables listens there."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("203.0.113.1", 9))  # no packet is sent: only the route is looked up
        except OSError as exc:
            pytest.skip(f"no route out of this machine to find its address by: {exc}")
        address = str(probe.getsockname()[0])
    if address.startswith("127."):
        pytest.skip("this machine has no address beyond loopback")
    return address


def bus_at_the_standard_path(bus_dir: str | None) -> list[str]:
    """A command prefix: a mount namespace whose /run holds only `/run/user/<uid>`, bound to `bus_dir`
    (where a desktop session has its D-Bus socket; a client gives no DBUS_SESSION_BUS_ADDRESS). Root only."""
    place = f"/run/user/{os.getuid()}"
    bind = f' && mkdir -p -m 0700 {place} && mount --bind "{bus_dir}" {place}' if bus_dir else ""
    return [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "/bin/sh",
        "-c",
        # and nothing added to the environment: the shell's PWD is not the client's
        f'mount -t tmpfs tmpfs /run{bind} && exec env -u PWD "$@"',
        "sh",
    ]


@pytest.fixture(scope="module")
def served_env(keyring_env: Mapping[str, str], tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment of a module's `cellblock serve --http`: the private keyring (which holds the
    HTTP token), and a state and runtime dir of the module's own."""
    tmp = tmp_path_factory.mktemp("served")
    (tmp / "run").mkdir(mode=0o700)
    return {**keyring_env, "XDG_RUNTIME_DIR": str(tmp / "run"), "CELLBLOCK_STATE_DIR": str(tmp / "state")}
