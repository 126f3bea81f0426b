"""Nothing a server sends can stop the gateway: text no encoder can write, in every place it can go.

Behind one gateway per client era (handshake `legacy`, 2026-07-28 `auto`): the raw hostile server
twice (`raw` over the handshake, `rawm` over 2026-07-28 with a 2026-07-28 client, and in its
client's era, the handshake, with a handshake-era one: downstream/offer.py), with a lone
surrogate (`"\\ud800"`, valid JSON) in its instructions, a tool's name and description, its
prompt, its resource, its results, logs, progress and questions; and the probe server, which must
keep answering. Before the fix the first of these stopped `cellblock serve`, taking every server
down with it. A lone surrogate arrives as U+FFFD, the replacement character.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import mcp.types as types
import pytest

from cellblock.gateway.state import lock_path
from cellblock.policy.lock import approve, item_keys, save_lock
from tests.integration.conftest import gateway, probe_server, write_config

pytestmark = [pytest.mark.anyio, pytest.mark.jail]

RAW = Path(__file__).resolve().parents[1] / "servers" / "raw.py"
SERVERS = ["raw", "rawm"]
REPLACED = "\ufffd"


def raw_server(*args: str, **extra: Any) -> dict[str, Any]:
    return {"command": sys.executable, "args": [str(RAW), *args], "jail": {"read_only": [str(RAW.parent)]}, **extra}


class Seen:
    def __init__(self) -> None:
        self.questions: list[str] = []
        self.logs: list[Any] = []
        self._logged = anyio.Event()

    async def elicit(self, ctx: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        self.questions.append(params.message)
        return types.ElicitResult(action="accept", content={})

    async def log(self, params: types.LoggingMessageNotificationParams) -> None:
        self.logs.append(params.data)
        self._logged.set()
        self._logged = anyio.Event()

    async def heard(self, data: str, since: int) -> None:
        """Until a log message `data` has arrived after the first `since` (a log may trail its result)."""
        with anyio.fail_after(10):
            while data not in self.logs[since:]:
                await self._logged.wait()


@pytest.fixture(scope="module", params=["legacy", "auto"])
async def hostile(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp(f"hostile-{request.param}")
    config = write_config(
        tmp,
        {
            "raw": raw_server("--era", "legacy", "--surrogates", protocol="legacy", timeout=20),
            "rawm": raw_server("--era", "modern", "--surrogates", timeout=20),
            "probe": probe_server(),
        },
    )
    seen = Seen()
    async with gateway(
        config, tmp / "state", mode=request.param, elicitation_callback=seen.elicit, logging_callback=seen.log
    ) as client:
        yield client, seen


def text(result: types.CallToolResult) -> str:
    return " ".join(c.text for c in result.content if isinstance(c, types.TextContent))


async def probe_still_answers(client: Any) -> None:
    result = await client.call_tool("probe__echo", {"message": "still here"})
    assert text(result) == "still here" and not result.is_error


async def test_the_catalog_and_instructions_arrive_with_the_surrogates_replaced(hostile: Any) -> None:
    client, _ = hostile
    tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    for server in SERVERS:
        [odd] = [tool for name, tool in tools.items() if name.startswith(f"{server}__odd")]
        assert odd.description == f"odd {REPLACED}"
        assert f"{server}__say" in tools
    assert f"[raw] raw server {REPLACED}" in (client.instructions or "")
    await probe_still_answers(client)


@pytest.mark.parametrize("server", SERVERS)
async def test_a_result_holding_a_lone_surrogate_arrives_replaced(hostile: Any, server: str) -> None:
    client, _ = hostile
    for _ in range(2):  # the first call may go the SDK's way while the server starts; the next is fast
        result = await client.call_tool(f"{server}__say", {})
        assert text(result) == f"said {REPLACED}" and not result.is_error
    await probe_still_answers(client)


@pytest.mark.parametrize("server", SERVERS)
async def test_a_prompt_and_a_resource_holding_one_arrive_replaced(hostile: Any, server: str) -> None:
    client, _ = hostile
    prompt = await client.get_prompt(f"{server}__greet")
    assert [m.content.text for m in prompt.messages] == [f"hello {REPLACED}"]
    [resource] = [
        r for r in (await client.list_resources()).resources if str(r.uri).startswith(f"cellblock://{server}/")
    ]
    read = await client.read_resource(resource.uri)
    assert [c.text for c in read.contents] == [f"note {REPLACED}"]
    await probe_still_answers(client)


@pytest.mark.parametrize("server", SERVERS)
async def test_a_log_message_holding_one_arrives_replaced(hostile: Any, server: str) -> None:
    client, seen = hostile
    before = len(seen.logs)
    result = await client.call_tool(f"{server}__log", {})
    assert text(result) == "logged"
    if client.protocol_version == "2026-07-28":
        return  # a 2026-07-28 call carries a server's logs only to a request that opted in
    await seen.heard(f"logged {REPLACED}", before)
    await probe_still_answers(client)


@pytest.mark.parametrize("server", SERVERS)
async def test_a_progress_message_holding_one_arrives_replaced(hostile: Any, server: str) -> None:
    client, _ = hostile
    messages: list[str | None] = []

    async def progress(value: float, total: float | None, message: str | None) -> None:
        messages.append(message)

    result = await client.call_tool(f"{server}__progress", {}, progress_callback=progress)
    assert text(result) == "progressed"
    if messages:  # progress is best effort; what arrives must be encodable
        assert messages == [f"half {REPLACED}"]
    await probe_still_answers(client)


@pytest.mark.parametrize("server", SERVERS)
async def test_a_question_holding_one_reaches_the_user_replaced(hostile: Any, server: str) -> None:
    client, seen = hostile
    result = await client.call_tool(f"{server}__ask", {})
    assert text(result) == "answer: accept", text(result)
    assert seen.questions[-1] == f"Question from server '{server}' (not a Cellblock approval):\nallow {REPLACED}?"
    await probe_still_answers(client)


async def test_a_lock_saved_with_a_lone_surrogate_does_not_stop_the_next_start(tmp_path: Path) -> None:
    """An older version saved what the server said as it came; the gateway must still start from it."""
    state = tmp_path / "state"
    catalog = {"tools": [{"name": "say", "inputSchema": {"type": "object"}}], "instructions": "raw server \ud800"}
    save_lock(lock_path(state, "raw"), approve("raw", item_keys(catalog), time.time()))
    assert "\\ud800" in lock_path(state, "raw").read_text()
    config = write_config(
        tmp_path,
        {"raw": raw_server("--era", "legacy", "--surrogates", protocol="legacy"), "probe": probe_server()},
        defaults={"tools": {"default": "allow"}, "lock": {"first": "trust"}},
    )
    for mode in ("legacy", "legacy"):  # and again, from what the first start recorded
        async with gateway(config, state, mode=mode) as client:
            # the locked instructions are shown replaced while 'raw' starts, and held for review once it
            # is up (what it sends now reads as U+FFFD, not the saved surrogate): either way, never raw
            (client.instructions or "").encode("utf-8")
            await probe_still_answers(client)


async def test_an_early_answer_recorded_with_a_lone_surrogate_does_not_stop_the_next_start(tmp_path: Path) -> None:
    state = tmp_path / "state"
    config = write_config(tmp_path, {"raw": raw_server("--era", "legacy", "--surrogates", protocol="legacy")})
    async with gateway(config, state, mode="legacy") as client:
        await client.list_tools()
    record = state / "early.json"
    with anyio.fail_after(10):
        while not record.exists():  # noqa: ASYNC110 - written by the gateway at exit
            await anyio.sleep(0.02)
    text_ = record.read_text()
    assert "\\ufffd" in text_
    record.write_text(text_.replace("\\ufffd", "\\ud800"))  # what an older version would have kept
    json.loads(record.read_text())  # still valid JSON
    async with gateway(config, state, mode="legacy") as client:
        assert REPLACED in (client.instructions or "")
        assert any(t.name == "raw__say" for t in (await client.list_tools()).tools)
