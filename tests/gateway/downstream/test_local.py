"""A local server's pipes shared by the SDK session and the fast path's private requests.

Driven against the real probe server (unjailed: the jail is not what these tests are about), with
the SDK's own client on the same pipes, in both eras the probe speaks.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import mcp.types as types
import pytest
from mcp import Client

from cellblock.gateway.downstream.local import LocalChannel, Pending, local_transport
from cellblock.sandbox.spawn import Spawn
from cellblock.sandbox.types import JailError, LaunchPlan, Network
from tests.integration.conftest import eventually

pytestmark = pytest.mark.anyio

PROBE = Path(__file__).resolve().parents[2] / "servers" / "probe.py"
COLLIDER = Path(__file__).resolve().parents[2] / "servers" / "collider.py"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@asynccontextmanager
async def probe(
    tmp_path: Path, mode: str = "legacy", server: Path = PROBE, **client_args: Any
) -> AsyncIterator[tuple[Client, LocalChannel, Path]]:
    """`server` (the probe unless told) on a channel, with the SDK's client (given `client_args`) on its pipes."""
    log = tmp_path / "probe.log"
    plan = LaunchPlan(
        argv=(sys.executable, str(server)),
        env={"PROBE_LOG": str(log)},
        cwd=None,
        mounts=(),
        network=Network.OPEN,
    )
    channel = LocalChannel("probe")
    with (tmp_path / "stderr.log").open("w") as errlog:
        async with Client(local_transport(plan, channel, errlog), mode=mode, cache=None, **client_args) as client:
            await client.list_tools()  # the SDK's own request: the channel learns its envelope
            yield client, channel, log


class Answers:
    def __init__(self) -> None:
        self.done: list[Pending] = []
        self.event = anyio.Event()

    def __call__(self, pending: Pending) -> None:
        self.done.append(pending)
        self.event.set()

    async def wait(self) -> Pending:
        with anyio.fail_after(10):
            await self.event.wait()
        self.event = anyio.Event()
        return self.done[-1]


def call(channel: LocalChannel, tool: str, arguments: dict[str, Any], modern: bool) -> dict[str, Any]:
    params: dict[str, Any] = {"name": tool, "arguments": arguments}
    if modern:
        params["_meta"] = dict(channel.envelope or {})
    return params


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_a_private_request_is_answered_beside_the_sdk_sessions_own(tmp_path: Path, mode: str) -> None:
    async with probe(tmp_path, mode) as (client, channel, _):
        modern = mode == "auto"
        assert (channel.envelope is not None) == modern
        answers = Answers()
        pending = channel.request("tools/call", call(channel, "echo", {"message": "fast"}, modern), 10, answers)
        sdk = await client.call_tool("echo", {"message": "sdk"})  # the session works meanwhile
        assert (await answers.wait()) is pending
        assert pending.response is not None
        assert pending.response["id"] == pending.id and pending.response["result"]["structuredContent"] == {
            "message": "fast"
        }
        assert sdk.structured_content == {"message": "sdk"}


async def test_progress_for_a_private_request_reaches_its_callback(tmp_path: Path) -> None:
    async with probe(tmp_path) as (_, channel, _):
        steps: list[tuple[float, float | None, str | None]] = []
        answers = Answers()
        channel.request(
            "tools/call",
            call(channel, "slow", {"steps": 3, "delay": 0.01}, False),
            10,
            answers,
            lambda value, total, message: steps.append((value, total, message)),
        )
        await answers.wait()
        assert steps == [(1, 3, "step 1/3"), (2, 3, "step 2/3"), (3, 3, "step 3/3")]


async def test_a_request_past_its_timeout_ends_and_the_server_is_told_to_stop(tmp_path: Path) -> None:
    async with probe(tmp_path) as (client, channel, log):
        answers = Answers()
        channel.request("tools/call", call(channel, "hang", {}, False), 0.3, answers)
        pending = await answers.wait()
        assert pending.timed_out and pending.response is None
        await eventually(lambda: log.exists() and "cancelled hang" in log.read_text())
        assert (await client.call_tool("echo", {"message": "after"})).structured_content == {"message": "after"}


async def test_a_cancelled_request_ends_unanswered_and_a_late_answer_to_it_is_dropped(tmp_path: Path) -> None:
    async with probe(tmp_path) as (client, channel, _):
        answers = Answers()
        pending = channel.request("tools/call", call(channel, "hang", {}, False), 10, answers)
        channel.cancel(pending, "cancelled by the client")
        # the server now answers that id anyway (and every other private id it can think of);
        # its lines come before the answer to this call, so they have all been read once it returns
        forged = await client.call_tool("forge", {"first": 1, "last": 50})
        assert forged.structured_content == {"result": "forged"}
        assert answers.done == [] and pending.response is None


async def test_a_server_that_dies_ends_every_private_request_with_no_answer(tmp_path: Path) -> None:
    async with probe(tmp_path) as (_, channel, _):
        answers = Answers()
        waiting = channel.request("tools/call", call(channel, "hang", {}, False), 30, answers)
        channel.request("tools/call", call(channel, "crash", {}, False), 30, answers)
        await answers.wait()
        if len(answers.done) < 2:
            await answers.wait()
        assert all(p.response is None and not p.timed_out for p in answers.done)
        assert waiting in answers.done and not channel.open
        with pytest.raises(OSError):
            channel.request("tools/call", call(channel, "echo", {"message": "x"}, False), 1, answers)


async def test_a_server_that_asks_under_the_id_of_the_call_it_asks_in_gets_no_answer_crossed(tmp_path: Path) -> None:
    """The collider asks its question under the id of the call: the fast path's `cb-1`, or the
    SDK session's own number. Each question is a request (answered by the client), never the
    answer to the call of the same id, and each call gets its own answer."""
    names = iter(["ada", "bob"])
    asked: list[Any] = []

    async def user(context: Any, params: Any) -> types.ElicitResult:
        asked.append(context.request_id)
        return types.ElicitResult(action="accept", content={"name": next(names)})

    async with probe(tmp_path, server=COLLIDER, elicitation_callback=user) as (client, channel, _):
        answers = Answers()
        pending = channel.request("tools/call", call(channel, "ask", {}, False), 10, answers)
        assert (await answers.wait()) is pending and pending.response is not None
        assert pending.response["result"]["content"][0]["text"] == "answer: accept"
        sdk = await client.call_tool("ask", {})  # asked under the session's own number
        assert [c.text for c in sdk.content if isinstance(c, types.TextContent)] == ["answer: accept"]
    assert asked[0] == pending.id and len(asked) == 2 and isinstance(asked[1], int)


async def test_a_jail_is_put_under_its_limits_without_holding_up_the_gateways_other_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Releasing a held jail waits for bubblewrap and runs the tmpfs sizing, a process of its own:
    tens of milliseconds, seconds on a busy machine, for every call of every server meanwhile if
    it ran on the gateway's loop. Here the release waits until another task of the loop has run."""
    began, other_ran = threading.Event(), threading.Event()

    def release(self: Spawn) -> None:
        began.set()
        if not other_ran.wait(5):
            raise JailError("the gateway's other work waited for the jail's release")

    async def other_work() -> None:
        await anyio.to_thread.run_sync(began.wait, 5)
        other_ran.set()  # on the loop: only once the loop is free

    monkeypatch.setattr(Spawn, "release", release)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(other_work)
            async with probe(tmp_path) as (client, _, _):
                assert (await client.list_tools()).tools
