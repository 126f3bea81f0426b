"""A server's catalog as listed: each kind on its own, so one that fails costs only that kind."""

from __future__ import annotations

import logging
import re
from typing import Any

import mcp.types as types
import pytest
from mcp import Client
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import MCPError

from cellblock.gateway.downstream.listing import Listing, fetch_listing

pytestmark = pytest.mark.anyio

SECRET = "sk-LISTING-0123456789abcdef"
TOOL = types.Tool(name="echo", input_schema={"type": "object"})


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def tools(ctx: Any, params: Any) -> types.ListToolsResult:
    return types.ListToolsResult(tools=[TOOL])


async def resources(ctx: Any, params: Any) -> types.ListResourcesResult:
    return types.ListResourcesResult(resources=[types.Resource(uri="row://1", name="row")])


async def database_down(ctx: Any, params: Any) -> types.ListResourcesResult:
    raise MCPError(types.INTERNAL_ERROR, f"the database is down (password {SECRET})")


async def listed(server: Server[Any], previous: Listing | None = None) -> Listing:
    async with Client(server, mode="legacy") as client:
        return await fetch_listing(client, re.compile(re.escape(SECRET)), "db", previous)


async def listed_and_told(server: Server[Any], caplog: pytest.LogCaptureFixture) -> tuple[Listing, list[str]]:
    """What `server` lists, and the notes the log has about the kinds that failed."""
    with caplog.at_level(logging.WARNING):
        listing = await listed(server)
    assert [t.name for t in listing.tools] == ["echo"]  # its other kinds are kept
    return listing, [r.getMessage() for r in caplog.records if "did not list" in r.getMessage()]


async def test_a_server_without_a_templates_handler_keeps_its_tools_and_resources(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # declares resources (it has a resources handler) and answers the templates list "Method not found"
    listing, notes = await listed_and_told(Server("old", on_list_tools=tools, on_list_resources=resources), caplog)
    assert [str(r.uri) for r in listing.resources] == ["row://1"]
    assert listing.templates == () and [kind for kind, _ in listing.failed] == ["templates"]
    assert notes == [
        "server 'db' did not list its resource templates (Method not found (-32601): it declared the capability "
        "but does not answer its list); it offers no resource templates until it lists them"
    ]


async def test_a_kind_whose_list_errors_is_offered_empty_the_error_told_without_a_secret(
    caplog: pytest.LogCaptureFixture,
) -> None:
    listing, notes = await listed_and_told(Server("db", on_list_tools=tools, on_list_resources=database_down), caplog)
    assert listing.resources == () and [kind for kind, _ in listing.failed] == ["resources", "templates"]
    assert "the database is down" in notes[0] and SECRET not in caplog.text and "[redacted]" in notes[0]


async def test_a_re_read_keeps_the_last_good_list_of_a_kind_that_fails_and_takes_the_others_anew() -> None:
    before = Listing(tools=(TOOL,), resources=(types.Resource(uri="row://1", name="row"),))
    renamed = types.Tool(name="echo2", input_schema={"type": "object"})

    async def tools_now(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[renamed])

    server: Server[Any] = Server("db", on_list_tools=tools_now, on_list_resources=database_down)
    listing = await listed(server, previous=before)
    assert [t.name for t in listing.tools] == ["echo2"] and listing.resources == before.resources
    # control: a first listing (no previous) offers none of the kind
    assert (await listed(server)).resources == ()


async def test_a_secret_in_a_listing_is_scrubbed_and_what_failed_is_kept() -> None:
    async def leaky(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[TOOL.model_copy(update={"description": SECRET})])

    server: Server[Any] = Server("db", on_list_tools=leaky, on_list_resources=database_down)
    listing = await listed(server)
    assert SECRET not in str(listing.dump()) and [kind for kind, _ in listing.failed] == ["resources", "templates"]


async def test_a_failure_is_told_once_across_re_reads_and_only_an_error_that_may_pass_is_retried(
    caplog: pytest.LogCaptureFixture,
) -> None:
    server: Server[Any] = Server("db", on_list_tools=tools, on_list_resources=database_down)
    first = await listed(server)
    assert first.retryable  # the database may come back; the missing templates handler will not
    assert not Listing(failed=(("templates", first.failed[1][1]),)).retryable
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        await listed(server, previous=first)
    assert "did not list" not in caplog.text
    with caplog.at_level(logging.INFO):
        again = await listed(Server("db", on_list_tools=tools, on_list_resources=resources), previous=first)
    assert not again.retryable and "server 'db' lists its resources again" in caplog.text
