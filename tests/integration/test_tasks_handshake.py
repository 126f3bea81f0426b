"""Tasks for handshake-era clients (2025-11-25's experimental tasks) through `cellblock serve`,
as bare JSON-RPC (the SDK's client takes no task for a tools/call): over stdio and over HTTP, to a
handshake-era server (`old`) and one that speaks both eras (`new`: over stdio spoken to in its
client's era, the handshake, downstream/offer.py; over HTTP in 2026-07-28). The call is admitted before the task
exists, so a call the human denies never becomes a task and never reaches its server (its own log
says so, and the same call allowed does reach it); tasks/get, tasks/result, tasks/list and
tasks/cancel; a question midway reaches the client on its tasks/result, tied to the task."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx2
import pytest

from cellblock.gateway.serve.handshake_tasks import CAPABILITY, RELATED
from tests.integration.conftest import eventually, probe_server, write_config
from tests.integration.raw import APPROVE, Raw, raw_gateway
from tests.integration.test_http import serving
from tests.integration.test_tasks import log_of, poll_until

pytestmark = pytest.mark.anyio

SERVERS = {"old": "legacy", "new": "auto"}  # the handshake only; both eras, as its client speaks
DENY = {"action": "accept", "content": {"decision": "deny"}}


class Client:
    """What the raw client answers the gateway's requests with, and what it was asked."""

    def __init__(self) -> None:
        self.approval: dict[str, Any] = APPROVE
        self.questions: list[dict[str, Any]] = []

    async def answer(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        if "decision" in json.dumps(params.get("requestedSchema")):  # Cellblock's own approval question
            return self.approval
        self.questions.append({"method": method, "params": params})
        return {"action": "accept", "content": {"answer": "Ada"}}


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("tasks_handshake")
    servers = {
        name: probe_server("--name", name, protocol=protocol, env={"PROBE_LOG": str(tmp / f"{name}.log")}, writable=tmp)
        for name, protocol in SERVERS.items()
    }
    asks = {"default": "ask"}  # the human decides each call
    servers["g"] = probe_server("--name", "g", tools=asks, env={"PROBE_LOG": str(tmp / "g.log")}, writable=tmp)
    return write_config(tmp, servers)


@pytest.fixture(scope="module")
async def stdio(config: Path) -> Any:
    human = Client()
    async with raw_gateway(config, config.parent / "state", human.answer) as raw:
        opened = await _open(raw, "2025-11-25")
        assert opened["capabilities"]["tasks"] == CAPABILITY
        # each tool may run as a task (the spec's tool-level rule), answered on the fast path
        tools = (await ok(raw, "tools/list"))["tools"]
        assert {t["execution"]["taskSupport"] for t in tools} == {"optional"}
        yield raw, human


async def _open(raw: Raw, version: str) -> dict[str, Any]:
    opened = await raw.request("initialize", _hello(version, {"elicitation": {}}))
    await raw.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
    return dict(opened["result"])


def _hello(version: str, capabilities: dict[str, Any]) -> dict[str, Any]:
    return {"protocolVersion": version, "capabilities": capabilities, "clientInfo": {"name": "raw", "version": "1"}}


async def ok(raw: Raw, method: str, **params: Any) -> dict[str, Any]:
    answer = await raw.request(method, params)
    assert "result" in answer, answer
    return dict(answer["result"])


async def polled(raw: Raw, task_id: str, *statuses: str) -> dict[str, Any]:
    return await poll_until(lambda: ok(raw, "tasks/get", taskId=task_id), statuses, "pollInterval")


def audit(config: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (config.parent / "state" / "audit.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("server", list(SERVERS))
async def test_a_call_with_a_task_is_one_polled_to_its_result(stdio: Any, config: Path, server: str) -> None:
    raw, _ = stdio
    created = await ok(raw, "tools/call", name=f"{server}__echo", arguments={"message": "hi"}, task={"ttl": 60000})
    task = created["task"]
    assert task["taskId"].startswith(f"{server}+") and task["status"] == "working"
    assert {"createdAt", "lastUpdatedAt", "ttl", "pollInterval"} <= set(task)
    done = await polled(raw, task["taskId"], "completed", "failed")
    assert done["status"] == "completed" and "pollInterval" not in done
    result = await ok(raw, "tasks/result", taskId=task["taskId"])
    assert result["content"] == [{"type": "text", "text": "hi"}]
    assert result["structuredContent"] == {"message": "hi"}
    assert result["_meta"][RELATED] == {"taskId": task["taskId"]}
    assert task["taskId"] in [t["taskId"] for t in (await ok(raw, "tasks/list"))["tasks"]]
    # the status is told as it changes (the spec's notifications/tasks/status)
    await eventually(
        lambda: any(
            n["method"] == "notifications/tasks/status"
            and n["params"]["taskId"] == task["taskId"]
            and n["params"]["status"] == "completed"
            for n in raw.notifications
        )
    )
    events = [e for e in audit(config) if e.get("task") == task["taskId"] or e.get("tool") == "echo"]
    kinds = [e["event"] for e in events if e["server"] == server]
    assert kinds[:3] == ["call", "task", "call_end"]  # admitted, then the task, then its end


async def test_a_denied_call_never_becomes_a_task_nor_reaches_its_server(stdio: Any, config: Path) -> None:
    raw, human = stdio
    human.approval = DENY
    refused = await ok(raw, "tools/call", name="g__hang", arguments={}, task={"ttl": 60000})
    assert "task" not in refused and refused["isError"] is True
    assert "hang" not in log_of(config.parent, "g")  # the server never saw it
    assert not [e for e in audit(config) if e["event"] == "task" and e["server"] == "g"]
    # the control: the same call, allowed by the human, becomes a task and reaches the server
    human.approval = APPROVE
    created = await ok(raw, "tools/call", name="g__hang", arguments={}, task={"ttl": 60000})
    task_id = created["task"]["taskId"]
    await eventually(lambda: "hang started" in log_of(config.parent, "g"))
    # cancelled: the task says so at once, and the server is told
    cancelled = await ok(raw, "tasks/cancel", taskId=task_id)
    assert cancelled["taskId"] == task_id and cancelled["status"] == "cancelled"
    await eventually(lambda: "cancelled hang" in log_of(config.parent, "g"))
    assert (await ok(raw, "tasks/get", taskId=task_id))["status"] == "cancelled"
    again = await raw.request("tasks/cancel", {"taskId": task_id})
    assert again["error"]["code"] == -32602  # a task that has ended cannot be cancelled
    no_result = await raw.request("tasks/result", {"taskId": task_id})
    assert no_result["error"]["code"] == -32602 and "cancelled" in no_result["error"]["message"]


@pytest.mark.parametrize("server", list(SERVERS))
async def test_a_question_midway_reaches_the_client_on_its_tasks_result(stdio: Any, server: str) -> None:
    raw, human = stdio
    created = await ok(raw, "tools/call", name=f"{server}__ask", arguments={"question": "Your name?"}, task={})
    task_id = created["task"]["taskId"]
    asked = await polled(raw, task_id, "input_required")
    assert "tasks/result" in asked["statusMessage"]
    before = len(human.questions)
    result = await ok(raw, "tasks/result", taskId=task_id)  # the question comes on it, then the end
    assert result["content"][0]["text"] == "Ada"
    [question] = human.questions[before:]
    assert question["method"] == "elicitation/create" and "Your name?" in question["params"]["message"]
    assert question["params"]["_meta"][RELATED] == {"taskId": task_id}
    assert (await ok(raw, "tasks/get", taskId=task_id))["status"] == "completed"


async def test_an_unknown_task_is_an_error_that_names_no_other_task(stdio: Any) -> None:
    raw, _ = stdio
    created = await ok(raw, "tools/call", name="old__echo", arguments={"message": "x"}, task={})
    for method in ("tasks/get", "tasks/result", "tasks/cancel"):
        unknown = await raw.request(method, {"taskId": "old+not-a-task"})
        assert unknown["error"]["code"] == -32602
        assert created["task"]["taskId"] not in json.dumps(unknown)


async def test_a_tool_error_ends_its_task_failed_with_the_result(stdio: Any) -> None:
    raw, _ = stdio
    created = await ok(raw, "tools/call", name="old__echo", arguments={}, task={})  # no message: invalid
    done = await polled(raw, created["task"]["taskId"], "completed", "failed")
    assert done["status"] == "failed"
    result = await ok(raw, "tasks/result", taskId=created["task"]["taskId"])
    assert result["isError"] is True


async def test_an_earlier_client_gets_a_plain_call_and_no_tasks(config: Path, tmp_path: Path) -> None:
    async with raw_gateway(config, tmp_path / "state", Client().answer) as raw:
        opened = await _open(raw, "2025-06-18")
        assert "tasks" not in opened["capabilities"]
        assert not [t for t in (await ok(raw, "tools/list"))["tools"] if "execution" in t]
        plain = await ok(raw, "tools/call", name="old__echo", arguments={"message": "hi"}, task={"ttl": 1000})
        assert plain["content"] == [{"type": "text", "text": "hi"}] and "task" not in plain
        for method in ("tasks/get", "tasks/list", "tasks/result"):
            refused = await raw.request(method, {"taskId": "old+x"})
            assert refused["error"]["code"] == -32601


# -- over HTTP: each session sees its own tasks ----------------------------------------------------


class Session:
    """One handshake-era HTTP session, as bare JSON-RPC posts."""

    def __init__(self, http: httpx2.AsyncClient, url: str) -> None:
        self.http, self.url = http, url
        self.sid: str | None = None
        self.ids = 0
        self.human = Client()

    async def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """The answer to the request; a request of the gateway's on the way (a question) is
        answered as `Client` answers it."""
        self.ids += 1
        message = {"jsonrpc": "2.0", "id": self.ids, "method": method, "params": params}
        async with self.http.stream("POST", self.url, json=message, headers=self._headers(), timeout=30) as response:
            self.sid = response.headers.get("mcp-session-id", self.sid)
            if response.headers.get("content-type", "").startswith("application/json"):
                return dict(json.loads(await response.aread()))
            async for line in response.aiter_lines():
                got = json.loads(line[5:]) if line.startswith("data:") and line[5:].strip() else {}
                if "method" in got and "id" in got:
                    answer = await self.human.answer(got["method"], got.get("params") or {})
                    reply = {"jsonrpc": "2.0", "id": got["id"], "result": answer}
                    await self.http.post(self.url, json=reply, headers=self._headers())
                elif got.get("id") == self.ids:
                    return got
        raise AssertionError(f"no answer to {method}")

    async def result(self, method: str, **params: Any) -> dict[str, Any]:
        return dict((await self.request(method, params))["result"])

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json, text/event-stream"}
        if self.sid is not None:
            headers |= {"Mcp-Session-Id": self.sid, "Mcp-Protocol-Version": "2025-11-25"}
        return headers

    async def open(self) -> dict[str, Any]:
        opened = await self.request("initialize", _hello("2025-11-25", {"elicitation": {}}))
        assert self.sid is not None
        note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        await self.http.post(self.url, json=note, headers=self._headers())
        return dict(opened["result"])


async def test_over_http_a_session_polls_its_task_and_another_never_sees_it(
    config: Path, served_env: dict[str, str]
) -> None:
    with serving(config, served_env) as url:
        async with httpx2.AsyncClient() as http:
            mine, other = Session(http, url), Session(http, url)
            assert (await mine.open())["capabilities"]["tasks"] == CAPABILITY
            await other.open()
            tools = (await mine.result("tools/list"))["tools"]  # the SDK's server's list
            assert {t["execution"]["taskSupport"] for t in tools} == {"optional"}
            echo = {"name": "new__echo", "arguments": {"message": "hi"}, "task": {}}
            created = await mine.request("tools/call", echo)
            task_id = created["result"]["task"]["taskId"]
            result = await mine.request("tasks/result", {"taskId": task_id})
            assert result["result"]["content"] == [{"type": "text", "text": "hi"}]
            assert (await mine.request("tasks/get", {"taskId": task_id}))["result"]["status"] == "completed"
            assert [t["taskId"] for t in (await mine.request("tasks/list", {}))["result"]["tasks"]] == [task_id]
            assert (await other.request("tasks/get", {"taskId": task_id}))["error"]["code"] == -32602
            assert (await other.request("tasks/list", {}))["result"]["tasks"] == []
            # a question midway comes on the session's tasks/result, tied to the task
            ask = {"name": "old__ask", "arguments": {"question": "Your name?"}, "task": {}}
            task_id = (await mine.request("tools/call", ask))["result"]["task"]["taskId"]
            await poll_until(lambda: mine.result("tasks/get", taskId=task_id), ("input_required",), "pollInterval")
            result = await mine.request("tasks/result", {"taskId": task_id})
            assert result["result"]["content"][0]["text"] == "Ada"
            [question] = mine.human.questions
            assert question["params"]["_meta"][RELATED] == {"taskId": task_id}
