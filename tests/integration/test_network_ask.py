"""`network: ask`: a connection to a host outside the list waits while the human is asked.

The real `cellblock serve` runs a real Node 20 server (`tests/servers/reacher.cjs`) in a bwrap jail
whose relay answers every name at once (and, for the first test, Node 24 in a Landlock jail, whose
fetch goes through the proxy variables to the same proxy); its `fetch` of the machine's own host name (not listed)
is held until `cellblock approve ID` / `deny ID` answers the pending approval. The site listens
on a random port of the address the name resolves to; a listed name on the same port
(`listed.invalid`) puts that port among those the relay carries (ask carries 80, 443 and the
listed ports), and the IP entry lets the proxy connect to that loopback address after a yes, as
the special-address check wants. The gateway runs in memory (tests/harness.py), serving its
control socket where the test's `cellblock approve` and `deny` reach it, but for the wrapped fetch
server, whose gateway gets the home and PATH a client passes.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anyio
import mcp.types as types
import pytest
import yaml
from mcp import Client

from cellblock.sandbox.connects import gate_missing
from cellblock.sandbox.landlock import landlock_abi
from tests import peers
from tests.harness import build, connected
from tests.integration.conftest import cli, cli_env, eventually, gateway, write_config
from tests.integration.test_egress import BODY, Handler
from tests.integration.test_egress_names import REACHER, named_site, node_20, text

pytestmark = [pytest.mark.anyio, pytest.mark.jail, pytest.mark.peers]
__all__ = ["named_site"]  # a fixture, used by name


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


def reacher(network: str, allow: list[str], backend: str = "bwrap") -> dict[str, Any]:
    """The server in a jail of `backend`: on Landlock, which has no relay to answer its lookups, run
    by a Node that uses the proxy variables (24, asked to by the jail), and on bwrap by Node 20."""
    modules = str(peers.NODE_MODULES)
    jail: dict[str, Any] = {"network": network, "read_only": [str(REACHER.parent), modules], "backend": backend}
    if allow:
        jail["allow_hosts"] = allow
    node = node_20() if backend == "bwrap" else peers.node()
    return {"command": node, "args": [str(REACHER)], "env": {"NODE_PATH": modules}, "jail": jail}


async def pending(tmp_path: Path) -> dict[str, Any]:
    """The one approval `cellblock pending` shows, once it is there (another process: `eventually`)."""
    shown: list[dict[str, Any]] = []

    async def listed() -> bool:
        done = await anyio.to_thread.run_sync(lambda: cli(cli_env(tmp_path), "pending", "--json"))
        shown[:] = json.loads(done.stdout or "[]")
        return bool(shown)

    await eventually(listed, timeout=30)
    (item,) = shown
    return dict(item)


def events(tmp_path: Path, kind: str) -> list[dict[str, Any]]:
    lines = (tmp_path / "state" / "audit.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == kind]


@asynccontextmanager
async def serving(
    tmp_path: Path, network: str, allow: list[str], backend: str = "bwrap"
) -> AsyncIterator[tuple[Client, Path]]:
    config = tmp_path / "cellblock.yaml"
    if not config.exists():
        write_config(tmp_path, {"r": reacher(network, allow, backend)}, approvals={"timeout": 60})
    env = cli_env(tmp_path)  # the runtime dir where `cellblock approve` and `deny` reach it
    async with connected(
        build(config, Path(env["CELLBLOCK_STATE_DIR"]), runtime=Path(env["XDG_RUNTIME_DIR"]))
    ) as client:
        yield client, config


async def fetch_answered(
    client: Client, tmp_path: Path, url: str, *answer: str
) -> tuple[types.CallToolResult, dict[str, Any]]:
    """`url` fetched by the server while the test answers its pending approval with `cellblock ANSWER ID`."""
    results: list[types.CallToolResult] = []

    async def call() -> None:
        results.append(await client.call_tool("r__fetch", {"url": url}))

    async with anyio.create_task_group() as tg:
        tg.start_soon(call)
        item = await pending(tmp_path)
        table = await anyio.to_thread.run_sync(lambda: cli(cli_env(tmp_path), "pending"))
        item["table"] = table.stdout
        verb, *flags = answer
        done = await anyio.to_thread.run_sync(lambda: cli(cli_env(tmp_path), verb, item["id"], *flags))
        assert done.returncode == 0, done.stderr
    return results[0], item


@pytest.mark.parametrize("backend", ["bwrap", "landlock"])
async def test_a_host_allowed_once_is_reached_while_the_connection_waits(
    named_site: tuple[str, int, list[str]], tmp_path: Path, backend: str
) -> None:
    if backend == "landlock" and (landlock_abi() < 1 or gate_missing() is not None):
        pytest.skip(f"no Landlock jail with a gate here: {gate_missing() or 'no Landlock'}")
    name, port, _ = named_site
    allow = [f"listed.invalid:{port}", f"127.0.0.1:{port}"]
    async with serving(tmp_path, "ask", allow, backend) as (client, _):
        before = len(Handler.hits)
        result, item = await fetch_answered(client, tmp_path, f"http://{name}:{port}/once", "approve")
        assert (item["server"], item["tool"], item["kind"]) == ("r", f"{name}:{port}", "egress")
        assert f"\tr\tconnect to {name}:{port}\t" in item["table"]
        assert text(result) == f"200 {BODY.decode()}", text(result)
        assert Handler.hits[before:] == ["/once"]
        # the rest of this run: not asked again
        again = await client.call_tool("r__fetch", {"url": f"http://{name}:{port}/again"})
        assert text(again) == f"200 {BODY.decode()}", text(again)
    assert len(events(tmp_path, "approval_asked")) == 1
    allowed = [(e["host"], e["decision"], e.get("asked")) for e in events(tmp_path, "egress")]
    assert allowed == [(name, "allow", "once"), (name, "allow", "once (asked before)")]


async def test_a_denied_host_gets_nothing_and_is_told_the_command_that_allows_it(
    named_site: tuple[str, int, list[str]], tmp_path: Path
) -> None:
    name, port, _ = named_site
    async with serving(tmp_path, "ask", [f"listed.invalid:{port}", f"127.0.0.1:{port}"]) as (client, config):
        before = len(Handler.hits)
        result, _ = await fetch_answered(client, tmp_path, f"http://{name}:{port}/denied", "deny")
        command = f"cellblock allow-host r {name}:{port}"
        assert text(result).startswith(f"403 cellblock: egress to {name}:{port} refused"), text(result)
        assert command in text(result)
        # remembered: refused again at once, with no new question
        again = await client.call_tool("r__fetch", {"url": f"http://{name}:{port}/denied-again"})
        assert text(again).startswith("403 ") and command in text(again), text(again)
        assert Handler.hits[before:] == [], "a denied connection reached the site"
        # the command it names allows it, in the running gateway too
        allowed = await anyio.to_thread.run_sync(
            lambda: cli(cli_env(tmp_path), "allow-host", "r", f"{name}:{port}", "--config", str(config))
        )
        assert allowed.returncode == 0, allowed.stderr
        after = await client.call_tool("r__fetch", {"url": f"http://{name}:{port}/allowed"})
        assert text(after) == f"200 {BODY.decode()}", text(after)
    assert len(events(tmp_path, "approval_asked")) == 1
    refused = [e for e in events(tmp_path, "egress") if e["decision"] == "deny"]
    assert len(refused) == 2 and all(command in e["reason"] for e in refused)


async def test_a_host_allowed_always_is_written_to_the_config_and_never_asked_again(
    named_site: tuple[str, int, list[str]], tmp_path: Path
) -> None:
    name, port, _ = named_site
    async with serving(tmp_path, "ask", [f"listed.invalid:{port}", f"127.0.0.1:{port}"]) as (client, config):
        result, _ = await fetch_answered(client, tmp_path, f"http://{name}:{port}/always", "approve", "--always")
        assert text(result) == f"200 {BODY.decode()}", text(result)
        written = yaml.safe_load(config.read_text())["servers"]["r"]["jail"]
        assert written["network"] == "ask" and f"{name}:{port}" in written["allow_hosts"]
        second = await client.call_tool("r__fetch", {"url": f"http://{name}:{port}/second"})
        assert text(second) == f"200 {BODY.decode()}", text(second)
    async with serving(tmp_path, "ask", []) as (client, _):  # a new gateway, from the config as written
        third = await client.call_tool("r__fetch", {"url": f"http://{name}:{port}/after-restart"})
        assert text(third) == f"200 {BODY.decode()}", text(third)
    assert len(events(tmp_path, "approval_asked")) == 1


@pytest.mark.parametrize("network", ["allowlist", "open"])
async def test_control_allowlist_refuses_without_asking_and_open_reaches_the_host(
    named_site: tuple[str, int, list[str]], tmp_path: Path, network: str
) -> None:
    """The same fetch without ask: an allowlist without the name gets nothing and nobody is asked;
    the open network reaches the site."""
    name, port, _ = named_site
    allow = [f"listed.invalid:{port}", f"127.0.0.1:{port}"] if network == "allowlist" else []
    async with serving(tmp_path, network, allow) as (client, _):
        before = len(Handler.hits)
        result = await client.call_tool("r__fetch", {"url": f"http://{name}:{port}/control"})
    if network == "open":
        assert text(result) == f"200 {BODY.decode()}", text(result)
        assert Handler.hits[before:] == ["/control"]
    else:
        assert result.is_error and "FAILED" in text(result), text(result)
        assert Handler.hits[before:] == []
        assert events(tmp_path, "approval_asked") == []


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_a_connection_during_a_call_is_asked_through_the_clients_form(
    named_site: tuple[str, int, list[str]], tmp_path: Path, mode: str
) -> None:
    name, port, _ = named_site
    forms: list[str] = []

    async def human(ctx: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        forms.append(params.message)
        return types.ElicitResult(action="accept", content={"decision": "allow_once"})

    write_config(tmp_path, {"r": reacher("ask", [f"listed.invalid:{port}", f"127.0.0.1:{port}"])})
    async with connected(
        build(tmp_path / "cellblock.yaml", tmp_path / "state"), mode=mode, elicitation_callback=human
    ) as client:
        result = await client.call_tool("r__fetch", {"url": f"http://{name}:{port}/form"})
    assert text(result) == f"200 {BODY.decode()}", text(result)
    assert len(forms) == 1 and f'egress "{name}:{port}"' in forms[0] and "server 'r'" in forms[0]
    assert [e["via"] for e in events(tmp_path, "approval_granted")] == ["elicitation"]


async def test_wrap_gives_a_fetch_server_ask_and_its_first_connection_is_asked_about(tmp_path: Path) -> None:
    """As a user meets it: `cellblock wrap` of a client config whose fetch server it cannot give
    hosts to, `approve --all`, then the client's call: the fetch's connection waits for the form.
    The test host is this machine's loopback, which a yes alone never opens (a name may resolve
    there): the refusal names the command, and that command opens it."""
    argv = peers.fetch_server("--ignore-robots-txt", "--allow-private-ips")
    home, run = tmp_path / "home", tmp_path / "run"
    client_config = home / ".config" / "Claude" / "claude_desktop_config.json"
    client_config.parent.mkdir(parents=True)
    run.mkdir(mode=0o700)
    client_config.write_text(json.dumps({"mcpServers": {"fetch": {"command": argv[0], "args": argv[1:]}}}))
    config = tmp_path / "cellblock.yaml"
    env = {
        "HOME": str(home),
        "USER": os.environ.get("USER", "root"),
        "PATH": "/usr/bin:/bin",
        "CELLBLOCK_STATE_DIR": str(tmp_path / "state"),
        "XDG_RUNTIME_DIR": str(run),
    }

    def cellblock(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "cellblock.gateway.cli.main", *args]
        return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120, check=False)

    wrapped = cellblock("wrap", str(client_config), "--no-install", "--config", str(config))
    assert wrapped.returncode == 0, wrapped.stderr
    assert yaml.safe_load(config.read_text())["servers"]["fetch"]["jail"]["network"] == "ask"
    assert "network: ask: mcp-server-fetch fetches whatever URL it is given" in config.read_text()
    met = cellblock("approve", "--all", "--config", str(config))
    assert met.returncode == 0, met.stderr
    forms: list[str] = []

    async def human(ctx: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        forms.append(params.message)
        return types.ElicitResult(action="accept", content={"decision": "allow_once"})

    # the site where the proxy connects: the first address localhost resolves to (::1 on some machines)
    family, *_, (first_address, *_) = socket.getaddrinfo("localhost", 0, type=socket.SOCK_STREAM)[0]

    class Site(ThreadingHTTPServer):
        address_family = family

    httpd = Site((first_address, 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    port = httpd.server_address[1]
    site = f"http://localhost:{port}"
    found = socket.getaddrinfo("localhost", port, type=socket.SOCK_STREAM)
    addresses = list(dict.fromkeys(str(info[4][0]) for info in found))
    try:
        async with gateway(config, tmp_path / "state", env=env, elicitation_callback=human) as client:
            before = len(Handler.hits)
            first = await client.call_tool("fetch__fetch", {"url": f"{site}/wrapped", "raw": True})
            assert first.is_error and "403" in text(first), text(first)  # the fetch server shows no body
            (refused,) = events(tmp_path, "egress")
            assert refused["asked"] == "once" and f"resolves to {addresses[0]}" in refused["reason"]
            # this machine: why, and no command the model would relay as the fix
            assert "this machine (loopback)" in refused["reason"] and "allow-host" not in refused["reason"]
            assert Handler.hits[before:] == []
            for address in addresses:  # the user opens each address the name leads to, knowing it is loopback
                entry = f"[{address}]:{port}" if ":" in address else f"{address}:{port}"
                opened = await anyio.to_thread.run_sync(
                    lambda entry=entry: cellblock("allow-host", "fetch", entry, "--loopback", "--config", str(config))
                )
                assert opened.returncode == 0, opened.stderr
            second = await client.call_tool("fetch__fetch", {"url": f"{site}/wrapped", "raw": True})
            assert not second.is_error and BODY.decode() in text(second), text(second)
    finally:
        httpd.shutdown()
    # each call's own approval, and one question about the connection: the retry was allowed "once"
    assert sum('egress "localhost:' in form for form in forms) == 1
