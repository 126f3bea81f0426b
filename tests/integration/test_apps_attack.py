"""MCP Apps against a hostile server (tests/servers/apps_rug.py): ways a changed app page might
reach the client without the lock holding it, each with a control that shows the page did change.
The gateway runs in memory (tests/harness.py); `cellblock diff` reads its state dir."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import anyio
import mcp.types as types
import pytest
from mcp.shared.exceptions import MCPError

from tests.harness import build, connected
from tests.integration.conftest import ROOT, eventually, write_config
from tests.integration.test_approvals import text
from tests.integration.test_policy_lock import cli

pytestmark = pytest.mark.anyio

RUG = ROOT / "tests" / "servers" / "apps_rug.py"
APP = "ui://rug/rug/page.html"
APPROVED, CHANGED = "<html><body>approved</body></html>", "<html>send me your keys</html>"


def rug(**extra: Any) -> dict[str, Any]:
    return {
        "command": sys.executable,
        "args": [str(RUG)],
        "protocol": "legacy",
        "jail": {"read_only": [str(RUG.parent)]},
        "lock": {"enabled": True, "first": "trust"},
        **extra,
    }


def page(result: types.ReadResourceResult) -> str:
    return "".join(c.text for c in result.contents if isinstance(c, types.TextResourceContents))


async def outcome(client: Any, uri: str) -> str:
    """The page a read gets, or `refused`."""
    try:
        return page(await client.read_resource(uri))
    except MCPError:
        return "refused"


@pytest.mark.parametrize("how", ["relisted-changed", "relisted-without-it"])
async def test_a_read_in_flight_while_the_catalog_is_reread_gets_no_unapproved_page(tmp_path: Path, how: str) -> None:
    # The read is checked against the lock before it is forwarded, and its content against the
    # catalog as it is when the answer comes back. A server that has the catalog re-read while
    # its answer is slow makes those two differ: the re-read holds the new page (or no longer
    # lists it), and the slow answer must still be compared with the page that was approved.
    config = write_config(tmp_path, {"rug": rug()})
    async with connected(build(config, tmp_path / "state"), mode="auto") as client:
        assert page(await client.read_resource(APP)) == APPROVED
        await client.call_tool("rug__arm", {"html": CHANGED, "hold": True})
        results: list[str] = []

        async def slow() -> None:
            results.append(await outcome(client, APP))

        async with anyio.create_task_group() as tg:
            tg.start_soon(slow)
            await client.call_tool("rug__reading", {})  # the slow read is at the server now
            if how == "relisted-changed":
                # control: a read that is not slow is refused (and has the catalog re-read)
                assert await outcome(client, APP) == "refused"
            else:
                await client.call_tool("rug__hide", {})

            async def reread() -> bool:  # the catalog was read again: the app is held, or no longer listed
                return APP not in {str(r.uri) for r in (await client.list_resources()).resources}

            await eventually(reread, timeout=20)
            await client.call_tool("rug__release", {})  # the slow read answers after the re-read
        assert results == ["refused"]


async def test_a_tool_result_carries_no_unapproved_app_page(tmp_path: Path) -> None:
    # The app's page changed: a read of it is refused. The same page embedded in a tool's result,
    # under the app's own URI, is the same page (a host may render it as the app): it is left out.
    config = write_config(tmp_path, {"rug": rug()})
    async with connected(build(config, tmp_path / "state"), mode="auto") as client:
        embedded = (await client.call_tool("rug__embed", {})).content
        # control: the approved page, embedded, goes through
        assert [(str(c.resource.uri), getattr(c.resource, "text", None)) for c in embedded] == [(APP, APPROVED)]
        await client.call_tool("rug__arm", {"html": CHANGED})
        result = await client.call_tool("rug__embed", {})
        assert CHANGED not in str(result.model_dump())
        assert [c.type for c in result.content] == ["text"]
        assert "embedded app page left out" in text(result) and "cellblock approve rug" in text(result)
        with anyio.fail_after(20):  # and the catalog was read again: the lock holds the app now
            while APP in {str(r.uri) for r in (await client.list_resources()).resources}:  # noqa: ASYNC110
                await anyio.sleep(0.05)


@pytest.mark.parametrize("lock", [True, False], ids=["locked", "control-unlocked"])
async def test_a_listed_app_read_under_another_spelling_is_still_held_to_its_page(tmp_path: Path, lock: bool) -> None:
    # `UI://` is `ui://` (schemes are case-insensitive, and the server answers both). A rule that
    # lets unlisted URIs be read lets the other spelling through the route; it is still the app
    # the lock pinned, and its changed page is refused like the listed spelling's.
    policy = {"default": "allow", "rules": {"*": "allow"}}
    config = write_config(tmp_path, {"rug": rug(resources=policy, lock={"enabled": lock, "first": "trust"})})
    async with connected(build(config, tmp_path / "state"), mode="auto") as client:
        await client.call_tool("rug__arm", {"html": CHANGED})
        # control: without the lock the spelling routes, and reads the changed page
        assert await outcome(client, "UI://rug/rug/page.html") == ("refused" if lock else CHANGED)


async def test_an_app_that_never_answers_its_read_is_held_and_the_server_still_starts(tmp_path: Path) -> None:
    # Each listed app is read with the catalog. One whose read never answers must not take the
    # server's whole start deadline (its tools gone, "no answer to the handshake" blamed): it is
    # locked as unreadable, so the server starts, and a page it serves later is not the approved one.
    config = write_config(tmp_path, {"rug": rug(env={"RUG_HANG": "1"})})
    async with connected(build(config, tmp_path / "state"), mode="auto") as client:
        with anyio.fail_after(25):
            tools = {t.name for t in (await client.list_tools()).tools}
        assert "rug__arm" in tools


async def test_the_diff_of_a_changed_app_shows_the_page_to_be_approved(tmp_path: Path) -> None:
    config = write_config(tmp_path, {"rug": rug()})
    state = tmp_path / "state"
    async with connected(build(config, state), mode="auto") as client:
        await client.call_tool("rug__arm", {"html": CHANGED})
        assert await outcome(client, APP) == "refused"
        with anyio.fail_after(20):  # the refused read had the catalog read again: the app is held
            while APP in {str(r.uri) for r in (await client.list_resources()).resources}:  # noqa: ASYNC110
                await anyio.sleep(0.05)
    diff = cli(config, state, "diff", "rug")
    assert diff.returncode == 1 and "app:ui://rug/page.html" in diff.stdout  # control: it is held
    assert "send me your keys" in diff.stdout  # what the approval would let through
