"""A key a server takes on its command line, through the real `cellblock wrap` and `serve`.

A Claude Desktop config starts two argkey servers (tests/servers/argkey.py, which takes
`--api-key` as context7 does) with their keys inline, one `--api-key KEY`, one `--api-key=KEY`.
After `wrap` the keys are in the keyring only and the config names them (`${secrets.API_KEY}`);
started by the gateway, each server is given its real key (it says so as a boolean, from a digest),
and when it echoes its command line the key is redacted from the client, the log and the audit,
`show` and `ps` never hold it, and a call carrying one server's key to the other is refused.
The control: the same server with the key as a plain argument in cellblock.yaml, no reference,
leaks it through the very same channels. And the real context7 (npm @upstash/context7-mcp),
wrapped from its README's `--api-key KEY`, sends the key from the keyring to its API (a local
stand-in at $CONTEXT7_API_URL).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import keyring
import mcp.types as types
import pytest
import yaml

from tests import peers
from tests.integration.conftest import cli, free_port, gateway, write_config

pytestmark = [pytest.mark.anyio, pytest.mark.jail]
ARGKEY = Path(__file__).resolve().parents[1] / "servers" / "argkey.py"


async def allow_once(ctx: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
    return types.ElicitResult(action="accept", content={"decision": "allow_once"})


def text(result: Any) -> str:
    return "".join(getattr(c, "text", "") for c in result.content)


def digest(key: str) -> str:
    return "sha256:" + hashlib.sha256(key.encode()).hexdigest()


def argkey(*args: str, key: str) -> dict[str, Any]:
    """A client's entry for argkey, expecting `key`."""
    return {"command": sys.executable, "args": [str(ARGKEY), *args], "env": {"EXPECT_DIGEST": digest(key)}}


@pytest.fixture
def env(keyring_env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    return {**keyring_env, "XDG_RUNTIME_DIR": str(run), "CELLBLOCK_STATE_DIR": str(tmp_path / "state")}


def everything_written(tmp_path: Path) -> str:
    """Every file under `tmp_path` (configs, the backup, the log, the audit, state) as one text."""
    return "".join(p.read_text(errors="replace") for p in tmp_path.rglob("*") if p.is_file() and not p.is_symlink())


async def test_a_key_on_the_command_line_reaches_the_server_after_wrap_and_nothing_else(
    tmp_path: Path, env: dict[str, str]
) -> None:
    one, two = "ctx7sk-" + os.urandom(12).hex(), "ctx7sk-" + os.urandom(12).hex()
    client_config = tmp_path / "claude_desktop_config.json"
    servers = {"context7": argkey("--api-key", one, key=one), "other": argkey(f"--api-key={two}", key=two)}
    client_config.write_text(json.dumps({"mcpServers": servers}, indent=2))
    config, state, log = tmp_path / "cellblock.yaml", tmp_path / "state", tmp_path / "gateway.log"
    try:
        done = cli(env, "wrap", str(client_config), "--config", str(config))
        assert done.returncode == 0, done.stderr
        assert keyring.get_password("cellblock", "context7-api-key") == one
        assert keyring.get_password("cellblock", "other-api-key") == two
        written = config.read_text()
        assert "- ${secrets.API_KEY}" in written and "--api-key=${secrets.API_KEY}" in written
        for name in ("context7", "other"):  # first start holds each catalog; then approved as `review` would
            async with gateway(config, state, env=env, stderr=log) as client:
                await client.list_tools()
            assert cli(env, "approve", name, "--config", str(config)).returncode == 0
        async with gateway(config, state, env=env, stderr=log, elicitation_callback=allow_once) as client:
            for name in ("context7", "other"):
                checked = json.loads(text(await client.call_tool(f"{name}__check", {})))
                assert checked == {"key_present": True, "key_matches": True}, name
                leaked = text(await client.call_tool(f"{name}__leak", {}))
                assert "--api-key" in leaked and "[redacted]" in leaked, name
            # one server's key on its way to the other is refused; the control, another value, is not
            refused = await client.call_tool("other__echo", {"text": f"use {one}"})
            assert refused.is_error and "secret API_KEY (keyring entry 'context7-api-key')" in text(refused)
            assert "another value" in text(await client.call_tool("other__echo", {"text": "another value"}))
            running = cli(env, "ps", "--json")
            assert running.returncode == 0 and '"context7"' in running.stdout
            assert one not in running.stdout + running.stderr and two not in running.stdout + running.stderr
        shown = cli(env, "show", "--config", str(config), "--json")
        assert shown.returncode == 0 and "${secrets.API_KEY}" in shown.stdout
        assert {item["name"]: item["jail"] for item in json.loads(shown.stdout)} == dict.fromkeys(servers, "bubblewrap")
        assert one not in shown.stdout and two not in shown.stdout
        assert "argkey started:" in log.read_text() and "[redacted]" in log.read_text()  # the relay ran
        everything = everything_written(tmp_path)
        assert one not in everything and two not in everything  # configs, backup, log, audit, state
        audited = [json.loads(line) for line in (state / "audit.jsonl").read_text().splitlines()]
        [refusal] = [e for e in audited if e.get("rule") == "secret"]
        assert refusal["carried"] == ["secret API_KEY (keyring entry 'context7-api-key')"]
    finally:
        for entry in ("context7-api-key", "other-api-key"):
            keyring.delete_password("cellblock", entry)


async def test_control_a_key_as_a_plain_argument_leaks_through_the_same_channels(
    tmp_path: Path, env: dict[str, str]
) -> None:
    key = "ctx7sk-" + os.urandom(12).hex()
    plain = argkey("--api-key", key, key=key) | {"jail": {"read_only": [str(ARGKEY.parent)]}}
    state, log = tmp_path / "state", tmp_path / "gateway.log"
    async with gateway(write_config(tmp_path, {"plain": plain}), state, env=env, stderr=log) as client:
        checked = json.loads(text(await client.call_tool("plain__check", {})))
        assert checked == {"key_present": True, "key_matches": True}
        assert key in text(await client.call_tool("plain__leak", {}))
    assert key in log.read_text() and key in (tmp_path / "cellblock.yaml").read_text()


@pytest.fixture
def context7_api() -> Iterator[tuple[str, list[str]]]:
    """A stand-in for context7's API on loopback: (its URL, the Authorization header of each request)."""
    seen: list[str] = []

    class Api(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.headers.get("Authorization") or "")
            body = b'{"error": "unauthorized"}'
            self.send_response(401)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", free_port()), Api)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/api", seen
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.peers
async def test_context7_wrapped_from_its_readme_sends_the_key_from_the_keyring_to_its_api(
    tmp_path: Path, env: dict[str, str], context7_api: tuple[str, list[str]]
) -> None:
    url, seen = context7_api
    key = "ctx7sk-" + os.urandom(12).hex()
    command = peers.context7("--api-key", key)
    client_config = tmp_path / "claude_desktop_config.json"
    entry = {"command": command[0], "args": command[1:], "env": {"CONTEXT7_API_URL": url}}
    client_config.write_text(json.dumps({"mcpServers": {"context7": entry}}, indent=2))
    config, state, log = tmp_path / "cellblock.yaml", tmp_path / "state", tmp_path / "gateway.log"
    try:
        assert cli(env, "wrap", str(client_config), "--config", str(config)).returncode == 0
        assert "- ${secrets.API_KEY}" in config.read_text() and key not in config.read_text()
        # its API host comes from CONTEXT7_API_URL (the table of known servers), on the URL's port;
        # context7 sends through the proxy variables, which carry it to the host's loopback
        jail = yaml.safe_load(config.read_text())["servers"]["context7"]["jail"]
        port = url.split(":")[2].split("/")[0]
        assert jail["network"] == "allowlist" and jail["allow_hosts"] == [f"127.0.0.1:{port}"]
        async with gateway(config, state, env=env, stderr=log) as client:
            await client.list_tools()
        assert cli(env, "approve", "context7", "--config", str(config)).returncode == 0
        async with gateway(config, state, env=env, stderr=log, elicitation_callback=allow_once) as client:
            tools = {t.name for t in (await client.list_tools()).tools}
            assert "context7__resolve-library-id" in tools
            answer = await client.call_tool("context7__resolve-library-id", {"query": "hooks", "libraryName": "react"})
            assert key not in text(answer)
        assert seen and all(header == f"Bearer {key}" for header in seen)  # the real key, from the keyring
        assert key not in everything_written(tmp_path)
    finally:
        keyring.delete_password("cellblock", "context7-api-key")
