"""Remote servers over Streamable HTTP through the gateway: catalog, policy, lock, audit, failures.

The remote server is tests/servers/remote.py, a real SDK server on loopback; the gateway runs in
memory (tests/harness.py), driven by the SDK's client over its wire. Credentials are in
test_credentials.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import anyio
import pytest

from tests.harness import build, connected
from tests.integration.conftest import PROBE, free_port, write_config
from tests.servers.remote_run import run_remote, spawn_remote, stop_remote

pytestmark = pytest.mark.anyio


def _text(result: object) -> str:
    return "".join(getattr(c, "text", "") for c in getattr(result, "content", []))


def _events(state: Path) -> list[dict[str, object]]:
    path = state / "audit.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture(scope="module")
def remote_url() -> Iterator[str]:
    with run_remote("none") as url:
        yield url


@pytest.mark.parametrize(("mode", "protocol"), [("auto", "auto"), ("legacy", "legacy"), ("legacy", "auto")])
async def test_remote_server_joins_catalog_policy_lock_and_audit(
    tmp_path: Path, remote_url: str, mode: str, protocol: str
) -> None:
    servers = {
        "web": {
            "url": remote_url,
            "protocol": protocol,
            "tools": {"default": "deny", "rules": {"echo": "allow"}},
            "lock": {"first": "trust"},
        },
        "local": {"command": sys.executable, "args": [str(PROBE)], "jail": {"read_only": [str(PROBE.parent)]}},
    }
    config = write_config(tmp_path, servers)
    state = tmp_path / "state"
    async with connected(build(config, state), mode=mode) as client:
        names = {tool.name for tool in (await client.list_tools()).tools}
        assert {"web__echo", "local__echo"} <= names
        assert "web__whoami" not in names  # denied tools are not offered
        assert _text(await client.call_tool("web__echo", {"text": "over http"})) == "over http"
        refused = await client.call_tool("web__whoami", {})
        assert refused.is_error and "denied by policy" in _text(refused)
    calls = [(e["tool"], e["decision"]) for e in _events(state) if e["event"] == "call" and e["server"] == "web"]
    assert calls == [("echo", "allow"), ("whoami", "deny")]
    lock = json.loads((state / "locks" / "web.json").read_text())
    assert "echo" in json.dumps(lock)
    ready = [e for e in _events(state) if e["event"] == "server_ready" and e["server"] == "web"]
    assert ready and ready[0]["jail"] == "remote"


def test_show_says_a_remote_server_has_no_jail(tmp_path: Path) -> None:
    config = write_config(tmp_path, {"web": {"url": "https://mcp.example.com/mcp", "auth": {"type": "bearer"}}})
    done = subprocess.run(
        [sys.executable, "-m", "cellblock.gateway.cli.main", "show", "--config", str(config)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "jail     none: a remote server runs elsewhere" in done.stdout
    assert "bearer token from keyring entry 'web'" in done.stdout


async def test_unreachable_remote_server_is_named_with_its_url(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}/mcp"
    config = write_config(tmp_path, {"gone": {"url": url}})
    async with connected(build(config, tmp_path / "state")) as client:
        assert (await client.list_tools()).tools == []
        result = await client.call_tool("gone__echo", {"text": "x"})
    assert result.is_error
    assert "server 'gone'" in _text(result) and f"cannot reach {url}" in _text(result)


@pytest.mark.parametrize("protocol", ["auto", "legacy"])
async def test_gateway_reconnects_after_the_remote_server_restarts(tmp_path: Path, protocol: str) -> None:
    port = free_port()
    proc, url = spawn_remote("none", port=port)
    config = write_config(tmp_path, {"web": {"url": url, "protocol": protocol}})
    try:
        async with connected(build(config, tmp_path / "state")) as client:
            assert _text(await client.call_tool("web__echo", {"text": "before"})) == "before"
            stop_remote(proc)
            down = await client.call_tool("web__echo", {"text": "while down"})
            assert down.is_error and "'web'" in _text(down)
            proc, _ = spawn_remote("none", port=port)
            answers: list[str] = []

            async def answered() -> bool:
                answers.append(_text(await client.call_tool("web__echo", {"text": "after"})))
                return answers[-1] == "after"

            await _eventually_async(answered, timeout=30)
    finally:
        stop_remote(proc)


async def _eventually_async(check: Callable[[], Awaitable[bool]], timeout: float) -> None:
    with anyio.fail_after(timeout):
        while not await check():  # noqa: ASYNC110 - the effect is in another process; polling it is the way
            await anyio.sleep(0.5)


@pytest.mark.parametrize("protocol", ["auto", "legacy"])
async def test_a_remote_answer_over_max_message_size_fails_its_call_naming_the_server(
    tmp_path: Path, remote_url: str, protocol: str
) -> None:
    servers = {"web": {"url": remote_url, "protocol": protocol, "max_message_size": "64KiB"}}
    async with connected(build(write_config(tmp_path, servers), tmp_path / "state")) as client:
        big = await client.call_tool("web__echo", {"text": "x" * 200_000})  # echoed back: too large
        assert big.is_error and "server 'web'" in _text(big), _text(big)
        assert "x" * 1000 not in _text(big)
        assert _text(await client.call_tool("web__echo", {"text": "small"})) == "small"
