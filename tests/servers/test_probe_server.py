"""Quick checks of the probe and demo servers over real stdio, in both protocol eras.

`legacy` forces the `initialize` handshake; `auto` probes `server/discover` and lands on 2026-07-28.
"""

import os
import sys
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.subscriptions import ToolsListChanged
from mcp.shared.exceptions import MCPError

from tests.integration.conftest import eventually

HERE = Path(__file__).parent
PROBE = str(HERE / "probe.py")
REPO = HERE.parent.parent
MODES = ["legacy", "auto"]
MODERN = "2026-07-28"

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def probe_params(*flags: str, env: dict[str, str] | None = None) -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable, args=[PROBE, *flags], env=env, cwd=str(REPO))


def module_params(module: str) -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable, args=["-m", module], cwd=str(REPO))


class Recorder:
    """Collects what the client callbacks see."""

    def __init__(self, answer: str | None = "forty-two") -> None:
        self.answer = answer
        self.elicitations: list[types.ElicitRequestParams] = []
        self.logs: list[types.LoggingMessageNotificationParams] = []
        self.notifications: list[Any] = []
        self.progress: list[tuple[float, float | None, str | None]] = []
        self.tools_changed = anyio.Event()
        self._logged = anyio.Event()

    async def elicit(self, context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        self.elicitations.append(params)
        if self.answer is None:
            return types.ElicitResult(action="decline")
        return types.ElicitResult(action="accept", content={"answer": self.answer})

    async def log(self, params: types.LoggingMessageNotificationParams) -> None:
        self.logs.append(params)
        self._logged.set()
        self._logged = anyio.Event()

    async def heard(self, data: str) -> None:
        """Until a log message holding `data` has arrived."""
        with anyio.fail_after(5):
            while data not in [entry.data for entry in self.logs]:
                await self._logged.wait()

    async def message(self, message: Any) -> None:
        self.notifications.append(message)
        if isinstance(message, types.ToolListChangedNotification):
            self.tools_changed.set()

    async def on_progress(self, progress: float, total: float | None, message: str | None) -> None:
        self.progress.append((progress, total, message))

    def client(self, params: StdioServerParameters, mode: str, **kwargs: Any) -> Client:
        return Client(
            params,
            mode=mode,  # type: ignore[arg-type]
            cache=None,
            elicitation_callback=self.elicit,
            logging_callback=self.log,
            message_handler=self.message,
            read_timeout_seconds=10,
            **kwargs,
        )


def text_of(result: types.CallToolResult) -> str:
    assert not result.is_error, result
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return block.text


@pytest.mark.parametrize("mode", MODES)
async def test_probe_features(mode: str, tmp_path: Path) -> None:
    rec = Recorder()
    probe_log = tmp_path / "probe.log"
    params = probe_params(env={**os.environ, "PROBE_LOG": str(probe_log)})
    async with rec.client(params, mode) as client:
        assert (client.protocol_version == MODERN) is (mode == "auto")

        # tools/list keeps title, annotations, icons, _meta and output schema; odd names survive
        tools = {t.name: t for t in (await client.list_tools()).tools}
        echo = tools["echo"]
        assert echo.title == "Echo"
        assert echo.annotations is not None and echo.annotations.read_only_hint is True
        assert echo.icons and echo.icons[0].mime_type == "image/svg+xml"
        assert echo.meta == {"probe/x": 1}
        assert echo.output_schema is not None and "message" in echo.output_schema["properties"]
        assert {"files.read", "files_read"} <= tools.keys()
        assert any(len(name) == 70 for name in tools)

        # echo: text and structured content
        result = await client.call_tool("echo", {"message": "hi"})
        assert text_of(result) == "hi"
        assert result.structured_content == {"message": "hi"}

        # progress through progress_callback
        result = await client.call_tool("slow", {"steps": 3, "delay": 0.01}, progress_callback=rec.on_progress)
        assert text_of(result) == "done 3 steps"
        assert rec.progress == [(1, 3, "step 1/3"), (2, 3, "step 2/3"), (3, 3, "step 3/3")]

        # elicitation: a mid-call request (handshake) or an InputRequiredResult round (2026-07-28)
        assert text_of(await client.call_tool("ask", {"question": "Meaning?"})) == "forty-two"
        assert [e.message for e in rec.elicitations] == ["Meaning?"]
        rec.answer = None
        assert text_of(await client.call_tool("ask", {"question": "Again?"})) == "declined"
        if mode == "auto":
            first = await client.session.call_tool("ask", {"question": "Raw?"}, allow_input_required=True)
            assert isinstance(first, types.InputRequiredResult)
            assert first.request_state and first.input_requests

        # logging: handshake always delivers; 2026-07-28 only with the per-request logLevel opt-in
        assert text_of(await client.call_tool("log", {"level": "warning", "message": "plain"})) == "logged"
        await client.call_tool(
            "log", {"level": "warning", "message": "opted in"}, meta={types.LOG_LEVEL_META_KEY: "info"}
        )
        # a log may trail its call's result; the first one, had it been sent, came before the second
        await rec.heard("opted in")
        expected = ["opted in"] if mode == "auto" else ["plain", "opted in"]
        assert [entry.data for entry in rec.logs] == expected

        # garbage on stdout between messages does not kill the connection
        assert text_of(await client.call_tool("garbage", {})) == "wrote garbage"
        assert text_of(await client.call_tool("echo", {"message": "still here"})) == "still here"

        # resources, prompt, completion
        readme = await client.read_resource("probe://static/readme")
        assert "Probe readme" in readme.contents[0].text  # type: ignore[union-attr]
        item = await client.read_resource("probe://item/7")
        assert item.contents[0].text == "item 7"  # type: ignore[union-attr]
        templates = await client.list_resource_templates()
        assert [t.uri_template for t in templates.resource_templates] == ["probe://item/{id}"]
        prompt = await client.get_prompt("greet", {"name": "bob"})
        assert "bob" in prompt.messages[0].content.text  # type: ignore[union-attr]
        completion = await client.complete(
            types.PromptReference(type="ref/prompt", name="greet"), {"name": "name", "value": "al"}
        )
        assert completion.completion.values == ["alice", "albert"]

        # add_tool + list_changed: a notification (handshake) or a subscriptions/listen event (2026)
        if mode == "auto":
            async with client.listen(tools_list_changed=True) as sub:
                await client.call_tool("add_tool", {"name": "dyn1"})
                with anyio.fail_after(5):
                    event = await sub.__anext__()
                assert isinstance(event, ToolsListChanged)
        else:
            await client.call_tool("add_tool", {"name": "dyn1"})
            with anyio.fail_after(5):
                await rec.tools_changed.wait()
        assert "dyn1" in {t.name for t in (await client.list_tools()).tools}
        assert text_of(await client.call_tool("dyn1", {})) == "dynamic dyn1"

        # hang: cancelling the call, once the server has started it, reaches the server, which records it
        async with anyio.create_task_group() as tg:
            tg.start_soon(client.call_tool, "hang", {})
            await eventually(lambda: "hang started" in (probe_log.read_text() if probe_log.exists() else ""), 5)
            tg.cancel_scope.cancel()
        await eventually(lambda: "cancelled hang" in (probe_log.read_text() if probe_log.exists() else ""), 5)
        assert text_of(await client.call_tool("echo", {"message": "after hang"})) == "after hang"


async def test_probe_crash_and_flags() -> None:
    async def crash() -> None:
        async with Recorder().client(probe_params(), "legacy") as client:
            with pytest.raises(MCPError):
                await client.call_tool("crash", {})

    async def flags() -> None:
        params = probe_params("--garbage-at-start", "--name", "other", "--extra-tools", "3")
        async with Recorder().client(params, "auto") as client:
            result = await client.call_tool("echo", {"message": "x"})
            assert result.meta and result.meta["io.modelcontextprotocol/serverInfo"]["name"] == "other"
            names = {t.name for t in (await client.list_tools()).tools}
            assert {"t0", "t1", "t2"} <= names and "t3" not in names
            assert text_of(await client.call_tool("t2", {})) == "t2"

    async def exit_at_start() -> None:
        with pytest.raises(Exception):  # noqa: B017 - any connection failure will do
            with anyio.fail_after(10):
                async with Client(probe_params("--exit-at-start"), mode="legacy", cache=None):
                    pass

    async with anyio.create_task_group() as tg:
        for check in (crash, flags, exit_at_start):
            tg.start_soon(check)


async def test_demo_servers() -> None:
    """notes and clock, each in both modes; the four sessions run concurrently to share start-up time."""

    async def check_notes(mode: str) -> None:
        async with Recorder().client(module_params("cellblock.demo.notes"), mode) as notes:
            assert {t.name for t in (await notes.list_tools()).tools} == {
                "add_note",
                "list_notes",
                "read_note",
                "save_note",
                "delete_notes",
            }
            await notes.call_tool("add_note", {"title": "groceries", "text": "milk, eggs"})
            listed = await notes.call_tool("list_notes", {})
            assert listed.structured_content == {
                "notes": [{"title": "groceries", "uri": "note://groceries", "length": 10}]
            }
            assert text_of(await notes.call_tool("read_note", {"title": "groceries"})) == "milk, eggs"
            resources = await notes.list_resources()
            assert [r.uri for r in resources.resources] == ["note://groceries"]
            templates = await notes.list_resource_templates()
            assert [t.uri_template for t in templates.resource_templates] == ["note://{title}"]
            read = await notes.read_resource("note://groceries")
            assert read.contents[0].text == "milk, eggs"  # type: ignore[union-attr]
            prompt = await notes.get_prompt("summarize_notes")
            assert "milk, eggs" in prompt.messages[0].content.text  # type: ignore[union-attr]

    async def check_clock(mode: str) -> None:
        rec = Recorder()
        async with rec.client(module_params("cellblock.demo.clock"), mode) as clock:
            assert {t.name for t in (await clock.list_tools()).tools} == {"now", "countdown", "restart"}
            paris = text_of(await clock.call_tool("now", {"timezone": "Europe/Paris"}))
            assert paris[-6:] in {"+01:00", "+02:00"}
            assert (await clock.call_tool("now", {"timezone": "Mars/Olympus"})).is_error
            result = await clock.call_tool("countdown", {"seconds": 1}, progress_callback=rec.on_progress)
            assert text_of(result) == "Countdown of 1 s finished"
            assert rec.progress == [(1, 1, "0 s left")]

    async with anyio.create_task_group() as tg:
        for mode in MODES:
            tg.start_soon(check_notes, mode)
            tg.start_soon(check_clock, mode)
