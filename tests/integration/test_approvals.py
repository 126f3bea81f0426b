"""`ask` answered by a human, through the client's elicitation, in both protocol eras.

The gateway runs in memory (tests/harness.py); where `cellblock approve`, `deny`, `ps`, `pending`
or `revoke` reach it, it serves its control socket in the test's runtime dir, as `cellblock serve`
does."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import mcp.types as types
import pytest

from cellblock.gateway.ask import elicitation
from tests.harness import build, connected
from tests.integration.conftest import probe_server, write_config

pytestmark = pytest.mark.anyio

ASK_ECHO = {"default": "deny", "rules": {"echo": "ask", "slow": "allow"}}


def text(result: types.CallToolResult) -> str:
    return " ".join(c.text for c in result.content if isinstance(c, types.TextContent))


class Human:
    """Answers approval questions as told, and remembers what it was asked."""

    def __init__(self, decision: str = "allow_once", action: str = "accept", delay: float = 0) -> None:
        self.decision, self.action, self.delay = decision, action, delay
        self.asked: list[str] = []

    async def __call__(self, ctx: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        self.asked.append(params.message)
        if self.delay:
            await anyio.sleep(self.delay)
        content = {"decision": self.decision} if self.action == "accept" else None
        return types.ElicitResult(action=self.action, content=content)


def config(tmp_path: Path, timeout: float = 5) -> Path:
    return write_config(tmp_path, {"p": probe_server("--name", "p", tools=ASK_ECHO)}, approvals={"timeout": timeout})


def events(state: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (state / "audit.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_allow_once_forwards_the_call_and_asks_again_next_time(tmp_path: Path, mode: str) -> None:
    human = Human("allow_once")
    async with connected(build(config(tmp_path), tmp_path / "state"), mode=mode, elicitation_callback=human) as client:
        assert text(await client.call_tool("p__echo", {"message": "first"})) == "first"
        assert text(await client.call_tool("p__echo", {"message": "second"})) == "second"
    assert len(human.asked) == 2
    assert human.asked[0].startswith("Cellblock approval · server 'p' · ") and 'tool "echo"' in human.asked[0]
    assert '"first"' in human.asked[0]
    granted = [e for e in events(tmp_path / "state") if e["event"] == "approval_granted"]
    assert [e["scope"] for e in granted] == ["once", "once"]


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_allow_for_the_session_is_not_asked_again(tmp_path: Path, mode: str) -> None:
    human = Human("allow_session")
    async with connected(build(config(tmp_path), tmp_path / "state"), mode=mode, elicitation_callback=human) as client:
        for message in ("a", "b", "c"):
            assert text(await client.call_tool("p__echo", {"message": message})) == message
    assert len(human.asked) == 1
    assert not (tmp_path / "state" / "approvals.json").exists()  # session only: nothing stored


@pytest.mark.parametrize(("decision", "action"), [("deny", "accept"), ("allow_once", "decline"), ("x", "cancel")])
@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_deny_decline_and_cancel_refuse_the_call(tmp_path: Path, mode: str, decision: str, action: str) -> None:
    human = Human(decision, action)
    async with connected(build(config(tmp_path), tmp_path / "state"), mode=mode, elicitation_callback=human) as client:
        refused = await client.call_tool("p__echo", {"message": "no"})
    assert refused.is_error and "did not get it" in text(refused)
    assert not [e for e in events(tmp_path / "state") if e["event"] == "call_end"]  # never forwarded


async def test_no_answer_in_time_refuses(tmp_path: Path) -> None:
    human = Human("allow_once", delay=3)
    served = build(config(tmp_path, timeout=1), tmp_path / "state")
    async with connected(served, mode="legacy", elicitation_callback=human) as c:
        refused = await c.call_tool("p__echo", {"message": "late"})
    assert refused.is_error and "no answer within 1s" in text(refused)
    assert any(e["event"] == "approval_timeout" for e in events(tmp_path / "state"))


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_always_survives_a_restart_and_revoke_takes_it_back(tmp_path: Path, mode: str) -> None:
    state = tmp_path / "state"
    human = Human("allow_always")
    async with connected(build(config(tmp_path), state), mode=mode, elicitation_callback=human) as client:
        assert text(await client.call_tool("p__echo", {"message": "x"})) == "x"
    stored = json.loads((state / "approvals.json").read_text())
    assert stored["always"] == {"p": ["echo"]} and oct((state / "approvals.json").stat().st_mode & 0o777) == "0o600"
    async with connected(build(config(tmp_path), state), mode=mode, elicitation_callback=human) as client:
        assert text(await client.call_tool("p__echo", {"message": "y"})) == "y"
        assert len(human.asked) == 1  # remembered across the restart
        target = str(config(tmp_path))
        revoked = await anyio.to_thread.run_sync(lambda: cli(tmp_path, "revoke", "p:echo", "--config", target))
        assert revoked.returncode == 0, revoked.stderr
        # the running gateway sees the revoke without a restart
        assert text(await client.call_tool("p__echo", {"message": "z"})) == "z"
        assert len(human.asked) == 2
    assert any(e["event"] == "approval_revoked" for e in events(state))


async def test_revoke_takes_a_session_approval_back_from_the_running_gateway_at_once(tmp_path: Path) -> None:
    state, human = tmp_path / "state", Human("allow_session")
    served = build(config(tmp_path), state, runtime=tmp_path / "run")
    async with connected(served, mode="legacy", elicitation_callback=human) as client:
        assert text(await client.call_tool("p__echo", {"message": "a"})) == "a"
        # the control: while the session approval stands, the next call runs unasked
        assert text(await client.call_tool("p__echo", {"message": "b"})) == "b" and len(human.asked) == 1
        target = str(config(tmp_path))
        revoked = await anyio.to_thread.run_sync(lambda: cli(tmp_path, "revoke", "p:echo", "--config", target))
        assert text(await client.call_tool("p__echo", {"message": "c"})) == "c"
        assert len(human.asked) == 2  # asked again, without a restart
        assert revoked.returncode == 0 and "revoked p:echo (for this session, in gateway " in revoked.stderr, revoked
    [event] = [e for e in events(state) if e["event"] == "approval_revoked"]
    assert (event["server"], event["tool"], event["scope"]) == ("p", "echo", "session")


async def test_a_deny_rule_is_never_asked_and_never_remembered_into_allow(tmp_path: Path) -> None:
    human = Human("allow_always")
    async with connected(
        build(config(tmp_path), tmp_path / "state"), mode="legacy", elicitation_callback=human
    ) as client:
        refused = await client.call_tool("p__crash", {})
    assert refused.is_error and text(refused).startswith("denied by policy:") and human.asked == []


async def test_a_2026_approval_state_cannot_be_forged_replayed_or_moved_to_other_arguments(tmp_path: Path) -> None:
    human = Human("allow_once")
    async with connected(
        build(config(tmp_path), tmp_path / "state"), mode="auto", elicitation_callback=human
    ) as client:
        session = client.session
        first = await session.call_tool("p__echo", {"message": "a"}, allow_input_required=True)
        assert isinstance(first, types.InputRequiredResult)
        state = first.request_state
        assert state
        yes = {
            key: types.ElicitResult(action="accept", content={"decision": "allow_once"}) for key in first.input_requests
        }

        async def retry(arguments: dict[str, Any], request_state: str) -> Any:
            return await session.call_tool(
                "p__echo", arguments, input_responses=yes, request_state=request_state, allow_input_required=True
            )

        other = await retry({"message": "b"}, state)
        assert other.is_error and "different call" in text(other)
        forged = await retry({"message": "a"}, state[:-4] + "0000")
        assert forged.is_error and "does not verify" in text(forged)
        good = await retry({"message": "a"}, state)
        assert text(good) == "a"
        replayed = await retry({"message": "a"}, state)
        assert replayed.is_error and "already used" in text(replayed)


def cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CELLBLOCK_STATE_DIR": str(tmp_path / "state"), "XDG_RUNTIME_DIR": str(tmp_path / "run")}
    argv = [sys.executable, "-m", "cellblock.gateway.cli.main", *args]
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60, check=False)


async def pending_ids(tmp_path: Path, count: int) -> list[str]:
    """The ids `cellblock pending` shows, once there are `count` (another process; polling is all there is)."""
    with anyio.fail_after(20):
        while True:
            done = await anyio.to_thread.run_sync(lambda: cli(tmp_path, "pending", "--json"))
            items = json.loads(done.stdout or "[]")
            if len(items) >= count:
                return [item["id"] for item in sorted(items, key=lambda i: i["server"])]
            await anyio.sleep(0.2)


async def test_a_client_that_cannot_elicit_is_answered_from_the_cli(tmp_path: Path) -> None:
    servers = {
        "a": probe_server("--name", "a", tools=ASK_ECHO),
        "b": probe_server("--name", "b", tools=ASK_ECHO),
    }
    config = write_config(tmp_path, servers, approvals={"timeout": 30})
    results: dict[str, types.CallToolResult] = {}
    async with connected(build(config, tmp_path / "state", runtime=tmp_path / "run")) as client:

        async def call(server: str) -> None:
            results[server] = await client.call_tool(f"{server}__echo", {"message": f"from {server}"})

        async with anyio.create_task_group() as tg:
            tg.start_soon(call, "a")
            tg.start_soon(call, "b")  # two questions waiting at once, on different servers
            first, second = await pending_ids(tmp_path, 2)
            ps = json.loads((await anyio.to_thread.run_sync(lambda: cli(tmp_path, "ps", "--json"))).stdout)
            assert len(ps) == 1 and ps[0]["pending"] == 2
            assert {(s["name"], s["state"], s["jail"]) for s in ps[0]["servers"]} == {
                ("a", "ready", "none"),
                ("b", "ready", "none"),
            }
            shown = json.loads((await anyio.to_thread.run_sync(lambda: cli(tmp_path, "pending", "--json"))).stdout)
            assert {tuple(item["arguments"]) for item in shown} == {('"message": "from a"',), ('"message": "from b"',)}
            # the time the call waits is approvals.timeout, not the ten minutes its answer counts for a retry
            assert all(item["waits_until"] - item["created"] == 30 for item in shown)
            table = (await anyio.to_thread.run_sync(lambda: cli(tmp_path, "pending"))).stdout.splitlines()
            assert all(0 < int(row.split("\t")[4].removesuffix("s")) <= 30 for row in table[1:3]), table
            approved = await anyio.to_thread.run_sync(lambda: cli(tmp_path, "approve", first, "--config", str(config)))
            assert approved.returncode == 0, approved.stderr
            denied = await anyio.to_thread.run_sync(lambda: cli(tmp_path, "deny", second))
            assert denied.returncode == 0, denied.stderr
    assert text(results["a"]) == "from a"
    assert results["b"].is_error and "denied from the CLI" in text(results["b"])
    unknown = cli(tmp_path, "approve", "nosuchid", "--config", str(config))
    assert unknown.returncode == 1 and "no pending approval" in unknown.stderr


async def test_an_expired_2026_approval_state_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [time.time()]  # the clock sealed states expire by stands still until the test moves it
    monkeypatch.setattr(elicitation, "now", lambda: clock[0])
    async with connected(
        build(config(tmp_path, timeout=1), tmp_path / "state"), mode="auto", elicitation_callback=Human()
    ) as c:
        forms: dict[str, types.InputRequiredResult] = {}
        for message in ("held", "late"):  # two forms, sealed at the same moment
            form = await c.session.call_tool("p__echo", {"message": message}, allow_input_required=True)
            assert isinstance(form, types.InputRequiredResult) and form.request_state
            forms[message] = form

        async def retry(message: str) -> Any:
            yes = {
                key: types.ElicitResult(action="accept", content={"decision": "allow_once"})
                for key in forms[message].input_requests
            }
            return await c.session.call_tool(
                "p__echo",
                {"message": message},
                input_responses=yes,
                request_state=forms[message].request_state,
                allow_input_required=True,
            )

        # a state's lifetime is approvals.timeout (1 s)
        clock[0] += 0.9
        assert text(await retry("held")) == "held"  # the control: just within its lifetime the state holds
        clock[0] += 0.2
        late = await retry("late")
        assert late.is_error and "expired" in text(late)


@pytest.mark.parametrize(("answer", "mode"), [("approve", "legacy"), ("approve", "auto"), ("keep_held", "legacy")])
async def test_a_held_catalog_can_be_approved_through_the_form(tmp_path: Path, answer: str, mode: str) -> None:
    human = Human(answer)
    server = probe_server("--name", "p", tools={"default": "allow"}, lock={"enabled": True, "first": "review"})
    state = tmp_path / "state"
    async with connected(
        build(write_config(tmp_path, {"p": server}), state), mode=mode, elicitation_callback=human
    ) as client:
        result = await client.call_tool("p__echo", {"message": "after review"})
        listed = {t.name for t in (await client.list_tools()).tools}
    assert len(human.asked) == 1 and "server 'p' is new" in human.asked[0] and "tool:echo" in human.asked[0]
    if answer == "approve":
        assert text(result) == "after review" and "p__echo" in listed
        assert (state / "locks" / "p.json").exists()
    else:
        assert result.is_error and "cellblock approve p" in text(result) and "p__echo" not in listed


@pytest.mark.parametrize(("answer", "mode"), [("approve", "legacy"), ("approve", "auto"), ("keep_held", "auto")])
async def test_at_first_contact_the_review_tool_asks_the_user_in_the_clients_form(
    tmp_path: Path, answer: str, mode: str
) -> None:
    human = Human(answer)
    server = probe_server("--name", "p", tools={"default": "allow"}, lock={"enabled": True, "first": "review"})
    state = tmp_path / "state"
    async with connected(
        build(write_config(tmp_path, {"p": server}), state), mode=mode, elicitation_callback=human
    ) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        assert set(tools) == {"cellblock__status", "cellblock__review"}  # the model knows no held tool's name
        assert tools["cellblock__review"].input_schema["properties"] == {"server": {"type": "string", "enum": ["p"]}}
        # no decision can be passed in: only the user's answer approves
        forged = await client.call_tool("cellblock__review", {"server": "p", "decision": "approve"})
        assert forged.is_error and not human.asked and not (state / "locks" / "p.json").exists()
        result = await client.call_tool("cellblock__review", {"server": "p"})
        listed = {t.name for t in (await client.list_tools()).tools}
    assert len(human.asked) == 1 and "server 'p' is new" in human.asked[0] and "tool:echo" in human.asked[0]
    if answer == "approve":
        assert "approved the catalog of 'p'" in text(result) and "p__echo" in listed
        assert (state / "locks" / "p.json").exists()
        assert [e["via"] for e in events(state) if e["event"] == "lock_approved"] == ["elicitation"]
    else:
        assert "keeps the catalog of 'p' held" in text(result) and "p__echo" not in listed
        assert not (state / "locks" / "p.json").exists()


async def test_the_review_tool_in_a_client_without_forms_says_what_the_user_runs(tmp_path: Path) -> None:
    server = probe_server("--name", "p", lock={"enabled": True, "first": "review"})
    state = tmp_path / "state"
    async with connected(build(write_config(tmp_path, {"p": server}), state)) as client:
        result = await client.call_tool("cellblock__review", {"server": "p"})
    assert result.is_error and "`cellblock review`" in text(result)
    assert not (state / "locks" / "p.json").exists()


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_a_call_waiting_on_the_cli_tells_the_client_how_to_answer_and_shows_it_on_the_desktop(
    tmp_path: Path, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a client that cannot elicit: before, the call waited in silence until someone looked
    shown = tmp_path / "notified"
    desktop = tmp_path / "bin"
    desktop.mkdir()
    (desktop / "notify-send").write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" >> "{shown}"\n')  # the desktop's part
    (desktop / "notify-send").chmod(0o755)
    monkeypatch.setenv("PATH", f"{desktop}:{os.environ['PATH']}")  # the gateway's, in this process
    heard: list[str] = []

    def hear(message: str) -> None:
        heard.append(message)
        if "cellblock approve" in message:
            told.set()

    async def log(params: types.LoggingMessageNotificationParams) -> None:
        hear(str(params.data))

    async def progress(value: float, total: float | None, message: str | None) -> None:
        hear(message or "")

    # a 2026-07-28 client hears logs only on requests that opt in: it says which level it wants
    served = build(config(tmp_path, timeout=30), tmp_path / "state", runtime=tmp_path / "run")
    async with connected(served, mode=mode, logging_callback=log, log_level="info") as client:
        result: list[types.CallToolResult] = []

        async def call(**extra: Any) -> None:
            result.append(await client.call_tool("p__echo", {"message": "waited"}, **extra))

        for extra in ({}, {"progress_callback": progress}):  # a log message, or progress where it asked
            heard.clear()
            told = anyio.Event()  # set once the client has heard how to approve the call
            async with anyio.create_task_group() as tg:
                tg.start_soon(functools.partial(call, **extra))
                (ident,) = await pending_ids(tmp_path, 1)
                with anyio.fail_after(10):
                    await told.wait()
                assert any(f"cellblock approve {ident}" in h for h in heard), heard
                assert any("waits up to 30s for the user's approval" in h for h in heard), heard
                approved = await anyio.to_thread.run_sync(cli, tmp_path, "approve", ident)
                assert approved.returncode == 0, approved.stderr
            assert text(result[-1]) == "waited"
            assert f"cellblock approve {ident}" in shown.read_text()
