"""A new user's first day, end to end, with no hand edit: the Claude Desktop config their servers'
READMEs led to, `cellblock wrap`, `cellblock approve --all` (as the README says for a first start),
and the wrapped entry started as Claude Desktop starts it, with HOME, USER and PATH alone; then one
real call to each server through the SDK's own client over stdio, each judged by its effect.

The servers are the ones the other real-process tests meet one at a time, together:
- context7 (npm, `--api-key KEY` on its command line: an argument secret), on Node < 24 as most
  people have it, pointed at its API by `CONTEXT7_API_URL` as at a self-hosted instance, which
  wrap turns into its allowlist;
- mcp-server-sqlite (PyPI, on the Python SDK 1.x it needs, from a virtualenv of the user's): an
  old low-level server that declares resources and has no templates, and a `--db-path` that does
  not exist yet;
- a server whose install script downloads its browser, as desktop-commander's puppeteer does, from
  the mirror its entry names in `PUPPETEER_DOWNLOAD_BASE_URL`; it comes from the company's npm
  mirror (on loopback here), which serves the other npm packages from the public registry.
The API and the download host are a test site on an address of this machine beyond loopback (a
jail's loopback is its own): the kind of host a jail's relay also carries for a program that ignores
the proxy variables.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import sqlite3
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import keyring
import keyring.errors
import mcp.types as types
import pytest
import yaml
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.shared.exceptions import MCPError

from cellblock.sandbox.connects import gate_missing
from cellblock.sandbox.installer import REGISTRY_ENV
from cellblock.sandbox.landlock import landlock_abi
from tests import peers
from tests.integration.conftest import NO_USERNS, bus_at_the_standard_path, own_address, run_as_user
from tests.integration.test_install_hosts import BROWSER, FETCH
from tests.registry import npm_registry

pytestmark = [pytest.mark.anyio, pytest.mark.peers, pytest.mark.jail, pytest.mark.slow]

CONTEXT7 = "@upstash/context7-mcp@4.1.1"
TIME = "mcp-server-time==2026.10.19"
BROWSING = "cb-browsing-server@1.0.0"  # a stand-in for desktop-commander, from the mirror
# what the Python SDK 1.x logs about a request it cannot validate (the start of its dump)
DUMP = "validation error"
# what the gateway's log says when a server is refused, restarted or given up on
TROUBLE = ("restarting in", "failed:", "is restarted", "protocol error", "Traceback")

# The stand-in's program: a stdio MCP server with no dependency, whose one tool says what its
# install downloaded (the file its postinstall wrote beside it).
BROWSING_SERVER = """#!/usr/bin/env node
const fs = require("fs"), path = require("path"), readline = require("readline");
const send = (message) => process.stdout.write(JSON.stringify({ jsonrpc: "2.0", ...message }) + "\\n");
const tools = [{ name: "browser", description: "The browser build its install downloaded",
  inputSchema: { type: "object", properties: {} } }];
readline.createInterface({ input: process.stdin }).on("line", (line) => {
  const m = JSON.parse(line);
  if (m.id === undefined) return;
  const ok = (result) => send({ id: m.id, result });
  if (m.method === "initialize") {
    const serverInfo = { name: "browsing", version: "1.0.0" };
    ok({ protocolVersion: "2025-06-18", capabilities: { tools: {} }, serverInfo });
  } else if (m.method === "tools/list") ok({ tools });
  else if (m.method === "tools/call") {
    const text = fs.readFileSync(path.join(__dirname, "browser.bin"), "utf8");
    ok({ content: [{ type: "text", text }] });
  } else if (m.method === "ping") ok({});
  else send({ id: m.id, error: { code: -32601, message: "Method not found" } });
});
"""


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


class Site:
    """The test host: context7's API and the browser download, on an address of this machine beyond
    loopback; each request kept as (path, Authorization header)."""

    def __init__(self, address: str) -> None:
        self.seen: list[tuple[str, str]] = []
        site = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                site.seen.append((self.path, self.headers.get("Authorization") or ""))
                path = urlsplit(self.path).path
                if path == "/context7/v2/libs/search":
                    found = {"id": "/cellblock/docs", "title": "Cellblock", "description": "jails MCP servers"}
                    self.answer(json.dumps({"results": [found]}).encode(), "application/json")
                elif path == "/chrome/browser.zip":
                    self.answer(BROWSER, "application/zip")
                else:
                    self.send_error(404)

            def answer(self, body: bytes, kind: str) -> None:
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        class Server(ThreadingHTTPServer):
            address_family = socket.AF_INET

        self.server = Server((address, 0), Handler)
        self.base = f"http://{address}:{self.server.server_address[1]}"


@pytest.fixture(scope="module")
def site() -> Iterator[Site]:
    served = Site(own_address())
    thread = threading.Thread(target=served.server.serve_forever, daemon=True)
    thread.start()
    yield served
    served.server.shutdown()
    served.server.server_close()


@pytest.fixture(scope="module")
def mirror() -> Iterator[str]:
    """The company's npm mirror: the stand-in, and every other package from the public registry
    (or the one this machine's environment names)."""
    manifest = {
        "name": "cb-browsing-server",
        "version": "1.0.0",
        "bin": {"cb-browsing-server": "index.js"},
        # as puppeteer's postinstall, from where the variable says
        "scripts": {"postinstall": 'python3 fetch.py "$PUPPETEER_DOWNLOAD_BASE_URL/browser.zip"'},
    }
    files = {"package.json": json.dumps(manifest), "index.js": BROWSING_SERVER, "fetch.py": FETCH}
    upstream = next(
        (os.environ[v] for v in ("npm_config_registry", "NPM_CONFIG_REGISTRY") if os.environ.get(v)),
        "https://registry.npmjs.org/",
    )
    with npm_registry({"cb-browsing-server": files}, upstream=upstream) as url:
        yield url


async def allow_once(ctx: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
    return types.ElicitResult(action="accept", content={"decision": "allow_once"})


def _text(result: types.CallToolResult) -> str:
    return "".join(getattr(c, "text", "") for c in result.content)


def _environment_of_gateway(config: Path) -> dict[str, str]:
    """The environment of the one running `cellblock serve --config CONFIG`."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0") if entry.name.isdigit() else []
            if b"serve" in argv and str(config).encode() in argv:
                found.append((entry / "environ").read_bytes())
        except OSError:
            continue  # a process that ended meanwhile
    assert len(found) == 1, f"{len(found)} gateways run {config}"
    pairs = (item.partition(b"=") for item in found[0].split(b"\0") if item)
    return {name.decode(): value.decode() for name, _, value in pairs}


async def test_mcp_server_sqlite_on_the_python_sdk_1_declares_resources_it_has_no_templates_for(
    tmp_path: Path,
) -> None:
    """The premise: talked to directly, it is an old server, of the kind the gateway once refused."""
    argv = peers.old_sqlite_server("--db-path", str(tmp_path / "direct.db"))
    with (tmp_path / "direct.log").open("w") as errlog:
        async with Client(stdio_client(StdioServerParameters(command=argv[0], args=argv[1:]), errlog=errlog)) as c:
            assert c.server_capabilities.resources is not None
            with pytest.raises(MCPError, match="Method not found"):
                await c.list_resource_templates()


@pytest.mark.skipif(os.getuid() != 0, reason="placing a bus at /run/user/<uid> needs a mount namespace (root)")
@pytest.mark.parametrize("backend", ["bwrap", "landlock"])
async def test_a_first_day_from_wrap_to_a_call_to_each_server_with_no_hand_edit(
    tmp_path: Path,
    keyring_env: dict[str, str],
    site: Site,
    mirror: str,
    monkeypatch: pytest.MonkeyPatch,
    backend: str,
) -> None:
    """On a machine where bwrap builds its jails, and on one that refuses namespaces, where `auto`
    chooses Landlock (every command under `NO_USERNS`, as the user's whole session would be)."""
    if backend == "landlock" and (landlock_abi() < 4 or gate_missing() is not None):
        pytest.skip("needs Landlock ABI 4 (Linux 6.7) and a gate (seccomp user notification, pidfd_getfd)")
    prefix = NO_USERNS if backend == "landlock" else ()
    del site.seen[:]  # the site is the module's: what an earlier case asked of it is not this one's
    home = tmp_path / "home"
    home.mkdir()
    database = home / "test.db"  # not there yet: where the server is to create it
    key = "ctx7sk-" + os.urandom(12).hex()
    sqlite_server = peers.old_sqlite_server("--db-path", str(database))
    uvx = peers.uv_standalone(home / ".local" / "bin")  # as uv's installer puts it
    client_config = home / ".config" / "Claude" / "claude_desktop_config.json"
    client_config.parent.mkdir(parents=True)
    servers = {
        "context7": {
            "command": "npx",
            "args": ["-y", CONTEXT7, "--api-key", key],
            "env": {"CONTEXT7_API_URL": f"{site.base}/context7"},
        },
        "sqlite": {"command": sqlite_server[0], "args": sqlite_server[1:]},
        "time": {"command": "uvx", "args": [TIME, "--local-timezone", "UTC"]},
        "browsing": {
            "command": "npx",
            "args": ["-y", BROWSING],
            "env": {"PUPPETEER_DOWNLOAD_BASE_URL": f"{site.base}/chrome"},
        },
    }
    client_config.write_text(json.dumps({"mcpServers": servers}, indent=2))

    npx = shutil.which("npx", path="/usr/local/bin:/usr/bin:/bin")
    if npx is None:
        pytest.skip("needs Node and npm installed on the system (npx on /usr/bin)")
    path = f"{uvx.parent}:{os.path.dirname(npx)}:/usr/local/bin:/usr/bin:/bin"  # Node as the user has it: here 20
    client = {"HOME": str(home), "USER": "root", "PATH": path}  # what Claude Desktop gives
    registry = {k: os.environ[k] for k in REGISTRY_ENV if k in os.environ}
    shell = {**client, **keyring_env, **registry, "npm_config_registry": mirror}  # the user's terminal
    try:
        wrapped = run_as_user(shell, "wrap", str(client_config), prefix=prefix)
        assert wrapped.returncode == 0, wrapped.stderr
        for package in (CONTEXT7, BROWSING, TIME):
            assert f"cellblock: installed {package} for '" in wrapped.stderr, wrapped.stderr
        assert keyring.get_password("cellblock", "context7-api-key") == key
        assert key not in client_config.read_text()
        written = yaml.safe_load((home / ".config" / "cellblock" / "cellblock.yaml").read_text())["servers"]
        address = urlsplit(site.base).netloc
        assert written["context7"]["jail"]["allow_hosts"] == [address]  # from CONTEXT7_API_URL, no edit
        assert written["browsing"]["install"]["hosts"] == [address]  # from PUPPETEER_DOWNLOAD_BASE_URL
        installs = home / ".local" / "share" / "cellblock" / "installs"
        tree = Path(json.loads((installs / "browsing.json").read_text())["tree"])
        assert (tree / "node_modules" / "cb-browsing-server" / "browser.bin").read_bytes() == BROWSER
        downloads = [p for p, _ in site.seen if p.startswith("/chrome/")]
        assert downloads == ["/chrome/browser.zip"], site.seen  # by the stand-in's install, from its jail

        # the README's first start: each server met, what it offers shown, then approved
        diffed = run_as_user(shell, "diff", "--all", prefix=prefix)
        assert diffed.returncode == 1 and "could not meet" not in diffed.stderr, diffed.stdout + diffed.stderr
        approved = run_as_user(shell, "approve", "--all", prefix=prefix)
        assert approved.returncode == 0, approved.stderr
        for name in servers:
            assert f"first contact with '{name}'" in diffed.stdout + diffed.stderr, diffed.stdout + diffed.stderr
            assert f"approved the catalog of '{name}'" in approved.stderr, approved.stderr

        entry = json.loads(client_config.read_text())["mcpServers"]["cellblock"]
        config = Path(entry["args"][entry["args"].index("--config") + 1])
        bus_dir = str(Path(keyring_env["DBUS_SESSION_BUS_ADDRESS"].removeprefix("unix:path=").split(",")[0]).parent)
        # the user namespace first: the bus's prefix ends by taking out what a shell adds (PWD)
        started = [*prefix, *bus_at_the_standard_path(bus_dir), entry["command"], *entry["args"]]
        params = StdioServerParameters(command=started[0], args=started[1:], env=client)
        # Claude Desktop passes these three alone; the SDK's client would add SHELL, TERM and LOGNAME
        monkeypatch.setattr("mcp.client.stdio.get_default_environment", dict)
        log = tmp_path / "gateway.log"
        with log.open("w") as errlog:
            async with Client(stdio_client(params, errlog=errlog), elicitation_callback=allow_once, cache=None) as c:
                assert set(_environment_of_gateway(config)) == {"HOME", "USER", "PATH"}

                async def call(tool: str, arguments: dict[str, Any]) -> str:
                    result = await c.call_tool(tool, arguments)
                    assert not result.is_error, (tool, _text(result))
                    return _text(result)

                found = await call("context7__resolve-library-id", {"query": "jails", "libraryName": "cellblock"})
                assert "/cellblock/docs" in found and key not in found
                await call("sqlite__create_table", {"query": "CREATE TABLE kept (note TEXT)"})
                await call("sqlite__write_query", {"query": "INSERT INTO kept VALUES ('from the first day')"})
                # its resources are offered, though it lists no templates of them
                offered = [str(r.uri) for r in (await c.list_resources()).resources]
                assert "cellblock://sqlite/memo://insights" in offered, offered
                assert (await c.list_resource_templates()).resource_templates == []
                assert (await call("browsing__browser", {})).encode() == BROWSER
                assert '"timezone": "UTC"' in await call("time__get_current_time", {"timezone": "UTC"})

        # the API got the real key, from the keyring, through the jail's way out
        assert [auth for p, auth in site.seen if p.startswith("/context7/")] == [f"Bearer {key}"]
        # where the user asked, after the server is gone
        with sqlite3.connect(database) as db:
            assert db.execute("SELECT note FROM kept").fetchall() == [("from the first day",)]
        said = log.read_text()
        assert not [line for line in said.splitlines() if any(word in line for word in TROUBLE)], said
        assert "server 'sqlite' did not list its resource templates (Method not found" in said
        met = (home / ".local" / "state" / "cellblock" / "meeting.log").read_text()
        assert DUMP not in said + met and "Failed to validate request" not in said + met
        audit = (home / ".local" / "state" / "cellblock" / "audit.jsonl").read_text().splitlines()
        egress = [(e["server"], e["host"], e["decision"]) for e in map(json.loads, audit) if e["event"] == "egress"]
        assert egress == [("context7", address.partition(":")[0], "allow")], egress
        ready = {e["server"]: e.get("backend") for e in map(json.loads, audit) if e["event"] == "server_ready"}
        assert ready == dict.fromkeys(servers, backend), ready  # each in the jail this machine can build

        # the next launch starts the server again (lazily, on its call): its data is still there
        with log.open("a") as errlog:
            async with Client(stdio_client(params, errlog=errlog), elicitation_callback=allow_once, cache=None) as c:
                again = await c.call_tool("sqlite__read_query", {"query": "SELECT note FROM kept"})
                assert not again.is_error and "from the first day" in _text(again), _text(again)
        holding = [p for p in home.rglob("*") if p.is_file() and key.encode() in p.read_bytes()]
        assert holding == [], holding  # configs, backups, state, audit, the installs
    finally:
        with contextlib.suppress(keyring.errors.PasswordDeleteError):
            keyring.delete_password("cellblock", "context7-api-key")
