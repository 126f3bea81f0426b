"""`cellblock serve --http` against what can reach its port: one of its own jailed servers, on the
host's network or with an allowlist that leads to it, driving the gateway and answering its own
approval forms.

Each runs a real gateway process; each control is the same attempt against the gateway as the
issue found it, the defence taken out of the process (`WITHOUT_*`, run before the CLI)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tests.integration.conftest import ROOT, cli, eventually, free_port, probe_server, write_config
from tests.integration.test_approvals import text
from tests.integration.test_http import stop

pytestmark = [pytest.mark.anyio, pytest.mark.jail]

INTRUDER = ROOT / "tests" / "servers" / "intruder.py"
# the gateway as the issue found it: no check of which servers reach the port
WITHOUT_REACH_CHECK = "import cellblock.gateway.serve.http as h; h.reaching = lambda *args: []"


@asynccontextmanager
async def launched(
    config: Path, env: dict[str, str], port: int, log: Path, without: str = ""
) -> AsyncIterator[subprocess.Popen[bytes]]:
    """`cellblock serve --http 127.0.0.1:PORT` (`without` run first), its log in `log`, until the
    block ends (then SIGTERM)."""
    proc = spawn(config, env, port, log, without)
    try:
        await eventually(lambda: proc.poll() is not None or "serving on" in read(log), 60)
        assert proc.poll() is None, read(log)
        yield proc
    finally:
        stop(proc)
        proc.wait()


def spawn(config: Path, env: dict[str, str], port: int, log: Path, without: str) -> Any:
    code = f"{without or 'pass'}; import sys; from cellblock.gateway.cli.main import main; sys.exit(main())"
    command = [sys.executable, "-c", code, "serve", "--http", f"127.0.0.1:{port}", "--config", str(config)]
    with log.open("ab") as stderr:
        return subprocess.Popen(command, env={**os.environ, **env}, stderr=stderr, stdin=subprocess.DEVNULL)


def read(log: Path) -> str:
    return log.read_text(errors="replace")


@contextmanager
def token_stored(env: dict[str, str], config: Path) -> Iterator[str]:
    """A token in the keyring for `serve --http`, as the user stores one, removed at the end."""
    token = "tok-" + os.urandom(16).hex()
    assert cli(env, "auth", "set", "--http", "--config", str(config), stdin=token).returncode == 0
    try:
        yield token
    finally:
        cli(env, "auth", "logout", "--http", "--config", str(config))


def environment(tmp_path: Path, keyring_env: Any) -> dict[str, str]:
    (tmp_path / "run").mkdir(mode=0o700)
    return {**keyring_env, "XDG_RUNTIME_DIR": str(tmp_path / "run"), "CELLBLOCK_STATE_DIR": str(tmp_path / "state")}


@asynccontextmanager
async def client(port: int, token: str | None) -> AsyncIterator[Client]:
    """The user's own client of the gateway, with the token when one is set."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=120) as http_client,
        Client(streamable_http_client(f"http://127.0.0.1:{port}/mcp", http_client=http_client), mode="auto") as c,
    ):
        yield c


def audit(state: Path) -> list[dict[str, Any]]:
    path = state / "audit.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


# -- a server of the gateway's own drives it -------------------------------------------------


def intruders(port: int) -> dict[str, Any]:
    """A victim `p` whose `echo` is asked about, and two intruders that call it through the
    gateway: one on the host's network, one whose allowlist names the gateway's address and port."""
    url = f"http://127.0.0.1:{port}/mcp"

    def intruder(mark: str, network: dict[str, Any]) -> dict[str, Any]:
        args = [str(INTRUDER), "--gateway", url, "--tool", "p__echo", "--mark", mark]
        return {"command": sys.executable, "args": args, "jail": {"read_only": [str(INTRUDER.parent)], **network}}

    return {
        "p": probe_server("--name", "p", tools={"default": "deny", "rules": {"echo": "ask"}}),
        "open": intruder("open", {"network": "open"}),
        "allow": intruder("allow", {"network": "allowlist", "allow_hosts": [f"127.0.0.1:{port}"]}),
    }


async def outcomes(port: int, token: str | None) -> dict[str, str]:
    """What each intruder's attempts got, asked of it by the user's client once they have ended."""
    async with client(port, token) as user:
        return {mark: text(await user.call_tool(f"{mark}__outcome", {})) for mark in ("open", "allow")}


async def test_a_jailed_server_that_reaches_the_port_calls_nothing_and_approves_nothing(
    tmp_path: Path, keyring_env: Any
) -> None:
    port, env, state, log = free_port(), environment(tmp_path, keyring_env), tmp_path / "state", tmp_path / "log"
    config = write_config(tmp_path, intruders(port))
    # the set-up, no token: the gateway does not start, and says why and what to do
    refused = spawn(config, env, port, log, "")
    try:
        await eventually(lambda: refused.poll() is not None or "serving on" in read(log), 60)
    finally:
        if refused.poll() is None:  # it started: the assertions below say so, and it is stopped
            stop(refused)
    said = " ".join(read(log).split())
    assert refused.poll() == 1 and "serving on" not in said, said
    assert f"refusing to serve HTTP on port {port} without a token" in said
    assert f"servers 'allow' (allow_hosts: 127.0.0.1:{port}), 'open' (network: open) can connect to it" in said
    assert "cellblock auth set --http" in said and "Authorization: Bearer <token>" in said
    # what it says to do: a token in the keyring, which the user's client sends and the servers cannot
    with token_stored(env, config) as token:
        async with launched(config, env, port, log):
            told = await outcomes(port, token)
    for mark, lines in told.items():
        # both eras, through the host's network and through the egress proxy: turned away at the door
        assert "status: 401" in lines and lines.count("refused: ") == 2 and "called: " not in lines, (mark, lines)
    assert not (state / "approvals.json").exists()
    records = audit(state)
    assert not [r for r in records if "intruder-" in json.dumps(r) or r["event"].startswith("approval")]
    assert [r for r in records if r["event"] == "egress" and r["host"] == "127.0.0.1"]  # the proxy let it try


async def test_control_without_the_check_a_jailed_server_calls_the_tool_and_approves_it_always(
    tmp_path: Path, keyring_env: Any
) -> None:
    port, env, state = free_port(), environment(tmp_path, keyring_env), tmp_path / "state"
    config = write_config(tmp_path, intruders(port))
    async with launched(config, env, port, tmp_path / "log", without=WITHOUT_REACH_CHECK):
        told = await outcomes(port, None)
    for mark, lines in told.items():
        assert "status: 200" in lines and lines.count("called: ") == 2 and f"intruder-{mark}-" in lines, (mark, lines)
    assert json.loads((state / "approvals.json").read_text())["always"] == {"p": ["echo"]}
    granted = [r for r in audit(state) if r["event"] == "approval_granted"]
    assert granted and granted[0]["scope"] == "always"
