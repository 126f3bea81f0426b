"""The first start after `wrap`, as a user meets it: `review`, `diff --all` and `approve --all` meet
the servers no gateway has met themselves (one shared step), say one line for a server that could
not be met (and meet it again the next time), and show none of what the gateway and the servers
write meanwhile: that goes to the meeting's log.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import keyring
import mcp.types as types
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from cellblock.sandbox.installer import REGISTRY_ENV
from tests import peers
from tests.integration.conftest import cli, cli_env, probe_server, write_config

pytestmark = pytest.mark.anyio

REVIEW_FIRST = {"enabled": True, "first": "review"}
# what an old SDK's server writes to stderr as it starts: a pydantic dump and a traceback
JUNK = [
    "Traceback (most recent call last):",
    '  File "/usr/lib/python3/site-packages/mcp/server/lowlevel/server.py", line 640, in _handle_message',
    "pydantic_core._pydantic_core.ValidationError: 1 validation error for ClientRequest",
]


def _servers(tmp_path: Path) -> dict[str, Any]:
    """alpha: a server that works (echo runs without asking); noisy: one that works but writes junk to
    stderr first; quits: one that exits at once, counting its starts in `starts`."""
    noisy = probe_server("--name", "noisy", lock=REVIEW_FIRST, tools={"default": "ask"})
    junk = "; ".join(f"echo {shlex.quote(line)} >&2" for line in JUNK)
    noisy["args"] = ["-c", f"{junk}; exec {shlex.join([noisy['command'], *noisy['args']])}"]
    noisy["command"], noisy["jail"] = "/bin/sh", False  # a shell in front: the jail would not show the venv
    starts = tmp_path / "starts"
    quits = f"echo started >> {shlex.quote(str(starts))}; echo 'cannot import name frobnicate' >&2; exit 3"
    return {
        "alpha": probe_server(
            "--name", "alpha", lock=REVIEW_FIRST, tools={"default": "ask", "rules": {"echo": "allow"}}
        ),
        "noisy": noisy,
        "quits": {"command": "/bin/sh", "args": ["-c", quits], "jail": False, "lock": REVIEW_FIRST},
    }


async def test_review_shows_a_summary_line_the_catalog_and_what_runs_unasked_and_none_of_the_servers_noise(
    tmp_path: Path,
) -> None:
    config = write_config(tmp_path, _servers(tmp_path))
    env = cli_env(tmp_path)
    log = tmp_path / "state" / "meeting.log"

    shown = cli(env, "review", "--config", str(config), stdin="n\nn\n")

    assert shown.returncode == 1, shown.stderr
    told = shown.stderr.splitlines()
    assert told[0] == "cellblock: meeting alpha, noisy, quits: each starts once in its jail to say what it offers"
    assert told[1] == (
        "cellblock: could not meet 'quits': exited at start: cannot import name frobnicate; the log is "
        f"{log}. It is met again at the next review, diff --all or approve --all"
    )
    assert told[2:] == [
        "cellblock: 'alpha' stays held: its tools are not offered",
        "cellblock: 'noisy' stays held: its tools are not offered",
    ]
    lines = shown.stdout.splitlines()
    first = [line for line in lines if line.startswith("[")]
    assert first == [
        "[1/2] first contact with 'alpha': 18 tools, 1 prompt, 1 resource, 1 template, instructions, none approved yet",
        "[2/2] first contact with 'noisy': 18 tools, 1 prompt, 1 resource, 1 template, instructions, none approved yet",
    ]
    assert "new tool:echo" in lines and "    Echo the message back as text and as structured content." in lines
    unasked = [line for line in lines if line.startswith("runs without asking:")]
    assert unasked == ["runs without asking: echo", "runs without asking: none; every call asks you first"]
    everything = shown.stdout + shown.stderr
    for noise in ("INFO", "WARNING", "Traceback", "pydantic", "changed since", "stderr]", "limits:"):
        assert noise not in everything, noise
    # all of it is in the log, the servers' lines marked as theirs
    kept = log.read_text()
    assert f"[noisy stderr] {JUNK[2]}" in kept and "[quits stderr] cannot import name frobnicate" in kept
    assert "INFO cellblock.gateway.downstream.server: server 'alpha' is ready" in kept
    assert log.stat().st_mode & 0o777 == 0o600

    # the failed meeting is not remembered: the next review meets quits again, and only quits
    starts = len((tmp_path / "starts").read_text().splitlines())
    again = cli(env, "review", "--config", str(config), stdin="n\nn\n")
    assert again.stderr.splitlines()[:2] == [
        "cellblock: meeting quits: each starts once in its jail to say what it offers",
        told[1],
    ]
    assert len((tmp_path / "starts").read_text().splitlines()) > starts


async def test_diff_or_approve_of_one_server_right_after_wrap_meets_the_servers_first(tmp_path: Path) -> None:
    servers = _servers(tmp_path)
    del servers["quits"]
    config = write_config(tmp_path, servers)
    env = cli_env(tmp_path)

    diffed = cli(env, "diff", "noisy", "--config", str(config))  # reading first meets them
    assert diffed.returncode == 1, diffed.stderr
    assert diffed.stdout.startswith("first contact with 'noisy': 18 tools")
    assert "Traceback" not in diffed.stdout + diffed.stderr

    approved = cli(env, "approve", "alpha", "--config", str(config))
    assert approved.returncode == 0, approved.stderr
    assert approved.stderr.splitlines() == ["cellblock: OK: approved the catalog of 'alpha' (22 items)"]
    rest = cli(env, "diff", "--all", "--config", str(config))
    assert rest.returncode == 1 and "meeting" not in rest.stderr  # met once, not again
    assert "first contact with 'noisy'" in rest.stdout and "'alpha'" not in rest.stdout


async def test_approve_all_alone_meets_and_approves_and_says_which_server_it_could_not_meet(tmp_path: Path) -> None:
    config = write_config(tmp_path, _servers(tmp_path))
    env = cli_env(tmp_path)

    approved = cli(env, "approve", "--all", "--config", str(config))

    assert approved.returncode == 1, approved.stderr  # quits is not approved: it said nothing
    told = approved.stderr.splitlines()
    assert told[0].startswith("cellblock: meeting alpha, noisy, quits: ")
    assert told[1].startswith("cellblock: could not meet 'quits': exited at start: cannot import name frobnicate; ")
    assert told[2:] == [
        "cellblock: OK: approved the catalog of 'alpha' (22 items)",
        "cellblock: OK: approved the catalog of 'noisy' (22 items)",
    ]
    assert (tmp_path / "state" / "locks" / "alpha.json").exists()


@pytest.mark.peers
@pytest.mark.jail
async def test_review_after_wrap_shows_each_server_in_its_summary_shape_and_meets_a_failed_one_again(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    client_config = home / ".config" / "Claude" / "claude_desktop_config.json"
    client_config.parent.mkdir(parents=True)
    servers = {
        "time": {"command": peers.time_server()[0], "args": ["--local-timezone", "UTC"]},
        "broken": {"command": "/bin/false"},  # exits at once, as a server whose runtime is missing does
    }
    client_config.write_text(json.dumps({"mcpServers": servers}, indent=2))
    shell = {"HOME": str(home), "USER": "root", "PATH": "/usr/local/bin:/usr/bin:/bin"}
    assert _exactly(shell, "wrap", str(client_config)).returncode == 0
    log = home / ".local" / "state" / "cellblock" / "meeting.log"
    failed = (
        "cellblock: could not meet 'broken': protocol error: Connection closed; the log is "
        f"{log}. It is met again at the next review, diff --all or approve --all"
    )

    reviewed = _exactly(shell, "review")  # no answers: nothing approved

    assert reviewed.returncode == 1
    assert reviewed.stderr.splitlines() == [
        "cellblock: meeting time, broken: each starts once in its jail to say what it offers",
        failed,
        "cellblock: 'time' stays held: its tools are not offered",
    ]
    lines = reviewed.stdout.splitlines()
    assert lines[:3] == ["", "[1/1] first contact with 'time': 2 tools, none approved yet", ""]
    assert "new tool:get_current_time" in lines and "new tool:convert_time" in lines
    assert lines[-2:] == [
        "runs without asking: none; every call asks you first",
        "Approve the catalog of 'time'? [y/N] ",
    ]
    assert not any(word in reviewed.stdout for word in ("INFO", "WARNING", "Traceback", "changed since"))

    again = _exactly(shell, "review")  # the failed meeting is not remembered: broken is met again
    assert again.stderr.splitlines()[:2] == [
        "cellblock: meeting broken: each starts once in its jail to say what it offers",
        failed,
    ]
    assert "server 'broken' is down" in log.read_text() and "INFO" not in again.stderr


MEMORY = "@modelcontextprotocol/server-memory@2026.8.31"
TOKEN = "tok_" + "Pq4Xs9" * 6


@pytest.mark.peers
@pytest.mark.jail
@pytest.mark.slow
async def test_after_wrap_approve_all_alone_works_and_a_server_that_cannot_start_is_refused_before_any_question(
    tmp_path: Path, keyring_env: dict[str, str]
) -> None:
    home = tmp_path / "home"
    client_config = home / ".config" / "Claude" / "claude_desktop_config.json"
    client_config.parent.mkdir(parents=True)
    time_server = peers.time_server()
    servers = {
        "memory": {"command": "npx", "args": ["-y", MEMORY]},
        "time": {"command": time_server[0], "args": ["--local-timezone", "UTC"], "env": {"TIME_API_TOKEN": TOKEN}},
    }
    client_config.write_text(json.dumps({"mcpServers": servers}, indent=2))
    npm = shutil.which("npm")
    assert npm is not None, "npm is needed: ./dev installs it"
    path = f"{os.path.dirname(npm)}:/usr/local/bin:/usr/bin:/bin"
    bus = {"DBUS_SESSION_BUS_ADDRESS": keyring_env["DBUS_SESSION_BUS_ADDRESS"]}
    client = {"HOME": str(home), "USER": "root", "PATH": path, **bus}  # a client started in the desktop session
    shell = {**client, **keyring_env, **{k: os.environ[k] for k in REGISTRY_ENV if k in os.environ}}
    wrapped = _exactly(shell, "wrap", str(client_config))
    assert wrapped.returncode == 0, wrapped.stderr

    # right after wrap, one command: the servers are met and their catalogs approved
    approved = _exactly(client, "approve", "--all")
    assert approved.returncode == 0, approved.stderr
    told = approved.stderr.splitlines()
    assert told[0] == "cellblock: meeting memory, time: each starts once in its jail to say what it offers"
    assert told[1].startswith("cellblock: OK: approved the catalog of 'memory' (")
    assert told[2].startswith("cellblock: OK: approved the catalog of 'time' (") and len(told) == 3

    # memory's package is gone (a config carried to another machine), time's token is not in the keyring
    (home / ".local" / "share" / "cellblock" / "installs" / "memory.json").unlink()
    keyring.delete_password("cellblock", "time-time-api-token")
    asked: list[str] = []

    async def allow_once(ctx: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={"decision": "allow_once"})

    entry = json.loads(client_config.read_text())["mcpServers"]["cellblock"]
    params = StdioServerParameters(command=entry["command"], args=entry["args"], env=client)
    async with Client(params, elicitation_callback=allow_once, cache=None) as session:
        with anyio.fail_after(30):  # at once: no start, no restarts, no question waited for
            missing = await session.call_tool("memory__read_graph", {})
            unset = await session.call_tool("time__get_current_time", {"timezone": "UTC"})
        assert missing.is_error and "run `cellblock install memory`" in _text(missing), _text(missing)
        assert f"{MEMORY} is not installed" in _text(missing)
        assert unset.is_error and "`cellblock auth set time-time-api-token`" in _text(unset), _text(unset)
        assert asked == []  # nobody was asked to approve a call that could not run
        ps = await anyio.to_thread.run_sync(_exactly, client, "ps")
        assert "    not running: server 'memory' cannot start: " in ps.stdout, ps.stdout
        assert "run `cellblock install memory`" in ps.stdout

        # control: the same client is asked, and the call runs, once the cause is put right
        keyring.set_password("cellblock", "time-time-api-token", TOKEN)
        fixed = await session.call_tool("time__get_current_time", {"timezone": "UTC"})
        assert not fixed.is_error, _text(fixed)
        assert len(asked) == 1 and "get_current_time" in asked[0]


def _exactly(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """`cellblock ARGS` from the user's shell: exactly `env`."""
    command = [sys.executable, "-m", "cellblock.gateway.cli.main", *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, check=False)


def _text(result: types.CallToolResult) -> str:
    return "".join(getattr(c, "text", "") for c in result.content)
