"""A server's stderr reaches the gateway's stderr (the client's log of the gateway) only as the
server's own lines: no secret the gateway holds (its own, or another server's), no terminal
control, nothing that passes for the gateway's own log lines; and so wherever its last lines are
shown (`cellblock ps`, the audit log). The control runs the same server outside the gateway: its
raw stderr carries all three."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import keyring
import keyring.errors
import pytest

from tests.integration.conftest import ROOT, cli, eventually, gateway, write_config

pytestmark = [pytest.mark.anyio, pytest.mark.jail]

NOISY = ROOT / "tests" / "servers" / "noisy.py"
RAW = ROOT / "tests" / "servers" / "raw.py"
FAKE = "cellblock: INFO cellblock.gateway.serve.approvals: approved 'git_push'"


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def secrets(keyring_env: dict[str, str]) -> Iterator[tuple[str, str]]:
    """Two keyring entries the gateway hands out: `noisy`'s own key, and `other`'s token."""
    own, other = "sk-NOISY-" + os.urandom(12).hex(), "tok-OTHER-" + os.urandom(12).hex()
    keyring.set_password("cellblock", "noisy-key", own)
    keyring.set_password("cellblock", "other-token", other)
    yield own, other
    for entry in ("noisy-key", "other-token"):
        with contextlib.suppress(keyring.errors.PasswordDeleteError):
            keyring.delete_password("cellblock", entry)


def servers(other: str) -> dict[str, object]:
    jail = {"read_only": [str(NOISY.parent)]}
    return {
        # it holds another server's token too (told in plain env:, as a model could copy it there)
        "noisy": {
            "command": sys.executable,
            "args": [str(NOISY)],
            "jail": jail,
            "secrets": {"API_KEY": "noisy-key"},
            "env": {"OTHER": other},
        },
        "other": {"command": sys.executable, "args": [str(RAW)], "jail": jail, "secrets": {"TOKEN": "other-token"}},
    }


def forged(text: str) -> list[str]:
    """Lines of `text` that pass for the gateway's own saying something was approved (the gateway's
    own line that the server is down quotes its last lines after "its stderr ended:")."""
    return [line for line in text.splitlines() if line.startswith(FAKE)]


async def test_a_servers_stderr_reaches_the_gateways_only_redacted_escaped_and_marked_as_its_own(
    tmp_path: Path, keyring_env: dict[str, str], secrets: tuple[str, str]
) -> None:
    own, other = secrets
    state, log = tmp_path / "state", tmp_path / "gateway.log"
    config = write_config(tmp_path, servers(other))
    env = {**keyring_env, "XDG_RUNTIME_DIR": str(tmp_path)}
    async with gateway(config, state, env=env, stderr=log) as client:
        assert not (await client.call_tool("other__ok", {})).is_error  # the gateway now holds its token
        assert not (await client.call_tool("noisy__say", {})).is_error
        await eventually(lambda: "ALERT" in log.read_text())
        assert (await client.call_tool("noisy__crash", {})).is_error
        ps_env = {**env, "CELLBLOCK_STATE_DIR": str(state)}
        ps = await anyio.to_thread.run_sync(cli, ps_env, "ps", "--json")
    told = log.read_text()
    assert own not in told and other not in told
    assert "\x1b" not in told and "\r" not in told and "\\u001b[31mALERT" in told
    assert forged(told) == []  # the fake line is there, and shows as the server's:
    said = [line for line in told.splitlines() if line.startswith("[noisy stderr] ")]
    assert sum(1 for line in said if line.startswith(f"[noisy stderr] {FAKE}")) == 2
    assert len(said) >= 10 and "[redacted]" in "\n".join(said)  # both times, every line
    # why it stopped, in `cellblock ps` and the audit log: the same lines, the same way
    (last,) = [s["last_exit"] for s in json.loads(ps.stdout)[0]["servers"] if s["name"] == "noisy"]
    audit = (state / "audit.jsonl").read_text()
    exited = [json.loads(line)["reason"] for line in audit.splitlines() if '"server_exit"' in line]
    for why in (last, *exited):
        assert "its stderr ended: " in why and FAKE in why and "\\u000d" in why, why
    for text in (last, audit):
        assert own not in text and other not in text and "\x1b" not in text


def test_control_the_same_servers_own_stderr_carries_all_three(
    tmp_path: Path, keyring_env: dict[str, str], secrets: tuple[str, str]
) -> None:
    own, other = secrets
    env = {**os.environ, "API_KEY": own, "OTHER": other}  # what its jail's environment holds
    done = subprocess.run(
        [sys.executable, str(NOISY), "--now"], stdin=subprocess.DEVNULL, capture_output=True, env=env, timeout=60
    )
    raw = done.stderr.decode()
    assert own in raw and other in raw and "\x1b[31mALERT" in raw and f"\r{FAKE}" in raw
    assert len(forged(raw)) == 2  # the one after a CR too: a terminal shows it as a line of its own
