"""Real third-party MCP servers behind the gateway, and a second real client in front of it.

Peers (pinned, installed by `./dev peers`): npm server-everything and server-filesystem, PyPI
mcp-server-time and mcp-server-git; the MCP Inspector CLI as a client built on another SDK.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import mcp.types as types
import pytest

from tests import peers
from tests.integration.conftest import gateway, write_config

pytestmark = [pytest.mark.anyio, pytest.mark.peers]


def _which(name: str) -> str:
    found = shutil.which(name)
    assert found is not None, f"{name} is not installed"
    return found


def entry(argv: list[str], **extra: Any) -> dict[str, Any]:
    return {"command": argv[0], "args": argv[1:], **extra}


@pytest.fixture(scope="module")
def peer_config(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path, Path]:
    tmp = tmp_path_factory.mktemp("peers")
    shared, granted = tmp / "shared", tmp / "granted"
    # a per-server package cache as `wrap` sets one up (XDG_CACHE_HOME is set for the gateway)
    cache = tmp / "cache" / "cellblock" / "npm-files"
    for directory in (shared, granted, cache):
        directory.mkdir(parents=True)
    (shared / "hello.txt").write_text("hello from the filesystem server\n")
    repo = tmp / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    subprocess.run([*git, "init", "-q"], check=True)
    (repo / "a.txt").write_text("a\n")
    subprocess.run([*git, "add", "a.txt"], check=True)
    subprocess.run([*git, "commit", "-qm", "first"], check=True)
    (repo / "b.txt").write_text("untracked\n")
    node_modules = str(peers.NODE_MODULES)
    config = write_config(
        tmp,
        {
            "everything": entry(
                peers.everything(), timeout=30, jail={"read_only": [node_modules], "read_write": [str(granted)]}
            ),
            "files": entry(
                peers.filesystem(shared), jail={"read_only": [node_modules], "read_write": [str(shared), str(cache)]}
            ),
            # told it may use all of tmp, but its jail shares only tmp/shared: the jail decides
            "wide": entry(peers.filesystem(tmp), jail={"read_only": [node_modules], "read_write": [str(shared)]}),
            "time": entry(peers.time_server("--local-timezone", "UTC")),
            "git": entry(peers.git_server(repo), jail={"read_only": [str(repo)]}),
            # the same server allowed to run git and nothing else
            "gitonly": entry(
                peers.git_server(repo), jail={"read_only": [str(repo)], "exec": {"allow": [_which("git")]}}
            ),
        },
    )
    return config, tmp / "state", shared, repo


class Asked:
    def __init__(self) -> None:
        self.messages: list[str] = []

    async def __call__(self, ctx: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        self.messages.append(params.message)
        return types.ElicitResult(action="accept", content={"name": "Ada", "check": True, "integer": 7})


@pytest.fixture(scope="module")
async def client(peer_config: tuple[Path, Path, Path, Path]) -> Any:
    config, state, *_ = peer_config
    asked = Asked()
    # a token in the gateway's own environment, which no downstream server may see
    secret = {"CELLBLOCK_TEST_TOKEN": "tok-do-not-leak"}
    env = {**secret, "XDG_CACHE_HOME": str(config.parent / "cache")}
    async with gateway(config, state, mode="auto", elicitation_callback=asked, env=env) as c:
        yield c, asked


def text(result: types.CallToolResult) -> str:
    return " ".join(c.text for c in result.content if isinstance(c, types.TextContent))


async def test_one_catalog_holds_every_real_server(client: Any) -> None:
    c, _ = client
    names = {t.name for t in (await c.list_tools()).tools}
    for expected in ("everything__echo", "files__read_text_file", "time__get_current_time", "git__git_status"):
        assert expected in names


async def test_calls_reach_each_real_server(client: Any, peer_config: Any) -> None:
    c, _ = client
    _, _, shared, repo = peer_config
    assert "Echo: hi" in text(await c.call_tool("everything__echo", {"message": "hi"}))
    read = await c.call_tool("files__read_text_file", {"path": str(shared / "hello.txt")})
    assert "hello from the filesystem server" in text(read)
    now = await c.call_tool("time__get_current_time", {"timezone": "UTC"})
    assert not now.is_error and "UTC" in text(now)
    status = await c.call_tool("git__git_status", {"repo_path": str(repo)})
    assert "b.txt" in text(status)


async def test_the_gateways_environment_does_not_leak_into_a_server(client: Any) -> None:
    c, _ = client
    seen = text(await c.call_tool("everything__get-env", {}))
    assert "PATH" in seen  # the control: the tool does show the environment it got
    assert "CELLBLOCK_TEST_TOKEN" not in seen and "tok-do-not-leak" not in seen


async def test_filesystem_server_refuses_paths_outside_its_directory(client: Any, tmp_path: Path) -> None:
    c, _ = client
    outside = tmp_path / "secret.txt"
    outside.write_text("secret")
    result = await c.call_tool("files__read_text_file", {"path": str(outside)})
    assert result.is_error and "secret" not in text(result).replace(str(outside), "")


async def test_a_real_filesystem_server_reads_and_writes_only_where_its_jail_allows(
    client: Any, peer_config: Any
) -> None:
    c, _ = client
    shared = peer_config[2]
    tmp = shared.parent
    (tmp / "beside.txt").write_text("not shared with the jail")
    # the server's own rules allow all of tmp; the kernel shows it only tmp/shared
    inside = await c.call_tool("wide__read_text_file", {"path": str(shared / "hello.txt")})
    assert "hello from the filesystem server" in text(inside)
    beside = await c.call_tool("wide__read_text_file", {"path": str(tmp / "beside.txt")})
    assert beside.is_error and "not shared with the jail" not in text(beside)
    listing = await c.call_tool("wide__list_directory", {"path": str(tmp)})
    assert "beside.txt" not in text(listing) and "cellblock.yaml" not in text(listing)
    wrote = await c.call_tool("wide__write_file", {"path": str(shared / "new.txt"), "content": "written"})
    assert not wrote.is_error and (shared / "new.txt").read_text() == "written"
    # outside the share the write lands in the jail's private /tmp (these paths are under /tmp)
    # and is gone with it; the host never sees it
    await c.call_tool("wide__write_file", {"path": str(tmp / "planted.txt"), "content": "x"})
    assert not (tmp / "planted.txt").exists()


async def test_real_server_progress_is_forwarded(client: Any) -> None:
    c, _ = client
    seen: list[float] = []

    async def progress(value: float, total: float | None, message: str | None) -> None:
        seen.append(value)

    result = await c.call_tool(
        "everything__trigger-long-running-operation", {"duration": 1, "steps": 2}, progress_callback=progress
    )
    assert not result.is_error
    assert seen == [1, 2]


async def test_real_server_elicitation_is_forwarded_and_answered(client: Any) -> None:
    c, asked = client
    result = await c.call_tool("everything__trigger-elicitation-request", {})
    assert asked.messages, "the server's question never reached the client"
    assert asked.messages[-1].startswith("Question from server 'everything' (not a Cellblock approval):\n")
    assert "Ada" in text(result)


async def test_a_tool_the_real_server_runs_only_as_a_task_is_called_and_asks_on_the_way(client: Any) -> None:
    c, asked = client
    tools = {t.name: t for t in (await c.list_tools()).tools}
    # the server says it runs this one only as a 2025-11-25 task; the gateway drives the task itself
    assert tools["everything__simulate-research-query"].execution is None
    before = len(asked.messages)
    result = await c.call_tool("everything__simulate-research-query", {"topic": "python", "ambiguous": True})
    assert not result.is_error, text(result)
    assert "Research Report" in text(result) and "python" in text(result)
    [question] = asked.messages[before:]
    assert question.startswith("Question from server 'everything' (not a Cellblock approval):\n")
    assert "interpretations" in question
    assert "io.modelcontextprotocol/related-task" not in (result.meta or {})


async def test_inspector_cli_lists_and_calls_through_the_gateway(peer_config: Any) -> None:
    config, state, *_ = peer_config
    # the Inspector reads --config itself, so the gateway gets its config from the environment
    env = ["-e", f"CELLBLOCK_STATE_DIR={state}", "-e", f"CELLBLOCK_CONFIG={config}"]
    base = [*peers.inspector_cli(), *env, sys.executable, "-m", "cellblock.gateway.cli.main", "serve"]

    def run(*args: str) -> dict[str, Any]:
        done = subprocess.run(
            [*base, *args], capture_output=True, text=True, timeout=120, env=peers.peer_env(), check=False
        )
        assert done.returncode == 0, done.stderr[-2000:]
        return json.loads(done.stdout)

    listed = await anyio.to_thread.run_sync(run, "--method", "tools/list")
    names = {t["name"] for t in listed["tools"]}
    assert {"everything__echo", "time__get_current_time"} <= names
    called = await anyio.to_thread.run_sync(
        run, "--method", "tools/call", "--tool-name", "everything__echo", "--tool-arg", "message=inspected"
    )
    assert "inspected" in json.dumps(called)


async def test_roots_are_the_users_directories_never_the_servers_install_or_a_package_cache(
    client: Any, peer_config: Any
) -> None:
    c, _ = client
    _, _, shared, _ = peer_config
    listed = text(await c.call_tool("everything__get-roots-list", {}))
    assert (shared.parent / "granted").as_uri() in listed  # its one granted directory
    assert listed.count("file://") == 1  # not the node_modules it runs from
    # server-filesystem takes the roots as the directories it may touch: its cache is not one
    allowed = text(await c.call_tool("files__list_allowed_directories", {}))
    assert str(shared) in allowed and "npm-files" not in allowed, allowed


async def test_a_real_server_allowed_only_git_still_works_and_runs_nothing_else(client: Any, peer_config: Any) -> None:
    c, _ = client
    repo = peer_config[3]
    status = await c.call_tool("gitonly__git_status", {"repo_path": str(repo)})
    assert not status.is_error and "b.txt" in text(status), text(status)
    log = await c.call_tool("gitonly__git_log", {"repo_path": str(repo)})
    assert "first" in text(log), text(log)
