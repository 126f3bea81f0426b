"""`cellblock serve --http` against what can reach its port: one of its own jailed servers, on the
host's network or with an allowlist that leads to it, driving the gateway and answering its own
approval forms; and a flood of half-sent requests against a gateway with few file descriptors.

Each runs a real gateway process; each control is the same attempt against the gateway as the
issue found it, the defence taken out of the process (`WITHOUT_*`, run before the CLI)."""

from __future__ import annotations

import http.client
import json
import os
import resource
import select
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager, suppress
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from cellblock.gateway.downstream.backoff import Backoff
from tests.integration.conftest import ROOT, cli, eventually, free_port, probe_server, write_config
from tests.integration.test_approvals import text
from tests.integration.test_http import stop

pytestmark = [pytest.mark.anyio, pytest.mark.jail]

INTRUDER = ROOT / "tests" / "servers" / "intruder.py"
RAW = ROOT / "tests" / "servers" / "raw.py"
# the gateway as the issue found it: no check of which servers reach the port; no cap on connections
# nor deadline for a request to arrive
WITHOUT_REACH_CHECK = "import cellblock.gateway.serve.http as h; h.reaching = lambda *args: []"
WITHOUT_LIMITS = (
    "import cellblock.gateway.serve.connections as c; c.connection_cap = lambda files: 1 << 20; c.ARRIVAL_SECONDS = 1e6"
)
# as it was: a connection whose answer its client does not take is busy, not waiting for its client
WITHOUT_UNTAKEN = "import cellblock.gateway.serve.connections as c; c.Connection.untaken = False"
OPENING = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}},
}
# A flood's size against the gateway's limit of open files: cheap, and well past what the limit holds.
FILES, FLOOD = 128, 200
# Connections that never read their answers: past the cap at `FILES` (32), each with more requests
# sent at once than the kernel holds answers to (a few hundred, for a client that reads next to
# nothing and takes small segments: `stalled`).
STALLS, PIPELINED, SEGMENT = 40, 1000, 536
# How long an authenticated request may take while the flood lasts (the control's starves past it).
ANSWER_SECONDS = 5.0
# ...and while stalled connections hold the gateway: answered in under a second here, and in one
# loaded run not within 5 s; the control's request is not answered in 30 s and more.
STALLED_ANSWER_SECONDS = 15.0


@asynccontextmanager
async def launched(
    config: Path, env: dict[str, str], port: int, log: Path, without: str = "", files: int | None = None
) -> AsyncIterator[subprocess.Popen[bytes]]:
    """`cellblock serve --http 127.0.0.1:PORT` (`without` run first; at most `files` open files),
    its log in `log`, until the block ends (then SIGTERM)."""
    proc = spawn(config, env, port, log, without, files)
    try:
        await eventually(lambda: proc.poll() is not None or "serving on" in read(log), 60)
        assert proc.poll() is None, read(log)
        yield proc
    finally:
        stop(proc)
        proc.wait()


def spawn(config: Path, env: dict[str, str], port: int, log: Path, without: str, files: int | None) -> Any:
    code = f"{without or 'pass'}; import sys; from cellblock.gateway.cli.main import main; sys.exit(main())"
    command = [sys.executable, "-c", code, "serve", "--http", f"127.0.0.1:{port}", "--config", str(config)]

    def limited() -> None:
        if files is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (files, files))

    with log.open("ab") as stderr:
        return subprocess.Popen(
            command, env={**os.environ, **env}, stderr=stderr, stdin=subprocess.DEVNULL, preexec_fn=limited
        )


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
    refused = spawn(config, env, port, log, "", None)
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


# -- a flood of half-sent requests ------------------------------------------------------------


@contextmanager
def flood(port: int) -> Iterator[None]:
    """`FLOOD` connections to `port` while the block runs, each with a request begun and never
    ended; those the gateway has not accepted wait in its backlog, their bytes sent."""
    socks = []
    try:
        for _ in range(FLOOD):
            socks.append(sock := socket.socket())
            sock.setblocking(False)
            sock.connect_ex(("127.0.0.1", port))
        pending, deadline = list(socks), time.monotonic() + 5
        while pending and time.monotonic() < deadline:
            _, ready, _ = select.select([], pending, [], 0.5)
            for sock in ready:
                pending.remove(sock)
                with suppress(OSError):  # closed by the gateway already
                    sock.send(f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: ".encode())
        yield
    finally:
        for sock in socks:
            sock.close()


def answered_within(port: int, token: str, seconds: float) -> bool:
    """Whether the user's authenticated request gets its answer within `seconds`."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=seconds)
    headers = {
        "Host": f"127.0.0.1:{port}",
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "Authorization": f"Bearer {token}",
    }
    try:
        conn.request("POST", "/mcp", json.dumps(OPENING), headers)
        return conn.getresponse().status == 200
    except TimeoutError:
        return False
    finally:
        conn.close()


@asynccontextmanager
async def few_files(tmp_path: Path, keyring_env: Any, without: str = "") -> AsyncIterator[tuple[int, str, Path]]:
    """A gateway of `FILES` open files with a token, its server `r` ready; yields its port, the
    token and its log. `r` exits once `tmp_path/signal/exit` exists, so the test chooses when it
    starts again (and the one started then stays)."""
    port, env, log = free_port(), environment(tmp_path, keyring_env), tmp_path / "log"
    (tmp_path / "signal").mkdir()
    args = [str(RAW), "--exit-when", str(tmp_path / "signal" / "exit")]
    jail = {"read_only": [str(RAW.parent), str(tmp_path / "signal")]}
    config = write_config(
        tmp_path, {"r": {"command": sys.executable, "args": args, "protocol": "legacy", "jail": jail}}
    )
    with token_stored(env, config) as token:
        async with launched(config, env, port, log, without=without, files=FILES):
            await eventually(lambda: "server 'r' is ready" in read(log), 30)
            yield port, token, log


async def ok(port: int, token: str) -> str:
    """What `r`'s tool answers the user (a call waits for the server's start)."""
    async with client(port, token) as user:
        return text(await user.call_tool("r__ok", {}))


async def test_a_flood_of_half_sent_requests_starves_no_client_fills_no_log_and_fails_no_server(
    tmp_path: Path, keyring_env: Any
) -> None:
    async with few_files(tmp_path, keyring_env) as (port, token, log):
        with flood(port):
            assert answered_within(port, token, ANSWER_SECONDS)
            (tmp_path / "signal" / "exit").touch()
            # it starts again while the flood holds, and runs
            await eventually(lambda: read(log).count("server 'r' is ready") == 2, 30)
        assert await ok(port, token) == "ok"
        assert len(read(log).encode()) < 16_000, read(log)[-2000:]  # a few lines, not one per connection


async def test_control_without_the_cap_the_flood_starves_a_client_and_a_starting_server_waits_it_out(
    tmp_path: Path, keyring_env: Any
) -> None:
    async with few_files(tmp_path, keyring_env, without=WITHOUT_LIMITS) as (port, token, log):
        with flood(port):
            assert not answered_within(port, token, ANSWER_SECONDS)  # it waits behind the flood
            (tmp_path / "signal" / "exit").touch()
            # its starts again fail for want of descriptors, as many times as restarts are allowed
            await eventually(lambda: failed_starts(read(log)) >= Backoff().restarts or "gave up" in read(log), 60)
        # once the flood has passed, the next start runs: the server was never failed for good
        assert await ok(port, token) == "ok"
        assert len(read(log).encode()) < 16_000, read(log)[-2000:]  # failed accepts told once in a while


def failed_starts(log: str) -> int:
    return sum("server 'r' is down" in line and "Too many open files" in line for line in log.splitlines())


# -- answers never read -----------------------------------------------------------------------


@contextmanager
def stalled(port: int) -> Iterator[None]:
    """`STALLS` connections to `port` while the block runs, each sending `PIPELINED` requests at
    once (without the token: each is answered 401) and reading none of the answers, with the
    smallest receive buffer the kernel gives and segments of `SEGMENT` bytes (so the kernel holds
    less for it); those not accepted wait in the backlog."""
    request = f"GET /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode() * PIPELINED
    socks, unsent = [], {}
    try:
        for _ in range(STALLS):
            socks.append(sock := socket.socket())
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, SEGMENT)
            sock.setblocking(False)
            sock.connect_ex(("127.0.0.1", port))
            unsent[sock] = memoryview(request)
        deadline = time.monotonic() + 10
        while unsent and time.monotonic() < deadline:
            _, ready, _ = select.select([], list(unsent), [], 0.5)
            if not ready:
                break  # every connection's requests wait behind answers it does not take
            for sock in ready:
                try:
                    unsent[sock] = unsent[sock][sock.send(unsent[sock]) :]
                except OSError:  # closed by the gateway already
                    unsent[sock] = memoryview(b"")
                if not unsent[sock]:
                    del unsent[sock]
        yield
    finally:
        for sock in socks:
            sock.close()


@asynccontextmanager
async def stalled_gateway(tmp_path: Path, keyring_env: Any, without: str = "") -> AsyncIterator[tuple[int, str, Path]]:
    """`few_files`' gateway while `stalled` connections hold it; yields its port, token and log."""
    async with few_files(tmp_path, keyring_env, without=without) as (port, token, log):
        with stalled(port):
            yield port, token, log


async def test_connections_that_never_read_their_answers_starve_no_client_and_are_closed(
    tmp_path: Path, keyring_env: Any
) -> None:
    async with stalled_gateway(tmp_path, keyring_env) as (port, token, log):
        assert answered_within(port, token, STALLED_ANSWER_SECONDS)
        # and below the cap, none holds its connection past the deadline either
        await eventually(lambda: "whose client did not take its answer" in read(log), 30)
    assert len(read(log).encode()) < 16_000, read(log)[-2000:]


async def test_control_without_untaken_answers_counted_connections_that_never_read_starve_a_client(
    tmp_path: Path, keyring_env: Any
) -> None:
    async with stalled_gateway(tmp_path, keyring_env, without=WITHOUT_UNTAKEN) as (port, token, log):
        assert not answered_within(port, token, STALLED_ANSWER_SECONDS)  # the cap is held by connections answered
    assert "whose client did not take its answer" not in read(log)
