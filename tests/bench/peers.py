"""The peer proxies the gateway is compared with: FastMCP's proxy and mcp-proxy, each in its own virtualenv.

Their SDK versions differ from ours (mcp-proxy is on SDK 1.x), so each lives in `.bench/<name>`,
created with `python3.11 -m venv` and the pinned version installed on first use. mcp-proxy has no
stdio-to-stdio mode: it serves a stdio server over Streamable HTTP (or SSE), or the reverse, so the
benchmark reaches it over Streamable HTTP on loopback and says so.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import anyio
from anyio.abc import Process
from mcp.client.stdio import StdioServerParameters

from tests.bench.report import say
from tests.bench.spawn import CONNECT_SECONDS, ROOT, tail

__all__ = ["FASTMCP", "MCP_PROXY", "PEERS", "Peer", "fastmcp_proxy", "mcp_proxy"]

BENCH_DIR = ROOT / ".bench"
FASTMCP_SCRIPT = Path(__file__).resolve().parent / "fastmcp_proxy.py"
# pip installing a peer and its dependencies from the registry
INSTALL_SECONDS = 600
# a stopped proxy gets this long to end its own children before its process group is killed
STOP_SECONDS = 5.0


@dataclass(frozen=True)
class Peer:
    """A third-party proxy, pinned, with the packages whose versions the report prints."""

    name: str
    pin: str
    shown: tuple[str, ...]

    @property
    def venv(self) -> Path:
        return BENCH_DIR / self.name

    def bin(self, name: str) -> Path:
        return self.venv / "bin" / name

    def ensure(self) -> None:
        """Create the virtualenv and install the pinned version, unless that was done before.

        Raises:
            RuntimeError: python3.11 is missing, or the install failed (the message has pip's last lines).
        """
        stamp = self.venv / ".bench-installed"
        if stamp.is_file() and stamp.read_text() == self.pin:
            return
        python = shutil.which("python3.11")
        if python is None:
            raise RuntimeError(f"{self.name}: python3.11 is needed to create {self.venv}")
        say(f"installing {self.pin} into {self.venv.relative_to(ROOT)}")
        for argv in (
            [python, "-m", "venv", "--clear", str(self.venv)],
            [str(self.bin("python")), "-m", "pip", "install", "-q", self.pin],
        ):
            done = subprocess.run(argv, capture_output=True, text=True, timeout=INSTALL_SECONDS, check=False)
            if done.returncode != 0:
                last = " / ".join(done.stderr.strip().splitlines()[-3:])
                raise RuntimeError(f"{self.name}: {' '.join(argv[-3:])} failed: {last}")
        stamp.write_text(self.pin)

    def versions(self) -> dict[str, str]:
        """Installed versions of the packages in `shown` (the peer itself, its MCP SDK, pydantic)."""
        code = "import importlib.metadata as m, json, sys; print(json.dumps({p: m.version(p) for p in sys.argv[1:]}))"
        done = subprocess.run(
            [str(self.bin("python")), "-c", code, *self.shown], capture_output=True, text=True, check=True, timeout=60
        )
        versions: dict[str, str] = json.loads(done.stdout)
        return versions


FASTMCP = Peer("fastmcp", "fastmcp==4.1.6", ("fastmcp", "mcp", "pydantic"))
MCP_PROXY = Peer("mcp-proxy", "mcp-proxy==0.13.0", ("mcp-proxy", "mcp", "pydantic"))
PEERS = (FASTMCP, MCP_PROXY)


def fastmcp_proxy(servers: Mapping[str, list[str]]) -> StdioServerParameters:
    """FastMCP's `create_proxy` in front of `servers` (name -> argv), served on stdio."""
    return StdioServerParameters(command=str(FASTMCP.bin("python")), args=[str(FASTMCP_SCRIPT), json.dumps(servers)])


@asynccontextmanager
async def mcp_proxy(servers: Mapping[str, list[str]], log: Path) -> AsyncIterator[dict[str, str]]:
    """mcp-proxy serving `servers` (name -> argv) over Streamable HTTP on loopback; yields name -> URL.

    One server is its default server (`/mcp`); several are named servers (`/servers/<name>/mcp`).

    Raises:
        RuntimeError: the proxy exited or did not listen within CONNECT_SECONDS.
    """
    port = _free_port()
    argv = [str(MCP_PROXY.bin("mcp-proxy")), "--host", "127.0.0.1", "--port", str(port), "--log-level", "WARNING"]
    base = f"http://127.0.0.1:{port}"
    if len(servers) == 1:
        ((name, command),) = servers.items()
        argv += ["--", *command]
        urls = {name: f"{base}/mcp"}
    else:
        for name, command in servers.items():
            argv += ["--named-server", name, shlex.join(command)]
        urls = {name: f"{base}/servers/{name}/mcp" for name in servers}
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a", encoding="utf-8") as out:
        process = await anyio.open_process(
            argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True
        )
        try:
            await _listening(port, process, log)
            yield urls
        finally:
            with anyio.CancelScope(shield=True):
                await _stop(process)


async def _listening(port: int, process: Process, log: Path) -> None:
    with anyio.move_on_after(CONNECT_SECONDS):
        while process.returncode is None:
            try:
                stream = await anyio.connect_tcp("127.0.0.1", port)
            except OSError:
                await anyio.sleep(0.05)
                continue
            await stream.aclose()
            return
    raise RuntimeError(f"mcp-proxy did not listen on port {port} (exit {process.returncode}): {tail(log)}")


async def _stop(process: Process) -> None:
    """End the proxy and the servers it spawned: its own process group, by its id."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            break
        with anyio.move_on_after(STOP_SECONDS):
            await process.wait()
            break


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port
