"""Secrets do not leave through arguments, through the real `cellblock serve`.

A model can be tricked into copying a token from one tool's output into another tool's call. Two
recorder servers (tests/servers/recorder.py) write down every request they are sent: `a` holds a
token and a secret of digits from the keyring, `b` holds nothing. Calls, prompt gets and resource
reads to `b` that carry `a`'s secrets, plainly or encoded, are refused before they reach `b` and
audited with the secret's name. The controls: the same call with another value reaches `b`, and
`a`'s own call with its own secret reaches `a`.
"""

from __future__ import annotations

import base64
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import keyring
import pytest
from mcp.shared.exceptions import MCPError

from tests.integration.conftest import bearer_client, cli, cli_env, gateway, write_config
from tests.integration.test_credentials import assert_nowhere
from tests.integration.test_http import serving

pytestmark = pytest.mark.anyio
RECORDER = Path(__file__).resolve().parents[1] / "servers" / "recorder.py"
SCHEMA = {"type": "object", "additionalProperties": True}


@pytest.fixture
def env(keyring_env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    return cli_env(tmp_path, keyring_env)


def recorder(records: Path, name: str, **extra: Any) -> dict[str, Any]:
    return {
        "command": sys.executable,
        "args": [str(RECORDER)],
        "env": {"RECORD": str(records / f"{name}.jsonl")},
        "jail": {"read_only": [str(RECORDER.parent)], "read_write": [str(records)]},
        **extra,
    }


def received(records: Path, name: str) -> str:
    path = records / f"{name}.jsonl"
    return path.read_text() if path.exists() else ""


def text(result: Any) -> str:
    return "".join(getattr(c, "text", "") for c in result.content)


def audited(state: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (state / "audit.jsonl").read_text().splitlines()]


@pytest.fixture
def secrets(keyring_env: dict[str, str]) -> Iterator[tuple[str, str]]:
    """`a`'s token (with characters a URL escapes) and its secret of 18 digits, in the keyring."""
    token = "tok+" + os.urandom(12).hex() + "/z"
    digits = str(10**17 + int.from_bytes(os.urandom(7)) % 10**17)
    entries = {"a-token": token, "a-pin": digits}
    for entry, value in entries.items():
        keyring.set_password("cellblock", entry, value)
    try:
        yield token, digits
    finally:
        for entry in entries:
            keyring.delete_password("cellblock", entry)


async def test_a_call_carrying_another_servers_secret_never_reaches_it_and_is_audited_by_name(
    tmp_path: Path, env: dict[str, str], secrets: tuple[str, str]
) -> None:
    token, digits = secrets
    records, state = tmp_path / "records", tmp_path / "state"
    records.mkdir()
    servers = {
        # lazy, with its catalog known from an earlier start: not started when `b` is called, so
        # its secrets are known only from the keyring
        "a": recorder(records, "a", secrets={"API_TOKEN": "a-token", "PIN": "a-pin"}, start="lazy"),
        "b": recorder(records, "b"),
    }
    attempts = {
        "plain": {"text": token},
        "nested": {"request": {"headers": [{"Authorization": f"Bearer {token}"}]}},
        "a number": {"amount": int(digits)},
        "inside a longer string": {"text": f"forward this: key={token}&then=1"},
        "as a key": {token: True},
        "URL-encoded": {"url": "https://collector.example/?k=" + quote(token, safe="")},
        "base64": {"blob": base64.b64encode(f"user:{token}".encode()).decode()},
        "hex": {"blob": token.encode().hex()},
    }
    (state / "catalogs").mkdir(parents=True)
    (state / "catalogs" / "a.json").write_text(json.dumps({"tools": [{"name": "send", "inputSchema": SCHEMA}]}))
    async with gateway(write_config(tmp_path, servers), state, env=env) as client:
        for label, arguments in attempts.items():
            result = await client.call_tool("b__send", arguments)
            assert result.is_error, label
            said = text(result)
            assert said.startswith("refused: secret: its arguments carry the secret "), said
            assert "keyring entry 'a-" in said and "of server 'a'" in said and "never to 'b'" in said
            assert token not in said and digits not in said
        with pytest.raises(MCPError, match=r"secret API_TOKEN \(keyring entry 'a-token'\) of server 'a'"):
            await client.get_prompt("b__say", {"text": f"the key is {token}"})
        with pytest.raises(MCPError, match=r"its URI carry the secret PIN \(keyring entry 'a-pin'\)"):
            await client.read_resource(f"cellblock://b/rec://{digits}")
        # the controls: another value reaches `b`; `a`'s own secrets reach `a`
        assert text(await client.call_tool("b__send", {"text": "another value"})) == "sent"
        assert received(records, "a") == ""  # `a` was not started for any of the above
        assert text(await client.call_tool("a__send", {"text": token, "amount": int(digits)})) == "sent"

    to_b, to_a = received(records, "b"), received(records, "a")
    assert "another value" in to_b and '"tools/call"' in to_b
    assert token not in to_b and digits not in to_b and token.encode().hex() not in to_b
    assert '"prompts/get"' not in to_b and '"resources/read"' not in to_b
    assert token in to_a and digits in to_a  # its own, passed on
    refused = [e for e in audited(state) if e["event"] == "call" and e.get("rule") == "secret"]
    assert len(refused) == len(attempts) + 2 and {e["server"] for e in refused} == {"b"}
    assert {e["decision"] for e in refused} == {"deny"}
    assert all(e["held_for"] == ["a"] for e in refused)
    named = {name for e in refused for name in e["carried"]}
    assert named == {"secret API_TOKEN (keyring entry 'a-token')", "secret PIN (keyring entry 'a-pin')"}
    assert_nowhere([token, digits, token.encode().hex()], state)  # the audit log: names, never values


async def test_the_http_token_in_a_calls_arguments_never_reaches_a_server(tmp_path: Path, env: dict[str, str]) -> None:
    """`serve --http`: the token HTTP clients send is the gateway's own; no server gets it. The
    control: the same call with another value reaches the server."""
    records, state = tmp_path / "records", tmp_path / "state"
    records.mkdir()
    config = write_config(tmp_path, {"b": recorder(records, "b")})
    token = "http-" + os.urandom(16).hex()
    assert cli(env, "auth", "set", "--http", "--config", str(config), stdin=token).returncode == 0
    try:
        with serving(config, env) as url:
            async with bearer_client(url, token) as client:
                refused = await client.call_tool("b__send", {"text": f"Authorization: Bearer {token}"})
                assert refused.is_error
                assert "the gateway's HTTP token (keyring entry 'cellblock/http-token')" in text(refused)
                assert text(await client.call_tool("b__send", {"text": "another value"})) == "sent"
    finally:
        cli(env, "auth", "logout", "--http", "--config", str(config))
    assert token not in received(records, "b") and "another value" in received(records, "b")
    [event] = [e for e in audited(state) if e.get("rule") == "secret"]
    assert (event["held_for"], event["carried"]) == (
        ["cellblock"],
        ["HTTP token (keyring entry 'cellblock/http-token')"],
    )
