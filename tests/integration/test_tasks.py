"""Tasks (the `io.modelcontextprotocol/tasks` extension) through the gateway: a 2026-07-28
client that declares the extension is answered with a task, to a 2026-07-28 server (`new`) and to
a handshake-era one (`old`). The call is admitted before the task exists, so a denied call never
becomes a task and never reaches its server; the task's id names its server; a question the
server asks midway is the task's input request, answered with tasks/update; tasks/cancel reaches
the server; a server that dies during the call ends its task with the error that says so. The
gateway runs in memory (tests/harness.py)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Literal

import anyio
import mcp.types as types
import pytest
from mcp.client.extension import ClaimContext, ClientExtension, NotificationBinding, ResultClaim
from mcp.shared.exceptions import MCPError
from pydantic import ConfigDict, Field

from cellblock.gateway.serve.tasks import EXTENSION
from tests.harness import build, connected
from tests.integration.conftest import eventually, probe_server, write_config

pytestmark = pytest.mark.anyio

SERVERS = {"old": "legacy", "new": "auto"}  # the server's era: handshake, 2026-07-28
POLICY = {"default": "allow", "rules": {"crash": "deny"}}


class Loose(types.Result):
    """Any result, kept whole: a task is a shape the SDK has no model of."""

    model_config = ConfigDict(extra="allow")


class TaskParams(types.RequestParams):
    model_config = ConfigDict(extra="allow")


class TaskRequest(types.Request[TaskParams, str]):
    method: str
    params: TaskParams


class CreatedTask(types.Result):
    """The answer `resultType: task` to a tools/call."""

    model_config = ConfigDict(extra="allow")
    result_type: Literal["task"] = Field(alias="resultType")


async def _resolved(task: CreatedTask, ctx: ClaimContext) -> types.CallToolResult:
    """What `Client.call_tool` answers with: the task polled to its end, as a client does."""
    ended = await polled(ctx.session, (task.model_extra or {})["taskId"], "completed")
    return types.CallToolResult.model_validate(ended["result"], by_name=False)


async def shows_forms(ctx: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
    """Declares that the client shows forms; a task's questions come as its input requests instead."""
    raise AssertionError("a task's question was sent as a request of its own")


class TaskNotice(types.NotificationParams):
    model_config = ConfigDict(extra="allow")


class TasksClient(ClientExtension):
    """A client that takes tasks: `session.call_tool(allow_claimed=True)` hands the task over,
    `Client.call_tool` polls it to its end, and the task notifications of a listen stream are kept
    (`told`, by task id)."""

    identifier = EXTENSION

    def __init__(self) -> None:
        self.told: dict[str, list[dict[str, Any]]] = {}
        self.arrived = anyio.Event()

    def claims(self) -> list[ResultClaim[Any]]:
        return [ResultClaim(result_type="task", model=CreatedTask, resolve=_resolved)]

    def notifications(self) -> list[NotificationBinding[Any]]:
        return [NotificationBinding(method="notifications/tasks", params_type=TaskNotice, handler=self._told)]

    async def _told(self, params: TaskNotice) -> None:
        task = params.model_dump(by_alias=True, mode="json", exclude_none=True)
        self.told.setdefault(task["taskId"], []).append(task)
        self.arrived.set()

    async def status(self, task_id: str, status: str) -> dict[str, Any]:
        """The first notification of the task in `status`, once it has come."""
        with anyio.fail_after(20):
            while not (told := [t for t in self.told.get(task_id, []) if t["status"] == status]):
                self.arrived = anyio.Event()
                await self.arrived.wait()
        return told[0]


@pytest.fixture(scope="module")
async def session(tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp("tasks")
    servers = {
        name: probe_server(
            "--name", name, protocol=protocol, tools=POLICY, env={"PROBE_LOG": str(tmp / f"{name}.log")}, writable=tmp
        )
        for name, protocol in SERVERS.items()
    }
    config = write_config(tmp, servers)
    tasks = TasksClient()
    async with connected(build(config, tmp / "state"), extensions=[tasks], elicitation_callback=shows_forms) as client:
        yield client, tmp, tasks


async def send(client: Any, method: str, **params: Any) -> dict[str, Any]:
    return await request(client.session, method, **params)


async def request(session: Any, method: str, **params: Any) -> dict[str, Any]:
    result = await session.send_request(TaskRequest(method=method, params=TaskParams(**params)), Loose)
    return result.model_dump(by_alias=True, mode="json", exclude_none=True)


async def call(client: Any, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    result = await client.session.call_tool(name, arguments, allow_claimed=True)
    return result.model_dump(by_alias=True, mode="json", exclude_none=True)


async def until(client: Any, task_id: str, *statuses: str) -> dict[str, Any]:
    return await polled(client.session, task_id, *statuses)


async def polled(session: Any, task_id: str, *statuses: str) -> dict[str, Any]:
    """Poll the task, as a client does, until it is in one of `statuses`."""
    return await poll_until(lambda: request(session, "tasks/get", taskId=task_id), statuses)


async def poll_until(
    get: Callable[[], Awaitable[dict[str, Any]]], statuses: tuple[str, ...], interval: str = "pollIntervalMs"
) -> dict[str, Any]:
    """`get` the task, at the interval it states (under `interval`), until it is in one of `statuses`."""
    with anyio.fail_after(20):
        while (task := await get())["status"] not in statuses:  # noqa: ASYNC110 - the protocol's poll
            await anyio.sleep(task.get(interval, 500) / 1000)
    return task


def log_of(tmp: Path, server: str) -> str:
    path = tmp / f"{server}.log"
    return path.read_text() if path.exists() else ""


def audit(tmp: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (tmp / "state" / "audit.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("server", list(SERVERS))
async def test_a_call_becomes_a_task_named_for_its_server_and_ends_with_the_calls_result(
    session: Any, server: str
) -> None:
    client, tmp, _ = session
    created = await call(client, f"{server}__echo", {"message": "hi"})
    assert created["resultType"] == "task"
    assert created["taskId"].startswith(f"{server}+")
    done = await until(client, created["taskId"], "completed")
    assert done["result"]["content"] == [{"type": "text", "text": "hi"}]
    assert done["result"]["structuredContent"] == {"message": "hi"}
    assert done["resultType"] == "complete"
    # the SDK's client polls a task to its end for whoever just wants the result
    plain = await client.call_tool(f"{server}__echo", {"message": "hi"})
    assert plain.structured_content == {"message": "hi"}
    events = [e for e in audit(tmp) if e.get("tool") == "echo" and e["server"] == server]
    kinds = [e["event"] for e in events]
    assert kinds[:3] == ["call", "task", "call_end"]  # admitted, then the task, then its end
    assert events[1]["task"] == created["taskId"]


@pytest.mark.parametrize("server", list(SERVERS))
async def test_a_denied_call_never_becomes_a_task_nor_reaches_its_server(session: Any, server: str) -> None:
    client, tmp, _ = session
    refused = await call(client, f"{server}__crash", {})
    assert refused.get("resultType", "complete") == "complete" and refused["isError"] is True
    assert "denied by policy" in refused["content"][0]["text"]
    # the server is still up: crash would have killed it
    assert (await client.call_tool(f"{server}__echo", {"message": "up"})).structured_content == {"message": "up"}
    assert not [e for e in audit(tmp) if e["event"] == "task" and e["tool"] == "crash"]


@pytest.mark.parametrize("server", list(SERVERS))
async def test_a_cancelled_task_stops_its_call_on_the_server(session: Any, server: str) -> None:
    client, tmp, _ = session
    created = await call(client, f"{server}__hang", {})
    await eventually(lambda: "hang started" in log_of(tmp, server))
    assert (await send(client, "tasks/get", taskId=created["taskId"]))["status"] == "working"
    await send(client, "tasks/cancel", taskId=created["taskId"])
    assert (await send(client, "tasks/get", taskId=created["taskId"]))["status"] == "cancelled"
    await eventually(lambda: "cancelled hang" in log_of(tmp, server))


@pytest.mark.parametrize("server", list(SERVERS))
async def test_a_question_midway_is_the_tasks_input_request_answered_by_update(session: Any, server: str) -> None:
    client, _, _ = session
    created = await call(client, f"{server}__ask", {"question": "Your name?"})
    asked = await until(client, created["taskId"], "input_required")
    [(key, request)] = asked["inputRequests"].items()
    assert request["method"] == "elicitation/create"
    assert "Your name?" in request["params"]["message"]
    # an answer to a question never asked is ignored; the task still waits
    await send(client, "tasks/update", taskId=created["taskId"], inputResponses={"other": {"action": "decline"}})
    assert (await send(client, "tasks/get", taskId=created["taskId"]))["status"] == "input_required"
    answer = {"action": "accept", "content": {"answer": "Ada"}}
    await send(client, "tasks/update", taskId=created["taskId"], inputResponses={key: answer})
    done = await until(client, created["taskId"], "completed")
    assert done["result"]["content"][0]["text"] == "Ada"


async def test_a_task_whose_server_dies_ends_with_the_error_that_says_so(tmp_path: Path) -> None:
    config = write_config(tmp_path, {"p": probe_server("--name", "p")})
    async with connected(build(config, tmp_path / "state"), extensions=[TasksClient()]) as client:
        created = await call(client, "p__crash", {})
        done = await until(client, created["taskId"], "completed", "failed")
        assert done["result"]["isError"] is True
        assert "server 'p'" in done["result"]["content"][0]["text"]


async def test_an_unknown_task_is_refused(session: Any) -> None:
    client, _, _ = session
    with pytest.raises(MCPError) as unknown:
        await send(client, "tasks/get", taskId="new+not-a-task")
    assert unknown.value.code == types.INVALID_PARAMS


async def test_a_client_without_the_extension_gets_results_and_no_tasks(tmp_path: Path) -> None:
    config = write_config(tmp_path, {"p": probe_server("--name", "p")})
    async with connected(build(config, tmp_path / "state")) as client:
        plain = await call(client, "p__echo", {"message": "hi"})
        assert plain["content"] == [{"type": "text", "text": "hi"}] and "taskId" not in plain
        with pytest.raises(MCPError) as undeclared:
            await send(client, "tasks/get", taskId="p+anything")
        assert undeclared.value.code == types.MISSING_REQUIRED_CLIENT_CAPABILITY
        assert undeclared.value.data == {"requiredCapabilities": {"extensions": {EXTENSION: {}}}}


@pytest.mark.parametrize("server", list(SERVERS))
async def test_a_listen_stream_naming_the_task_is_told_each_change_of_it(session: Any, server: str) -> None:
    client, _, tasks = session
    created = await call(client, f"{server}__ask", {"question": "Your name?"})
    task_id = created["taskId"]
    filter_ = types.SubscriptionFilter.model_validate({"taskIds": [task_id, f"{server}+unknown"]})
    listen = types.SubscriptionsListenRequest(params=types.SubscriptionsListenRequestParams(notifications=filter_))
    async with anyio.create_task_group() as tg:
        tg.start_soon(client.session.send_request, listen, types.SubscriptionsListenResult)
        asked = await tasks.status(task_id, "input_required")
        [key] = asked["inputRequests"]
        answer = {"action": "accept", "content": {"answer": "Grace"}}
        await send(client, "tasks/update", taskId=task_id, inputResponses={key: answer})
        done = await tasks.status(task_id, "completed")
        tg.cancel_scope.cancel()
    assert done["result"]["content"][0]["text"] == "Grace"
    assert [t["status"] for t in tasks.told[task_id]][-2:] == ["working", "completed"]
    assert f"{server}+unknown" not in tasks.told  # nothing of a task that is not here


async def test_a_listen_stream_naming_tasks_needs_the_extension(tmp_path: Path) -> None:
    config = write_config(tmp_path, {"p": probe_server("--name", "p")})
    async with connected(build(config, tmp_path / "state")) as client:
        filter_ = types.SubscriptionFilter.model_validate({"taskIds": ["p+x"]})
        listen = types.SubscriptionsListenRequest(params=types.SubscriptionsListenRequestParams(notifications=filter_))
        with pytest.raises(MCPError) as refused:
            await client.session.send_request(listen, types.SubscriptionsListenResult)
        assert refused.value.code == types.MISSING_REQUIRED_CLIENT_CAPABILITY
