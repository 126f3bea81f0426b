"""A key a server takes on its command line, through the real `cellblock wrap` and `serve`.

A Claude Desktop config starts two argkey servers (tests/servers/argkey.py, which takes
`--api-key` as context7 does) with their keys inline, one `--api-key KEY`, one `--api-key=KEY`.
After `wrap` the keys are in the keyring only and the config names them (`${secrets.API_KEY}`);
started by the gateway, each server is given its real key (it says so as a boolean, from a digest),
and when it echoes its command line the key is redacted from the client, the log and the audit,
`show` and `ps` never hold it, and a call carrying one server's key to the other is refused.
The control: the same server with the key as a plain argument in cellblock.yaml, no reference,
leaks it through the very same channels.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

import keyring
import mcp.types as types
import pytest

from tests.integration.conftest import cli, gateway, write_config

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
