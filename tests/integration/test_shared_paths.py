"""A path in a call's arguments that the jail does not share is asked about, never silently written
into the server's private home (docs/jail.md, "Paths a call names"; gateway/serve/shares.py).

Each test runs the keeper test server (tests/servers/keeper.py: `save(path, text)` writes a file
where its argument says) jailed with nothing of the home shared, through the real `cellblock
serve`, with a home of the test's own (HOME, USER, PATH as a client passes them), and judges by
what is on the host afterwards: in the home the user named, and in the server's private home.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import mcp.types as types
import pytest
import yaml

from cellblock.gateway.cli.gateways import running
from cellblock.gateway.serve.control import request
from tests.integration.conftest import cli, gateway, write_config
from tests.integration.test_kept_data import client_env, keeper, kept_at

pytestmark = [pytest.mark.anyio, pytest.mark.jail]


def _text(result: types.CallToolResult) -> str:
    return "".join(getattr(c, "text", "") for c in result.content)


def human(decision: str, asked: list[str]) -> Callable[..., Awaitable[types.ElicitResult]]:
    """A user who answers each share question with `decision` (any other question: deny), keeping them in `asked`."""

    async def answer(ctx: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params.message)
        share = " · share " in params.message.split("\n")[0]
        return types.ElicitResult(action="accept", content={"decision": decision if share else "deny"})

    return answer


def setup(tmp_path: Path, **top: Any) -> tuple[Path, dict[str, str], Path]:
    home = tmp_path / "home"
    home.mkdir()
    return home, client_env(home, tmp_path), write_config(tmp_path, {"k": keeper()}, **top)


def events(tmp_path: Path, name: str) -> list[dict[str, Any]]:
    lines = (tmp_path / "state" / "audit.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == name]


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_a_file_a_call_writes_in_an_unshared_folder_is_shared_once_and_lands_where_the_user_named_it(
    tmp_path: Path, mode: str
) -> None:
    home, env, config = setup(tmp_path)
    before = config.read_text()
    asked: list[str] = []
    user = human("share_once", asked)
    async with gateway(config, tmp_path / "state", env=env, mode=mode, elicitation_callback=user) as client:
        done = await client.call_tool("k__save", {"path": "~/notes/x.txt", "text": "kept where asked"})
        assert not done.is_error, _text(done)
        # shared until the server stops: a second file there is not asked about
        again = await client.call_tool("k__save", {"path": str(home / "notes" / "y.txt"), "text": "too"})
        assert not again.is_error, _text(again)
    assert (home / "notes" / "x.txt").read_text() == "kept where asked"
    assert (home / "notes" / "y.txt").read_text() == "too"
    # not in the private home (where the jail made the mount point of the grant, empty)
    assert not any((kept_at(home, "k") / "notes").iterdir())
    assert len(asked) == 1 and f'share read-write "{home / "notes"}"' in asked[0], asked
    assert config.read_text() == before  # once: nothing written to the config
    assert [e["path"] for e in events(tmp_path, "share")] == [str(home / "notes")]


async def test_a_file_a_read_only_tool_reads_is_shared_alone_and_read_only(tmp_path: Path) -> None:
    home, env, config = setup(tmp_path)
    (home / "doc.txt").write_text("the user's own")
    asked: list[str] = []
    async with gateway(config, tmp_path / "state", env=env, elicitation_callback=human("share_once", asked)) as client:
        read = await client.call_tool("k__peek", {"path": "~/doc.txt"})
        assert not read.is_error and _text(read) == "the user's own", _text(read)
        # what does not exist is not shared for a read: nothing asked, the server says it is not there
        missing = await client.call_tool("k__peek", {"path": "~/nothing.txt"})
        assert missing.is_error and "No such file" in _text(missing)
    assert len(asked) == 1 and f'share read-only "{home / "doc.txt"}"' in asked[0], asked
    assert [(e["path"], e["mode"]) for e in events(tmp_path, "share")] == [(str(home / "doc.txt"), "read_only")]


async def test_a_denied_share_refuses_the_call_naming_the_path_and_nothing_is_written_anywhere(tmp_path: Path) -> None:
    home, env, config = setup(tmp_path)
    asked: list[str] = []
    user = human("deny", asked)
    async with gateway(config, tmp_path / "state", env=env, elicitation_callback=user) as client:
        refused = await client.call_tool("k__save", {"path": "~/notes/x.txt", "text": "lost?"})
    assert refused.is_error and "~/notes/x.txt" in _text(refused) and "did not share it" in _text(refused)
    notes = home / "notes"
    assert f"run 'mkdir -p {notes} && cellblock share k {notes}'" in _text(refused)  # the fix
    assert len(asked) == 1
    assert not (home / "notes").exists()
    assert not (kept_at(home, "k") / "notes").exists()


async def test_the_command_a_denied_share_names_shares_the_path_with_the_running_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`cellblock share`, run while the gateway serves the config, writes the grant and restarts the
    server with it: the call the user denied runs when made again, unasked. The gateway judges what
    it is told again: a share of ~/.ssh sent to its control socket directly is refused."""
    home, env, config = setup(tmp_path)
    (home / ".ssh").mkdir()
    asked: list[str] = []
    user = human("deny", asked)
    async with gateway(config, tmp_path / "state", env=env, elicitation_callback=user) as client:
        refused = await client.call_tool("k__save", {"path": "~/notes/x.txt", "text": "second try"})
        command = re.search(r"run '([^']+)'", _text(refused))
        assert command is not None, _text(refused)
        made, _, share = command.group(1).partition(" && ")
        assert made == f"mkdir -p {home / 'notes'}" and share.startswith("cellblock share k "), command.group(1)
        (home / "notes").mkdir()
        done = cli(env, *share.split()[1:], "--config", str(config))
        assert done.returncode == 0 and "restarted 'k' with it" in done.stderr, done.stderr
        again = await client.call_tool("k__save", {"path": "~/notes/x.txt", "text": "second try"})
        assert not again.is_error, _text(again)
        monkeypatch.setenv("XDG_RUNTIME_DIR", env["XDG_RUNTIME_DIR"])
        [socket] = running()
        told = request(
            socket,
            {"op": "share", "server": "k", "path": str(home / ".ssh"), "write": True, "config": str(config.resolve())},
        )
        assert not told["ok"] and "looks like a secret" in told["error"], told
        planted = await client.call_tool("k__save", {"path": "~/.ssh/planted", "text": "no"})
    assert (home / "notes" / "x.txt").read_text() == "second try"
    assert len(asked) == 1  # the denied call's; the second call was not asked
    assert yaml.safe_load(config.read_text())["servers"]["k"]["jail"]["read_write"] == [str(home / "notes")]
    assert planted.is_error and not (home / ".ssh" / "planted").exists()
    assert [e["path"] for e in events(tmp_path, "share")] == [str(home / "notes")]


async def test_the_command_restarts_the_gateway_of_its_config_named_through_a_link_and_no_other(
    tmp_path: Path,
) -> None:
    """`cellblock share k ~/notes --config LINK` (a link to the config one gateway serves): that
    gateway's 'k' writes into ~/notes unasked; a second gateway, of another config with a server
    'k' too, is told nothing and still asks (and is denied). Its config stays as it was."""
    home, env, config = setup(tmp_path)
    (home / "notes").mkdir()
    other_dir = tmp_path / "other"
    other_dir.mkdir()
    other = write_config(other_dir, {"k": keeper()})
    other_text = other.read_text()
    link = tmp_path / "linked.yaml"
    link.symlink_to(config)
    asked: list[str] = []
    user = human("deny", asked)
    other_env = {**env, "CELLBLOCK_STATE_DIR": str(other_dir / "state")}  # the same runtime dir: `running` sees both
    async with (
        gateway(config, tmp_path / "state", env=env, elicitation_callback=user) as ours,
        gateway(other, other_dir / "state", env=other_env, elicitation_callback=user) as theirs,
    ):
        await ours.list_tools()  # both serve before the command looks for them
        await theirs.list_tools()
        done = cli(env, "share", "k", str(home / "notes"), "--config", str(link))
        assert done.returncode == 0 and done.stderr.count("restarted 'k' with it") == 1, done.stderr
        written = await ours.call_tool("k__save", {"path": "~/notes/ours.txt", "text": "shared"})
        refused = await theirs.call_tool("k__save", {"path": "~/notes/theirs.txt", "text": "not shared"})
    assert not written.is_error and (home / "notes" / "ours.txt").read_text() == "shared", _text(written)
    assert refused.is_error and not (home / "notes" / "theirs.txt").exists(), _text(refused)
    assert len(asked) == 1  # theirs: the share of ~/notes, denied
    assert link.is_symlink() and other.read_text() == other_text
    assert yaml.safe_load(config.read_text())["servers"]["k"]["jail"]["read_write"] == [str(home / "notes")]


async def test_a_share_op_for_a_path_that_does_not_exist_is_refused_and_the_server_keeps_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`cellblock share` refuses a path that does not exist; the op it sends must too (the path gone
    since, or a process of the user's sending it): a jail granting a missing path does not build,
    so the server would be down. The control: the same op for a folder that exists is applied."""
    home, env, config = setup(tmp_path)
    (home / "notes").mkdir()
    monkeypatch.setenv("XDG_RUNTIME_DIR", env["XDG_RUNTIME_DIR"])
    op = {"op": "share", "server": "k", "write": True, "config": str(config.resolve())}
    async with gateway(config, tmp_path / "state", env=env, elicitation_callback=human("deny", [])) as client:
        await client.list_tools()
        [socket] = running()
        missing = request(socket, {**op, "path": str(home / "gone")})
        applied = request(socket, {**op, "path": str(home / "notes")})
        done = await client.call_tool("k__save", {"path": "~/notes/x.txt", "text": "still running"})
    assert not missing["ok"] and "does not exist" in missing["error"], missing
    assert applied == {"ok": True, "applied": True}, applied
    assert not done.is_error and (home / "notes" / "x.txt").read_text() == "still running", _text(done)
    assert not (home / "gone").exists() and [e["path"] for e in events(tmp_path, "share")] == [str(home / "notes")]


async def pending(env: dict[str, str]) -> list[dict[str, Any]]:
    """What `cellblock pending` shows, once it shows something (each look is a CLI run)."""
    with anyio.fail_after(60):
        while True:
            done = await anyio.to_thread.run_sync(lambda: cli(env, "pending", "--json"))
            items: list[dict[str, Any]] = json.loads(done.stdout or "[]")
            if items:
                return items


async def test_a_share_approved_always_from_the_terminal_is_written_to_the_config_and_not_asked_again(
    tmp_path: Path,
) -> None:
    home, env, config = setup(tmp_path, approvals={"timeout": 60})
    results: list[types.CallToolResult] = []
    async with gateway(config, tmp_path / "state", env=env) as client:  # a client with no forms

        async def call() -> None:
            results.append(await client.call_tool("k__save", {"path": "~/notes/x.txt", "text": "always"}))

        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            [item] = await pending(env)
            assert item["kind"] == "share" and item["tool"] == f"read_write:{home / 'notes'}", item
            session = cli(env, "approve", item["id"], "--session")
            assert session.returncode == 1 and "not --session" in session.stderr, session.stderr
            approved = cli(env, "approve", item["id"], "--always")
            assert approved.returncode == 0, approved.stderr
        assert not results[0].is_error, _text(results[0])
        again = await client.call_tool("k__save", {"path": "~/notes/y.txt", "text": "no question"})
        assert not again.is_error, _text(again)
    jail = yaml.safe_load(config.read_text())["servers"]["k"]["jail"]
    assert jail["read_write"] == [str(home / "notes")]
    assert (home / "notes" / "x.txt").read_text() == "always" and (
        home / "notes" / "y.txt"
    ).read_text() == "no question"
    assert len(events(tmp_path, "approval_asked")) == 1
    # the next gateway starts the server with the grant from the config: no question either
    async with gateway(config, tmp_path / "state", env=env) as client:
        third = await client.call_tool("k__save", {"path": "~/notes/z.txt", "text": "from the config"})
        assert not third.is_error, _text(third)
    assert (home / "notes" / "z.txt").read_text() == "from the config"


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("~/.ssh/x", "looks like a secret"),
        ("~/.bashrc", "a hidden entry"),
        ("~", "your home"),
        ("~/.local/share/cellblock/homes/k/x", "Cellblock's own"),
    ],
)
async def test_a_path_the_gate_forbids_is_refused_with_no_question(tmp_path: Path, path: str, why: str) -> None:
    home, env, config = setup(tmp_path)
    (home / ".ssh").mkdir()
    asked: list[str] = []
    user = human("share_always", asked)  # would share anything it were asked
    async with gateway(config, tmp_path / "state", env=env, elicitation_callback=user) as client:
        refused = await client.call_tool("k__save", {"path": path, "text": "planted"})
    assert refused.is_error and path in _text(refused) and why in _text(refused), _text(refused)
    assert asked == []
    assert not (home / ".ssh" / "x").exists() and not (home / ".bashrc").exists()
    assert "read_write" not in yaml.safe_load(config.read_text())["servers"]["k"]["jail"]


async def test_a_write_in_a_folder_holding_a_cellblock_config_is_refused_and_the_config_stays_as_it_was(
    tmp_path: Path,
) -> None:
    """A server that could write a project's cellblock.yaml would give itself `jail: false` in it
    (another gateway's config, or one the user starts later). The control, in the same gateway: the
    same call in a plain folder is asked about, shared and written."""
    home, env, config = setup(tmp_path)
    project = home / "project"
    project.mkdir()
    held = "version: 1\nservers: {}\n"
    (project / "cellblock.yaml").write_text(held)
    asked: list[str] = []
    user = human("share_always", asked)  # would share anything it were asked
    async with gateway(config, tmp_path / "state", env=env, elicitation_callback=user) as client:
        plain = await client.call_tool("k__save", {"path": "~/plain/x.txt", "text": "control"})
        refused = await client.call_tool("k__save", {"path": "~/project/cellblock.yaml", "text": "jail: false"})
        beside = await client.call_tool("k__save", {"path": "~/project/x.txt", "text": "planted"})
    assert not plain.is_error and (home / "plain" / "x.txt").read_text() == "control", _text(plain)
    for result in (refused, beside):
        assert result.is_error and "Cellblock starts the servers it lists" in _text(result), _text(result)
    assert len(asked) == 1
    assert (project / "cellblock.yaml").read_text() == held and not (project / "x.txt").exists()
    assert yaml.safe_load(config.read_text())["servers"]["k"]["jail"]["read_write"] == [str(home / "plain")]


async def test_the_control_a_folder_the_jail_shares_is_written_with_no_question(tmp_path: Path) -> None:
    """The honest control: the same call to a server whose jail shares ~/notes writes the file."""
    home = tmp_path / "home"
    (home / "notes").mkdir(parents=True)
    env = client_env(home, tmp_path)
    config = write_config(tmp_path, {"k": keeper(read_write=[str(home / "notes")])})
    asked: list[str] = []
    user = human("deny", asked)
    async with gateway(config, tmp_path / "state", env=env, elicitation_callback=user) as client:
        done = await client.call_tool("k__save", {"path": "~/notes/x.txt", "text": "shared already"})
    assert not done.is_error and asked == []
    assert (home / "notes" / "x.txt").read_text() == "shared already"


async def test_a_policy_under_constraint_refuses_before_any_share_is_asked(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    env = client_env(home, tmp_path)
    rule = {"decision": "allow", "args": {"path": {"under": ["~/allowed"]}}}
    server = keeper() | {"tools": {"default": "deny", "rules": {"save": rule}}}
    config = write_config(tmp_path, {"k": server})
    asked: list[str] = []
    user = human("share_once", asked)
    async with gateway(config, tmp_path / "state", env=env, elicitation_callback=user) as client:
        refused = await client.call_tool("k__save", {"path": "~/notes/x.txt", "text": "no"})
    assert refused.is_error and "denied by policy" in _text(refused), _text(refused)
    assert asked == [] and not (home / "notes").exists()


async def test_shares_one_after_another_restart_the_server_each_time_and_never_count_as_its_failures(
    tmp_path: Path,
) -> None:
    """Six folders shared within seconds: six restarts, none a failure of the server's (five quick
    failures in a row are what make the gateway give a server up)."""
    home, env, config = setup(tmp_path)
    asked: list[str] = []
    async with gateway(config, tmp_path / "state", env=env, elicitation_callback=human("share_once", asked)) as client:
        for n in range(6):
            done = await client.call_tool("k__save", {"path": f"~/n{n}/x.txt", "text": str(n)})
            assert not done.is_error, (n, _text(done))
    assert [(home / f"n{n}" / "x.txt").read_text() for n in range(6)] == [str(n) for n in range(6)]
    assert len(asked) == 6 and not events(tmp_path, "server_failed")


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_a_call_that_asks_is_asked_about_its_path_first_and_then_itself_each_answer_for_its_own_question(
    tmp_path: Path, mode: str
) -> None:
    """The share's answer never approves the call (nor the call's a share): a 2026-07-28 retry carries
    one answer, and the next question is asked anew."""
    home = tmp_path / "home"
    home.mkdir()
    env = client_env(home, tmp_path)
    config = write_config(tmp_path, {"k": keeper() | {"tools": {"default": "deny", "rules": {"save": "ask"}}}})
    asked: list[str] = []

    async def user(ctx: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params.message)
        decision = "share_once" if " · share " in params.message.split("\n")[0] else "allow_once"
        return types.ElicitResult(action="accept", content={"decision": decision})

    async with gateway(config, tmp_path / "state", env=env, mode=mode, elicitation_callback=user) as client:
        done = await client.call_tool("k__save", {"path": "~/notes/x.txt", "text": "both"})
        assert not done.is_error, _text(done)
    assert (home / "notes" / "x.txt").read_text() == "both"
    assert [" · share " in q.split("\n")[0] for q in asked] == [True, False], asked


async def test_a_file_a_call_writes_in_tmp_is_not_asked_about_and_stays_in_the_jails_own_tmp(tmp_path: Path) -> None:
    """GAP: a path in /tmp is not asked about (docs/jail.md, "Paths a call names"): the jail's /tmp
    is its own, so what the tool writes there is not on the host, and is gone when the server stops."""
    _, env, config = setup(tmp_path)
    asked: list[str] = []
    target = Path("/tmp") / f"cellblock-gap-{tmp_path.name}.txt"
    async with gateway(config, tmp_path / "state", env=env, elicitation_callback=human("share_once", asked)) as client:
        done = await client.call_tool("k__save", {"path": str(target), "text": "in the jail's /tmp"})
        assert not done.is_error, _text(done)
    assert asked == [] and not target.exists()


async def test_a_jail_whose_call_paths_are_private_keeps_what_a_call_names_in_its_home_unasked(tmp_path: Path) -> None:
    home, env, _ = setup(tmp_path)
    config = write_config(tmp_path, {"k": keeper(call_paths="private")})
    asked: list[str] = []
    async with gateway(config, tmp_path / "state", env=env, elicitation_callback=human("share_once", asked)) as client:
        done = await client.call_tool("k__save", {"path": "~/notes/x.txt", "text": "its own"})
        assert not done.is_error, _text(done)
    assert asked == [] and not (home / "notes").exists()
    assert (kept_at(home, "k") / "notes" / "x.txt").read_text() == "its own"
