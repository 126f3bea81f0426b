"""`network: allowlist` end to end: a real fetch server in a jail, the relay, the gateway's proxy.

The destination is a small HTTP server on the host's loopback. A bwrap jail has its own network
namespace, so the only way there is the relay -> Unix socket -> proxy path; a Landlock jail shares
the host's, and the gateway makes each of its connections, to the proxy alone (`sandbox/connects.py`).
On both backends the proxy lets through only what `allow_hosts` names.
"""

from __future__ import annotations

import json
import shutil
import socket
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import anyio
import mcp.types as types
import pytest

from cellblock.gateway.config.loading import parse_config
from cellblock.gateway.config.model import LocalServer
from cellblock.gateway.downstream.launch import launch_plan
from cellblock.policy.hosts import parse_rule
from cellblock.sandbox.connects import gate_missing
from cellblock.sandbox.egress import Decision, EgressProxy
from cellblock.sandbox.landlock import landlock_abi
from cellblock.sandbox.spawn import spawn_args
from tests import peers
from tests.integration.conftest import NO_USERNS, gateway, write_config

pytestmark = [pytest.mark.anyio, pytest.mark.jail]

BODY = b"hello from the allowed host"


class Handler(BaseHTTPRequestHandler):
    hits: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        Handler.hits.append(self.path)
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(BODY)))
        self.end_headers()
        self.wfile.write(BODY)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def site() -> Iterator[int]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd.server_address[1]
    httpd.shutdown()


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(params=["bwrap", "landlock"])
def backend(request: pytest.FixtureRequest) -> str:
    """The jail's backend: each test runs on both."""
    if request.param == "landlock" and (landlock_abi() < 1 or gate_missing() or shutil.which("unshare") is None):
        pytest.skip(f"no Landlock jail with a gate here: {gate_missing() or 'no Landlock, or no unshare'}")
    return str(request.param)


def text(result: types.CallToolResult) -> str:
    return " ".join(c.text for c in result.content if isinstance(c, types.TextContent))


@pytest.mark.peers
async def test_a_real_fetch_server_reaches_only_the_listed_host(site: int, tmp_path: Path, backend: str) -> None:
    """With `jail.backend: auto`; for Landlock, the gateway runs as on a machine that refuses user
    namespaces (`NO_USERNS`), where `auto` chooses it."""
    argv = peers.fetch_server("--ignore-robots-txt", "--allow-private-ips")
    server = {
        "command": argv[0],
        "args": argv[1:],
        "jail": {"network": "allowlist", "allow_hosts": [f"127.0.0.1:{site}"]},
    }
    state = tmp_path / "state"
    prefix = NO_USERNS if backend == "landlock" else ()
    async with gateway(write_config(tmp_path, {"fetch": server}), state, prefix=prefix) as client:
        allowed = await client.call_tool("fetch__fetch", {"url": f"http://127.0.0.1:{site}/ok", "raw": True})
        assert not allowed.is_error, text(allowed)
        assert BODY.decode() in text(allowed)
        hits = len(Handler.hits)
        # another name for the same place, and a host not listed at all
        for url in (f"http://localhost:{site}/other-name", "http://example.com/"):
            refused = await client.call_tool("fetch__fetch", {"url": url, "raw": True})
            assert refused.is_error and "403" in text(refused)
        assert len(Handler.hits) == hits, "a refused request reached the destination"
    events = [json.loads(line) for line in (state / "audit.jsonl").read_text().splitlines()]
    egress = [(e["host"], e["decision"]) for e in events if e["event"] == "egress"]
    assert egress == [("127.0.0.1", "allow"), ("localhost", "deny"), ("example.com", "deny")]
    assert {e["backend"] for e in events if e["event"] == "server_ready"} == {backend}


async def run_in_allowlist_jail(
    tmp_path: Path, argv: list[str], allow: list[str], backend: str = "bwrap"
) -> tuple[int, str, list[Decision]]:
    """Run `argv` as a server would run: jailed on `backend`, allowlist network, behind a live egress proxy."""
    jail = {"network": "allowlist", "allow_hosts": allow, "backend": backend}
    config = parse_config(
        json.dumps({"version": 1, "servers": {"t": {"command": argv[0], "args": argv[1:], "jail": jail}}})
    )
    decisions: list[Decision] = []
    sock = str(tmp_path / "egress.sock")
    proxy = EgressProxy("t", [parse_rule(a) for a in allow], sock, decisions.append)
    async with anyio.create_task_group() as tg:
        await tg.start(proxy.serve)
        local = config.servers["t"]
        assert isinstance(local, LocalServer)
        plan = launch_plan("t", local, sock, tmp_path / "private")
        with spawn_args(plan) as spawn:
            try:
                done = await anyio.run_process(list(spawn.argv), check=False, pass_fds=spawn.pass_fds)
            finally:
                if spawn.gate is not None:
                    spawn.gate.close()
        tg.cancel_scope.cancel()
    return done.returncode, done.stdout.decode() + done.stderr.decode(), decisions


async def test_programs_that_honour_proxy_variables_get_through_the_relay(
    site: int, tmp_path: Path, backend: str
) -> None:
    code = f"import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:{site}/py', timeout=10).read())"
    status, output, decisions = await run_in_allowlist_jail(
        tmp_path, [sys.executable, "-c", code], [f"127.0.0.1:{site}"], backend
    )
    assert status == 0, output
    assert BODY.decode() in output
    assert [d.allowed for d in decisions] == [True]


async def test_a_direct_connection_from_an_allowlist_jail_reaches_nothing(
    site: int, tmp_path: Path, backend: str
) -> None:
    code = f"import socket; socket.create_connection(('127.0.0.1', {site}), timeout=3); print('CONNECTED')"
    status, output, decisions = await run_in_allowlist_jail(
        tmp_path, [sys.executable, "-c", code], [f"127.0.0.1:{site}"], backend
    )
    assert status != 0 and "CONNECTED" not in output
    assert decisions == []


async def test_node_24_fetch_uses_the_proxy_when_the_jail_asks_it_to(site: int, tmp_path: Path, backend: str) -> None:
    node = peers.node()
    script = f"fetch('http://127.0.0.1:{site}/node').then(r => r.text()).then(t => console.log(t))"
    status, output, decisions = await run_in_allowlist_jail(
        tmp_path, [node, "-e", script], [f"127.0.0.1:{site}"], backend
    )
    assert status == 0, output
    assert BODY.decode() in output
    assert [d.allowed for d in decisions] == [True]


@pytest.mark.skipif(not Path("/usr/bin/node").exists(), reason="needs a system Node 20")
async def test_node_20_fetch_ignores_the_proxy_and_fails_closed(site: int, tmp_path: Path, backend: str) -> None:
    version = (await anyio.run_process(["/usr/bin/node", "--version"])).stdout.decode()
    if not version.startswith("v20."):
        pytest.skip(f"system node is {version.strip()}")
    script = f"fetch('http://127.0.0.1:{site}/node20').then(r => r.text()).then(t => console.log('GOT', t))"
    status, output, _ = await run_in_allowlist_jail(
        tmp_path, ["/usr/bin/node", "-e", script], [f"127.0.0.1:{site}"], backend
    )
    assert "GOT" not in output and status != 0


def test_the_host_can_reach_the_site_directly(site: int) -> None:
    """The control: the destination is up, so a refusal above is the jail's doing."""
    with socket.create_connection(("127.0.0.1", site), timeout=3) as conn:
        conn.sendall(b"GET /control HTTP/1.0\r\n\r\n")
        assert BODY in conn.recv(4096) + conn.recv(4096)
