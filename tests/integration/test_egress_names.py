"""`network: allowlist` for programs that ignore proxy variables: names resolved inside the jail.

A real Node 20 server (`tests/servers/reacher.cjs`, TypeScript SDK 1.x) behind the real `cellblock
serve` reaches a listed host by name with `fetch` and with a raw socket, neither of which looks at
the proxy variables: the relay in its jail answers the name's DNS with a loopback address of its
own and carries the connection to the egress proxy as `CONNECT name:port`. The listed name is the
machine's own host name, which the host resolves to one of its addresses (not through the jail,
which has its own localhost-only /etc/hosts); the test site listens there.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import mcp.types as types
import pytest
from mcp import Client

from cellblock.sandbox import egress
from tests import peers
from tests.integration.conftest import gateway, own_address, write_config
from tests.integration.test_egress import BODY, Handler, run_in_allowlist_jail
from tests.integration.test_umask import place, serve

pytestmark = [pytest.mark.anyio, pytest.mark.jail]
__all__ = ["place"]  # a fixture: a directory nobody can enter, with its home

NODE = "/usr/bin/node"
REACHER = Path(__file__).resolve().parents[1] / "servers" / "reacher.cjs"


class Site(ThreadingHTTPServer):
    address_family = socket.AF_INET


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def named_site() -> Iterator[tuple[str, int, list[str]]]:
    """(a name the host resolves to an address of its own, the site's port there, allow_hosts for it)."""
    name = socket.gethostname()
    try:
        addresses = list(dict.fromkeys(str(a[4][0]) for a in socket.getaddrinfo(name, 80, type=socket.SOCK_STREAM)))
    except OSError as exc:
        pytest.skip(f"the host name {name!r} does not resolve here: {exc}")
    if ":" in addresses[0]:
        pytest.skip(f"the host name {name!r} resolves to IPv6 first ({addresses[0]})")
    httpd = Site((addresses[0], 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    port = httpd.server_address[1]
    # the name, and its addresses by IP entries: loopback or private ones are refused unless listed
    allow = [f"{name}:{port}", *(f"[{a}]:{port}" if ":" in a else f"{a}:{port}" for a in addresses)]
    yield name, port, allow
    httpd.shutdown()


def node_20() -> str:
    if not Path(NODE).exists():
        pytest.skip("needs the system Node")
    version = subprocess.run([NODE, "--version"], capture_output=True, text=True, check=False).stdout
    if not version.startswith(("v18.", "v20.", "v22.")):
        pytest.skip(f"the system Node is {version.strip()}, which may honour the proxy variables")
    return NODE


def text(result: types.CallToolResult) -> str:
    return " ".join(c.text for c in result.content if isinstance(c, types.TextContent))


def reacher(allow: list[str]) -> dict[str, Any]:
    modules = str(peers.NODE_MODULES)
    return {
        "command": node_20(),
        "args": [str(REACHER)],
        "env": {"NODE_PATH": modules},
        "jail": {"network": "allowlist", "allow_hosts": allow, "read_only": [str(REACHER.parent), modules]},
    }


@pytest.mark.peers
async def test_node_20_reaches_a_listed_name_by_fetch_and_raw_socket_and_nothing_else(
    named_site: tuple[str, int, list[str]], tmp_path: Path
) -> None:
    name, port, allow = named_site
    state = tmp_path / "state"
    # and a wildcard entry with no port (80 and 443), whose names the host cannot resolve
    async with gateway(write_config(tmp_path, {"r": reacher([*allow, "*.svc.invalid"])}), state) as client:
        fetched = await client.call_tool("r__fetch", {"url": f"http://{name}:{port}/node20"})
        assert not fetched.is_error, text(fetched)
        assert text(fetched) == f"200 {BODY.decode()}"
        raw = await client.call_tool("r__socket", {"host": name, "port": port})
        assert not raw.is_error and BODY.decode() in text(raw), text(raw)
        # port 80 in the jail, the proxy's refusal passed on as it is
        wildcard = await client.call_tool("r__fetch", {"url": "http://a.svc.invalid/"})
        assert text(wildcard).startswith("502 cellblock: egress to a.svc.invalid:80 refused"), text(wildcard)
        hits = len(Handler.hits)
        # a name not listed does not resolve; the jail's localhost is its own; an address on a port
        # no entry names reaches nothing
        for url in ("http://example.com/", f"http://localhost:{port}/", "http://192.0.2.1:9/"):
            refused = await client.call_tool("r__fetch", {"url": url})
            assert refused.is_error and "FAILED" in text(refused), text(refused)
        # an address not listed, on a port an entry names, goes to the proxy, which refuses it
        address = await client.call_tool("r__fetch", {"url": f"http://192.0.2.1:{port}/"})
        assert text(address).startswith(f"403 cellblock: egress to 192.0.2.1:{port} refused"), text(address)
        refused = await client.call_tool("r__socket", {"host": "example.org", "port": 443})
        assert refused.is_error and "ENOTFOUND" in text(refused), text(refused)
        assert len(Handler.hits) == hits, "a refused request reached the site"
    events = [json.loads(line) for line in (state / "audit.jsonl").read_text().splitlines()]
    egress_events = [(e["host"], e["port"], e["decision"]) for e in events if e["event"] == "egress"]
    assert egress_events == [
        (name, port, "allow"),
        (name, port, "allow"),
        ("a.svc.invalid", 80, "deny"),
        ("example.com", 53, "deny"),
        ("192.0.2.1", port, "deny"),
        ("example.org", 53, "deny"),
    ]


@pytest.mark.parametrize("client", ["python-socket", "curl-noproxy"])
async def test_a_client_that_ignores_proxy_variables_reaches_a_listed_name(
    named_site: tuple[str, int, list[str]], tmp_path: Path, client: str
) -> None:
    name, port, allow = named_site
    code = (
        "import socket\n"
        f"s = socket.create_connection(({name!r}, {port}), timeout=10)\n"
        f"s.sendall(b'GET /py HTTP/1.0\\r\\nHost: {name}\\r\\n\\r\\n')\n"
        "print(b''.join(iter(lambda: s.recv(4096), b'')).decode())\n"  # to the end: one recv may be a part
    )
    argv = [sys.executable, "-c", code]
    if client == "curl-noproxy":
        curl = shutil.which("curl", path="/usr/bin")  # the jail shows /usr
        if curl is None:
            pytest.skip("needs curl in /usr/bin")
        argv = [curl, "-sS", "--noproxy", "*", "--max-time", "10", f"http://{name}:{port}/curl"]
    status, output, decisions = await run_in_allowlist_jail(tmp_path, argv, allow)
    assert status == 0, output
    assert BODY.decode() in output
    assert [(d.host, d.port, d.allowed) for d in decisions] == [(name, port, True)]


@pytest.fixture(scope="module")
def address_site() -> Iterator[tuple[str, int]]:
    """(an address of this machine beyond loopback, the site's port there)."""
    address = own_address()
    httpd = Site((address, 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield address, httpd.server_address[1]
    httpd.shutdown()


async def test_a_raw_socket_to_a_listed_address_is_carried_through_the_proxy(
    address_site: tuple[str, int], tmp_path: Path
) -> None:
    address, port = address_site
    code = (
        "import socket\n"
        f"s = socket.create_connection(({address!r}, {port}), timeout=10)\n"
        "s.sendall(b'GET /address HTTP/1.0\\r\\n\\r\\n')\n"
        "print(b''.join(iter(lambda: s.recv(4096), b'')).decode())\n"  # to the end: one recv may be a part
    )
    status, output, decisions = await run_in_allowlist_jail(
        tmp_path, [sys.executable, "-c", code], [f"{address}:{port}"]
    )
    assert status == 0, output
    assert BODY.decode() in output
    assert [(d.host, d.port, d.allowed) for d in decisions] == [(address, port, True)]


@pytest.mark.parametrize("relayed", [True, False], ids=["with-names", "proxy-variables-only"])
async def test_control_without_the_names_node_20_fetch_fails_closed(
    named_site: tuple[str, int, list[str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, relayed: bool
) -> None:
    """The hole was real: the same Node 20 fetch of the same listed name, with the proxy variables
    but without the relay's names (no DNS, no name ports, no namespace for them), gets nothing."""
    name, port, allow = named_site
    if not relayed:
        monkeypatch.setattr(egress, "relay_names", lambda _hosts: ([], []))
        monkeypatch.setattr("cellblock.gateway.downstream.launch.relay_names", lambda _hosts: ([], []))
    script = f"fetch('http://{name}:{port}/control').then(r => r.text()).then(t => console.log('GOT', t))"
    status, output, decisions = await run_in_allowlist_jail(tmp_path, [node_20(), "-e", script], allow)
    if relayed:
        assert status == 0 and f"GOT {BODY.decode()}" in output, output
        assert [d.allowed for d in decisions] == [True]
    else:
        assert status != 0 and "GOT" not in output, output
        assert decisions == []


@pytest.mark.peers
async def test_a_gateway_run_by_an_ordinary_user_answers_the_names_too(
    named_site: tuple[str, int, list[str]], place: Path
) -> None:
    """Ports 53 and 80 need no privilege in the jail's namespace: the same fetch, from a `cellblock
    serve` run as nobody."""
    name, port, allow = named_site
    config = write_config(place, {"r": reacher(allow)})
    async with Client(serve("022", place / "home", config), mode="legacy") as client:
        fetched = await client.call_tool("r__fetch", {"url": f"http://{name}:{port}/nobody"})
        assert not fetched.is_error, text(fetched)
        assert text(fetched) == f"200 {BODY.decode()}"
        refused = await client.call_tool("r__fetch", {"url": "http://example.com/"})
        assert refused.is_error, text(refused)
    audits = list((place / "home").rglob("audit.jsonl"))
    events = [json.loads(line) for path in audits for line in path.read_text().splitlines()]
    assert [(e["host"], e["decision"]) for e in events if e["event"] == "egress"] == [
        (name, "allow"),
        ("example.com", "deny"),
    ]
