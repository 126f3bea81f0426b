"""`cellblock serve` end to end: a real gateway process, real probe servers, the SDK client.

One gateway per client era (handshake `legacy`, 2026-07-28 `auto`); behind it the probe server
twice: `new` is spoken to in its client's era (downstream/offer.py), `old` is forced to the
handshake, so a 2026-07-28 client meets a server of each era. A handshake-era client with a
2026-07-28 server is what `--http` serves (tests/integration/test_http.py) and what the in-memory
tests of each feature cover (`harness.unfollowed`).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import mcp.types as types
import pytest

from cellblock import __version__
from tests.integration.conftest import eventually, gateway, probe_server, write_config

pytestmark = pytest.mark.anyio

SERVERS = ["new", "old"]
NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,63}$")


class Seen:
    """What the client received besides results."""

    def __init__(self) -> None:
        self.questions: list[str] = []
        self.logs: list[types.LoggingMessageNotificationParams] = []
        self.notifications: list[Any] = []

    async def elicit(self, ctx: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        self.questions.append(params.message)
        return types.ElicitResult(action="accept", content={"answer": "forty-two"})

    async def log(self, params: types.LoggingMessageNotificationParams) -> None:
        self.logs.append(params)

    async def message(self, message: Any) -> None:
        self.notifications.append(message)


@pytest.fixture(scope="module", params=["legacy", "auto"])
async def session(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp(f"gw-{request.param}")
    probe_log = tmp / "probe.log"
    env = {"PROBE_LOG": str(probe_log)}
    config = write_config(
        tmp,
        {
            "new": probe_server("--name", "new", env=env, writable=tmp, timeout=20),
            "old": probe_server("--name", "old", env=env, writable=tmp, protocol="legacy", timeout=20),
            "slow": probe_server("--name", "slow", env=env, writable=tmp, timeout=1),
            "crashy": probe_server("--name", "crashy"),
            "broken": {"command": str(tmp / "no-such-command")},
        },
    )
    seen = Seen()
    async with gateway(
        config,
        tmp / "state",
        mode=request.param,
        elicitation_callback=seen.elicit,
        logging_callback=seen.log,
        message_handler=seen.message,
        log_level="debug",
    ) as client:
        yield client, seen, probe_log, request.param


def text(result: types.CallToolResult) -> str:
    return " ".join(c.text for c in result.content if isinstance(c, types.TextContent))


async def test_catalog_names_every_tool_under_its_server(session: Any) -> None:
    client, *_ = session
    names = [t.name for t in (await client.list_tools()).tools]
    assert names == sorted(names)
    assert all(NAME.match(n) for n in names), [n for n in names if not NAME.match(n)]
    for server in ("new", "old", "slow", "crashy"):
        assert f"{server}__echo" in names
    assert not any(n.startswith("broken__") for n in names)


async def test_dotted_and_colliding_names_stay_distinct_and_valid(session: Any) -> None:
    client, *_ = session
    names = [t.name for t in (await client.list_tools()).tools if t.name.startswith("new__files")]
    assert "new__files_read" in names  # the tool that already had a valid name keeps it
    assert len(names) == 2 and all(len(n) <= 64 for n in names)
    long = [t.name for t in (await client.list_tools()).tools if t.name.startswith("new__probe_x")]
    assert len(long) == 1 and len(long[0]) == 64


async def test_everything_a_tool_carries_survives(session: Any) -> None:
    client, *_ = session
    tools = {t.name: t for t in (await client.list_tools()).tools}
    for server in SERVERS:
        echo = tools[f"{server}__echo"]
        assert echo.title and echo.description
        assert echo.annotations is not None and echo.annotations.read_only_hint is True
        assert echo.icons and echo.meta and echo.meta.get("probe/x") == 1
        assert echo.output_schema and "message" in echo.output_schema["properties"]


@pytest.mark.parametrize("server", SERVERS)
async def test_call_routes_to_its_server_with_structured_content(session: Any, server: str) -> None:
    client, *_ = session
    result = await client.call_tool(f"{server}__echo", {"message": f"hi {server}"})
    assert not result.is_error
    assert text(result) == f"hi {server}"
    assert result.structured_content == {"message": f"hi {server}"}


@pytest.mark.parametrize("server", SERVERS)
async def test_progress_reaches_the_client(session: Any, server: str) -> None:
    client, *_ = session
    steps: list[tuple[float, float | None]] = []

    async def progress(value: float, total: float | None, message: str | None) -> None:
        steps.append((value, total))

    result = await client.call_tool(f"{server}__slow", {"steps": 3, "delay": 0.01}, progress_callback=progress)
    assert not result.is_error
    assert steps == [(1, 3), (2, 3), (3, 3)]


@pytest.mark.parametrize("server", SERVERS)
async def test_cancelling_a_call_cancels_it_downstream(session: Any, server: str) -> None:
    client, _, probe_log, _ = session
    before = probe_log.read_text().count("cancelled hang") if probe_log.exists() else 0
    with anyio.move_on_after(1):
        await client.call_tool(f"{server}__hang", {})
    await eventually(lambda: probe_log.exists() and probe_log.read_text().count("cancelled hang") > before)
    # the server is still usable afterwards
    assert text(await client.call_tool(f"{server}__echo", {"message": "still here"})) == "still here"


@pytest.mark.parametrize("server", SERVERS)
async def test_downstream_elicitation_is_forwarded_under_the_servers_name(session: Any, server: str) -> None:
    client, seen, *_ = session
    result = await client.call_tool(f"{server}__ask", {"question": "what is the answer?"})
    assert text(result) == "forty-two"
    assert seen.questions[-1] == f"Question from server '{server}' (not a Cellblock approval):\nwhat is the answer?"


@pytest.mark.parametrize("server", SERVERS)
async def test_downstream_logs_arrive_with_the_server_prefix(session: Any, server: str) -> None:
    client, seen, *_ = session
    await client.call_tool(f"{server}__log", {"level": "warning", "message": f"note from {server}"})
    await eventually(lambda: any(f"note from {server}" in str(p.data) for p in seen.logs))
    entry = next(p for p in seen.logs if f"note from {server}" in str(p.data))
    assert entry.logger is not None and entry.logger.startswith(f"{server}.")


@pytest.mark.parametrize("server", SERVERS)
async def test_list_changed_downstream_updates_the_catalog_and_tells_the_client(session: Any, server: str) -> None:
    client, seen, _, mode = session
    new_tool = f"{server}__fresh_{mode}"

    async def listed() -> bool:
        return new_tool in [t.name for t in (await client.list_tools()).tools]

    assert not await listed()
    if mode == "auto":
        async with client.listen(tools_list_changed=True) as events:
            await client.call_tool(f"{server}__add_tool", {"name": f"fresh_{mode}"})
            with anyio.fail_after(10):
                await events.__anext__()
    else:
        before = sum(isinstance(n, types.ToolListChangedNotification) for n in seen.notifications)
        await client.call_tool(f"{server}__add_tool", {"name": f"fresh_{mode}"})
        await eventually(
            lambda: sum(isinstance(n, types.ToolListChangedNotification) for n in seen.notifications) > before
        )
    assert await listed()
    result = await client.call_tool(new_tool, {})
    assert not result.is_error


@pytest.mark.parametrize("server", SERVERS)
async def test_resources_prompts_and_completions_route_back(session: Any, server: str) -> None:
    client, *_ = session
    resources = {str(r.uri) for r in (await client.list_resources()).resources}
    uri = f"cellblock://{server}/probe://static/readme"
    assert uri in resources
    read = await client.read_resource(uri)
    assert read.contents[0].uri == uri and "probe" in getattr(read.contents[0], "text", "").lower()
    templates = {t.uri_template for t in (await client.list_resource_templates()).resource_templates}
    assert f"cellblock://{server}/probe://item/{{id}}" in templates
    item = await client.read_resource(f"cellblock://{server}/probe://item/7")
    assert "7" in getattr(item.contents[0], "text", "")
    prompt = await client.get_prompt(f"{server}__greet", {"name": "Ada"})
    assert "Ada" in str(prompt.messages[0].content)
    done = await client.complete(
        types.PromptReference(type="ref/prompt", name=f"{server}__greet"), {"name": "name", "value": "al"}
    )
    assert done.completion.values == ["alice", "albert"]


async def test_a_call_over_the_timeout_is_cancelled_and_answered_with_an_error(session: Any) -> None:
    client, _, probe_log, _ = session
    before = probe_log.read_text().count("cancelled hang") if probe_log.exists() else 0
    result = await client.call_tool("slow__hang", {})
    assert result.is_error
    assert "'slow'" in text(result) and "1s" in text(result)
    # the gateway told the server to stop, not just the client to give up
    await eventually(lambda: probe_log.read_text().count("cancelled hang") > before)


@pytest.mark.parametrize("tool", ["garbage", "malformed"])
@pytest.mark.parametrize("server", SERVERS)
async def test_garbage_or_malformed_messages_do_not_break_the_server(session: Any, server: str, tool: str) -> None:
    client, *_ = session
    assert not (await client.call_tool(f"{server}__{tool}", {})).is_error
    assert text(await client.call_tool(f"{server}__echo", {"message": "after"})) == "after"


async def test_a_server_that_cannot_start_is_named_in_the_error(session: Any) -> None:
    client, *_ = session
    result = await client.call_tool("broken__anything", {})
    assert result.is_error and "'broken'" in text(result)
    assert "not found" in text(result) or "not available" in text(result)


async def test_unknown_tool_is_refused(session: Any) -> None:
    client, *_ = session
    result = await client.call_tool("nobody__nothing", {})
    assert result.is_error and "unknown tool" in text(result)


async def test_a_crashed_server_is_restarted_and_others_keep_working(session: Any) -> None:
    client, *_ = session
    crashed = await client.call_tool("crashy__crash", {})
    assert crashed.is_error and "'crashy'" in text(crashed)
    # the other servers answer while crashy restarts
    assert text(await client.call_tool("new__echo", {"message": "unaffected"})) == "unaffected"
    # and crashy comes back by itself
    assert text(await client.call_tool("crashy__echo", {"message": "back"})) == "back"


async def test_lazy_server_starts_on_first_use_and_lists_from_its_saved_catalog(tmp_path: Path) -> None:
    marker = tmp_path / "started.log"
    servers = {"lazy": probe_server("--name", "lazy", start="lazy", env={"PROBE_LOG": str(marker)}, writable=tmp_path)}
    config = write_config(tmp_path, servers)
    state = tmp_path / "state"
    # first run learns the catalog (nothing saved yet) and saves it
    async with gateway(config, state) as client:
        assert "lazy__echo" in [t.name for t in (await client.list_tools()).tools]
    assert (state / "catalogs" / "lazy.json").exists()
    marker.unlink(missing_ok=True)
    async with gateway(config, state) as client:
        assert "lazy__echo" in [t.name for t in (await client.list_tools()).tools]
        assert not marker.exists(), "a lazy server with a saved catalog must not start before first use"
        assert text(await client.call_tool("lazy__echo", {"message": "woke"})) == "woke"
        assert "started lazy" in marker.read_text()


async def test_servers_instructions_reach_the_client_under_their_names(session: Any) -> None:
    client, *_ = session
    instructions = client.instructions or ""
    assert "<server>__<name>" in instructions
    assert "[new] " in instructions and "[old] " in instructions


async def test_an_eager_server_with_a_known_catalog_starts_without_waiting_for_a_list(tmp_path: Path) -> None:
    marker = tmp_path / "started.log"
    servers = {"known": probe_server("--name", "known", env={"PROBE_LOG": str(marker)}, writable=tmp_path)}
    config = write_config(tmp_path, servers)
    state = tmp_path / "state"
    async with gateway(config, state) as client:  # first run: learns and saves the catalog
        assert "known__echo" in [t.name for t in (await client.list_tools()).tools]
    marker.unlink(missing_ok=True)
    async with gateway(config, state):  # this client never asks for a list
        await eventually(lambda: marker.exists() and "started" in marker.read_text(), timeout=20)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


async def test_sigterm_stops_every_server_before_the_gateway_exits(tmp_path: Path) -> None:
    """A client may end the gateway with SIGTERM; no server is left running on its own, not even
    one that never reads its stdin (so never sees the pipe close) and was never jailed."""
    state = tmp_path / "state"
    config = write_config(tmp_path, {"stubborn": probe_server("--name", "stubborn")})
    async with gateway(config, state) as client:  # learns the catalog, so the next run lists from it
        assert "stubborn__echo" in [t.name for t in (await client.list_tools()).tools]
    marker = tmp_path / "stubborn.pid"
    sleeper = f"import os, time; open({str(marker)!r}, 'w').write(str(os.getpid())); time.sleep(600)"
    config = write_config(tmp_path, {"stubborn": {"command": sys.executable, "args": ["-c", sleeper], "jail": False}})
    command = [sys.executable, "-m", "cellblock.gateway.cli.main", "serve", "--config", str(config)]
    env = {**os.environ, "CELLBLOCK_STATE_DIR": str(state)}
    async with await anyio.open_process(command, env=env, stderr=subprocess.DEVNULL) as process:
        assert process.stdin is not None
        hello = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}
        for request in ({"id": 1, "method": "initialize", "params": hello}, {"id": 2, "method": "tools/list"}):
            await process.stdin.send(json.dumps({"jsonrpc": "2.0", **request}).encode() + b"\n")
        await eventually(lambda: marker.exists() and marker.read_text().strip().isdigit(), timeout=20)
        pid = int(marker.read_text())
        assert _alive(pid)
        process.send_signal(signal.SIGTERM)
        with anyio.fail_after(20):
            await process.wait()
    assert not _alive(pid), "the server outlived the gateway"


async def test_a_server_that_dies_at_start_says_why_in_the_refusal_the_log_ps_and_the_audit(tmp_path: Path) -> None:
    # what uvx says when the uv it execs is missing from the jail; without its stderr, the gateway
    # could only tell "Connection closed"
    said = "Could not find the uv binary at /nowhere/.local/bin/uv"
    dying = {"command": "/bin/sh", "args": ["-c", f"echo 'starting...' >&2; echo '{said}' >&2; exit 2"]}
    config = write_config(tmp_path, {"git": dying})
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    env = {"XDG_RUNTIME_DIR": str(run)}
    log = tmp_path / "gateway.log"
    async with gateway(config, tmp_path / "state", env=env, stderr=log) as client:
        refused = await client.call_tool("git__git_status", {})
        assert refused.is_error
        assert "server 'git' " in text(refused) and f"exited at start: starting... | {said}" in text(refused)
        ps = await anyio.run_process(
            [sys.executable, "-m", "cellblock.gateway.cli.main", "ps", "--json"],
            env={**os.environ, **env, "CELLBLOCK_STATE_DIR": str(tmp_path / "state")},
        )
        (server,) = json.loads(ps.stdout)[0]["servers"]
        assert said in server["last_exit"]
    audit = [json.loads(line) for line in (tmp_path / "state" / "audit.jsonl").read_text().splitlines()]
    assert any(e["event"] == "server_start_failed" and said in e["reason"] for e in audit)
    told = log.read_text()
    assert f"\n[git stderr] {said}\n" in told  # the server's own stderr is still passed on, as its own
    assert f"server 'git' is down (exited at start: starting... | {said})" in told


async def test_every_server_meets_the_gateway_as_cellblock_and_its_version(session: Any) -> None:
    client, *_ = session
    for server in ("new", "old"):  # a 2026-07-28 server reads it from each request, a handshake one once
        assert text(await client.call_tool(f"{server}__whoami", {})) == f"cellblock {__version__}"
