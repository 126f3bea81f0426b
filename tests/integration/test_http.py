"""`cellblock serve --http`: the same gateway over Streamable HTTP, in both eras, behind its Host,
Origin and token checks. Driven by the SDK's own HTTP client, and by raw requests for the checks."""

from __future__ import annotations

import http.client
import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp.types as types
import pytest
from mcp import Client

from tests import peers
from tests.integration.conftest import bearer_client, cli, probe_server, write_config
from tests.integration.test_approvals import Human, text

pytestmark = pytest.mark.anyio

SERVING = re.compile(r"serving on (http://\S+/mcp)")
OPENING = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}},
}


@contextmanager
def serving(config: Path, env: Mapping[str, str], bind: str = "127.0.0.1:0") -> Iterator[str]:
    """`cellblock serve --http BIND` until the block ends (then SIGTERM); yields its /mcp URL."""
    command = [sys.executable, "-m", "cellblock.gateway.cli.main", "serve", "--http", bind, "--config", str(config)]
    proc = subprocess.Popen(command, env={**os.environ, **env}, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    assert proc.stderr is not None
    seen = b""
    try:
        deadline = time.monotonic() + 60
        while (found := SERVING.search(seen.decode(errors="replace"))) is None:
            ready, _, _ = select.select([proc.stderr], [], [], max(0.0, deadline - time.monotonic()))
            chunk = os.read(proc.stderr.fileno(), 65536) if ready else b""
            if not chunk:
                raise AssertionError(f"the gateway did not start serving HTTP:\n{seen.decode(errors='replace')}")
            seen += chunk
        yield found.group(1)
    finally:
        try:
            stop(proc)
        finally:
            proc.stderr.close()


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, as a user stops the gateway; killed if it has not exited within 20 s."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    finally:
        proc.kill()


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tools = {"default": "deny", "rules": {"echo": "ask", "slow": "allow", "add_tool": "allow", "dyn*": "allow"}}
    return write_config(tmp_path_factory.mktemp("http-config"), {"p": probe_server("--name", "p", tools=tools)})


@pytest.fixture(scope="module")
def url(config: Path, served_env: dict[str, str]) -> Iterator[str]:
    with serving(config, served_env) as found:
        yield found


def raw(url: str, headers: dict[str, str] | None = None) -> int:
    """The status of one opening request, with `headers` over the defaults (Host included)."""
    parts = httpx2.URL(url)
    conn = http.client.HTTPConnection(parts.host, parts.port, timeout=30)
    sent = {
        "Host": f"{parts.host}:{parts.port}",
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        **(headers or {}),
    }
    try:
        conn.request("POST", parts.path, json.dumps(OPENING), sent)
        return conn.getresponse().status
    finally:
        conn.close()


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_an_http_client_lists_calls_and_is_asked_in_either_era(url: str, mode: str) -> None:
    human = Human("allow_once")
    async with Client(url, mode=mode, elicitation_callback=human) as client:
        names = {t.name for t in (await client.list_tools()).tools}
        assert {"p__echo", "p__slow"} <= names
        assert text(await client.call_tool("p__echo", {"message": f"over http, {mode}"})) == f"over http, {mode}"
        assert len(human.asked) == 1 and 'tool "echo"' in human.asked[0]  # the approval reached this client


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_a_call_the_human_denies_over_http_is_not_forwarded(
    url: str, mode: str, served_env: dict[str, str]
) -> None:
    async with Client(url, mode=mode, elicitation_callback=Human("deny")) as client:
        result = await client.call_tool("p__echo", {"message": f"denied-{mode}"})
    assert result.is_error
    audit = (Path(served_env["CELLBLOCK_STATE_DIR"]) / "audit.jsonl").read_text()
    ends = [json.loads(line) for line in audit.splitlines() if f"denied-{mode}" in line]
    assert ends and not any(e["event"] == "call_end" and not e.get("is_error") for e in ends)


async def test_a_handshake_http_session_is_told_when_the_tools_change(url: str) -> None:
    changed = anyio.Event()

    async def message(item: Any) -> None:
        if isinstance(item, types.ToolListChangedNotification):
            changed.set()

    async with Client(url, mode="legacy", message_handler=message) as client:
        await client.list_tools()
        await client.call_tool("p__add_tool", {"name": "dynamic_http"})
        with anyio.fail_after(20):
            await changed.wait()
        assert "p__dynamic_http" in {t.name for t in (await client.list_tools()).tools}


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({"Origin": "http://evil.example"}, 403),  # a page elsewhere
        ({"Origin": "null"}, 403),  # a sandboxed page or a file
        ({"Host": "evil.example"}, 421),  # DNS rebinding: the page's own name, resolved to 127.0.0.1
        ({"Host": "localhost.evil.example:1"}, 421),
    ],
)
def test_a_forged_origin_or_host_is_refused(url: str, headers: dict[str, str], status: int) -> None:
    assert raw(url, headers) == status
    # control: the same request as a local client sends it gets through
    assert raw(url) == 200
    assert raw(url, {"Origin": "http://localhost:6274"}) == 200  # a local web client (the Inspector)


def test_the_inspector_cli_lists_and_calls_over_http(url: str) -> None:
    # a client of another SDK (the Inspector's, TypeScript) over Streamable HTTP, as users run it

    def inspector(*args: str) -> dict[str, Any]:
        argv = [*peers.inspector_cli(), url, *args]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=peers.peer_env(), check=False)
        assert done.returncode == 0, done.stderr[-2000:]
        return json.loads(done.stdout)

    listed = {t["name"] for t in inspector("--method", "tools/list")["tools"]}
    assert "p__slow" in listed and "p__crash" not in listed  # the module's policy denies the rest
    called = inspector("--method", "tools/call", "--tool-name", "p__slow", "--tool-arg", "steps=1", "delay=0")
    assert called["content"] == [{"type": "text", "text": "done 1 steps"}]


def test_beyond_loopback_a_token_is_required_and_then_checked(config: Path, served_env: dict[str, str]) -> None:
    refused = cli(served_env, "serve", "--http", "0.0.0.0:0", "--config", str(config))
    assert refused.returncode == 1
    assert "refusing to serve HTTP on 0.0.0.0, which is not a loopback address, without a token" in refused.stderr
    token = "tok-" + os.urandom(16).hex()
    stored = cli(served_env, "auth", "set", "--http", "--config", str(config), stdin=token + "\n")
    assert stored.returncode == 0, stored.stderr
    assert token not in stored.stderr + stored.stdout
    try:
        with serving(config, served_env, "0.0.0.0:0") as found:
            local = found.replace("0.0.0.0", "127.0.0.1")
            assert raw(local) == 401
            assert raw(local, {"Authorization": f"Bearer {token}x"}) == 401
            assert raw(local, {"Authorization": token}) == 401
            assert raw(local, {"Authorization": f"Bearer {token}"}) == 200
        # once set, the token is required on loopback too
        with serving(config, served_env) as found:
            assert raw(found) == 401
            assert raw(found, {"Authorization": f"Bearer {token}"}) == 200
    finally:
        assert cli(served_env, "auth", "logout", "--http", "--config", str(config)).returncode == 0


async def test_the_sdk_client_works_with_the_token(config: Path, served_env: dict[str, str]) -> None:
    token = "tok-" + os.urandom(16).hex()
    assert cli(served_env, "auth", "set", "--http", "--config", str(config), stdin=token).returncode == 0
    try:
        with serving(config, served_env) as found:
            async with bearer_client(found, token) as client:
                assert text(await client.call_tool("p__slow", {"steps": 1, "delay": 0})) != ""
    finally:
        cli(served_env, "auth", "logout", "--http", "--config", str(config))


def test_a_bad_bind_is_refused_clearly(config: Path, served_env: dict[str, str]) -> None:
    for bind, said in (
        ("example.com:80", "HOST must be an IP address or localhost"),
        ("127.0.0.1:99999", "expected [HOST:]PORT"),
    ):
        done = cli(served_env, "serve", "--http", bind, "--config", str(config))
        assert done.returncode == 2 and said in done.stderr, done.stderr


def test_sigterm_stops_the_servers_and_exits_cleanly(config: Path, served_env: dict[str, str], tmp_path: Path) -> None:
    # uvicorn raises a SIGTERM it handled again once it has stopped: the process died of it (-15)
    # before the gateway stopped its servers
    log = tmp_path / "stderr"
    command = [
        sys.executable,
        "-m",
        "cellblock.gateway.cli.main",
        "serve",
        "--http",
        "127.0.0.1:0",
        "--config",
        str(config),
    ]
    with log.open("wb") as stderr:
        # a state of its own: a server never seen is started at once, not at its first call
        fresh = {**served_env, "CELLBLOCK_STATE_DIR": str(tmp_path / "state")}
        proc = subprocess.Popen(command, env={**os.environ, **fresh}, stderr=stderr, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while (found := SERVING.search(log.read_text(errors="replace"))) is None:
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text(errors="replace")
            time.sleep(0.1)
        assert raw(found.group(1)) == 200  # control: it serves
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        assert children  # the downstream server runs
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0, log.read_text(errors="replace")
        assert not [pid for pid in children if Path(f"/proc/{pid}").exists()]
    finally:
        proc.kill()
        proc.wait()
