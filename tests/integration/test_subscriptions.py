"""Resource subscriptions through the gateway, in all four era combinations: a handshake-era client
(`resources/subscribe`) or a 2026-07-28 one (`subscriptions/listen`), to a handshake-era server or a
2026-07-28 one (tests/servers/notes.py; each spoken to in its config's era whatever the client
speaks, as under `--http`: `harness.unfollowed`). An update reaches only the subscribers of its resource,
under the URI they subscribed to; a resource the policy denies cannot be subscribed to. The gateway
runs in memory (tests/harness.py)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import anyio
import mcp.types as types
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.shared.exceptions import MCPError
from mcp.shared.subscriptions import ResourceUpdated

from tests.harness import build, connected, unfollowed
from tests.integration.conftest import ROOT, write_config
from tests.integration.test_approvals import text

pytestmark = pytest.mark.anyio

NOTES = ROOT / "tests" / "servers" / "notes.py"
SERVERS = {"old": "legacy", "new": "auto"}  # the server's era: handshake, 2026-07-28


def notes(protocol: str) -> dict[str, Any]:
    return {
        "command": sys.executable,
        "args": [str(NOTES)],
        "protocol": protocol,
        "jail": {"read_only": [str(NOTES.parent)]},
        "resources": {"default": "allow", "rules": {"note://2": "deny"}},
    }


@pytest.fixture(scope="module", params=["legacy", "auto"])
async def session(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp(f"subs-{request.param}")
    config = write_config(tmp, {name: notes(protocol) for name, protocol in SERVERS.items()})
    updates: list[str] = []
    arrived = anyio.Event()

    async def message(item: Any) -> None:
        nonlocal arrived
        if isinstance(item, types.ResourceUpdatedNotification):
            updates.append(str(item.params.uri))
            arrived.set()

    gateway = unfollowed(build(config, tmp / "state"))
    async with connected(gateway, mode=request.param, message_handler=message) as client:

        async def next_update() -> str:
            nonlocal arrived
            with anyio.fail_after(20):
                await arrived.wait()
            arrived = anyio.Event()
            return updates.pop(0)

        yield client, request.param, next_update


async def watched_on(client: Any, server: str, expected: str) -> None:
    """Wait until `server` says it is subscribed to `expected` (its own URIs, comma-separated):
    a 2026-07-28 server learns of a change when the gateway's listen stream is opened again."""
    with anyio.fail_after(20):
        while (got := text(await client.call_tool(f"{server}__watched", {}))) != expected:  # noqa: ASYNC110 - polled: it is in another process
            await anyio.sleep(0.05)
    assert got == expected


@pytest.mark.parametrize("server", list(SERVERS))
async def test_an_update_reaches_the_subscriber_under_the_uri_it_subscribed_to(session: Any, server: str) -> None:
    client, mode, next_update = session
    exposed = f"cellblock://{server}/note://1"
    if mode == "legacy":
        await client.subscribe_resource(exposed)
        await watched_on(client, server, "note://1")
        # an update of a resource nobody subscribed to is not passed on: the first to arrive is note://1's
        await client.call_tool(f"{server}__touch", {"uri": "note://3"})
        await client.call_tool(f"{server}__touch", {"uri": "note://1"})
        assert await next_update() == exposed
        await client.unsubscribe_resource(exposed)
        await watched_on(client, server, "")  # the server itself is unsubscribed
    else:
        async with client.listen(resource_subscriptions=[exposed]) as events:
            await watched_on(client, server, "note://1")
            await client.call_tool(f"{server}__touch", {"uri": "note://3"})
            await client.call_tool(f"{server}__touch", {"uri": "note://1"})
            with anyio.fail_after(20):
                event = await events.__anext__()
            assert event == ResourceUpdated(exposed)
        await watched_on(client, server, "")  # the stream ended: the server is unsubscribed


@pytest.mark.parametrize("server", list(SERVERS))
async def test_a_resource_the_policy_denies_cannot_be_subscribed_to(session: Any, server: str) -> None:
    client, mode, _ = session
    denied, allowed = f"cellblock://{server}/note://2", f"cellblock://{server}/note://1"
    if mode == "legacy":
        with pytest.raises(MCPError, match="subscription"):
            await client.subscribe_resource(denied)
        await client.subscribe_resource(allowed)  # control: the other note can be
        await watched_on(client, server, "note://1")
        await client.unsubscribe_resource(allowed)
    else:
        async with client.listen(resource_subscriptions=[denied, allowed]) as events:
            assert events.honored.resource_subscriptions == [allowed]
            await watched_on(client, server, "note://1")
    await watched_on(client, server, "")


@pytest.mark.parametrize("session", ["auto"], indirect=True)  # two listen streams of one 2026-07-28 client
async def test_two_subscribers_of_one_resource_keep_the_server_subscribed_until_both_leave(session: Any) -> None:
    client, _, _ = session
    exposed = "cellblock://old/note://1"
    async with client.listen(resource_subscriptions=[exposed]):
        async with client.listen(resource_subscriptions=[exposed]):
            await watched_on(client, "old", "note://1")
        assert text(await client.call_tool("old__watched", {})) == "note://1"  # one stream still wants it
    await watched_on(client, "old", "")


@pytest.mark.parametrize("server", list(SERVERS))
async def test_an_update_of_a_resource_the_lock_now_holds_is_not_passed_on(tmp_path: Path, server: str) -> None:
    defaults = {"tools": {"default": "allow"}, "lock": {"first": "trust"}}
    config = write_config(tmp_path, {server: notes(SERVERS[server])}, defaults=defaults)
    updates: list[str] = []
    arrived = anyio.Event()

    async def message(item: Any) -> None:
        if isinstance(item, types.ResourceUpdatedNotification):
            updates.append(str(item.params.uri))
            arrived.set()

    held, other = f"cellblock://{server}/note://1", f"cellblock://{server}/note://3"
    async with connected(build(config, tmp_path / "state"), mode="legacy", message_handler=message) as client:
        for uri in (held, other):
            await client.subscribe_resource(uri)
        await client.call_tool(f"{server}__retitle", {"uri": "note://1"})
        with anyio.fail_after(20):  # the lock holds the changed note once the gateway has re-read the list
            while held in {str(r.uri) for r in (await client.list_resources()).resources}:  # noqa: ASYNC110 - polled
                await anyio.sleep(0.05)
        await client.call_tool(f"{server}__touch", {"uri": "note://1"})
        await client.call_tool(f"{server}__touch", {"uri": "note://3"})
        with anyio.fail_after(20):
            await arrived.wait()
        assert updates[0] == other  # the held note's update, sent first, never came


@pytest.mark.parametrize("session", ["auto"], indirect=True)  # ttlMs and cacheScope are 2026-07-28's
async def test_a_read_is_not_cached_past_the_gateways_decision_nor_shared(session: Any) -> None:
    client, _, _ = session
    # control: the server itself lets anyone cache a note for a minute
    direct = StdioServerParameters(command=sys.executable, args=[str(NOTES)])
    async with Client(direct, mode="auto") as straight:
        own = await straight.read_resource("note://1")
    assert (own.ttl_ms, own.cache_scope) == (60_000, "public")
    for server in SERVERS:
        read = await client.read_resource(f"cellblock://{server}/note://1")
        assert (read.ttl_ms, read.cache_scope) == (0, "private")
    listed = await client.list_resources()  # a list changes with each approval: never cached either
    assert (listed.ttl_ms, listed.cache_scope) == (0, "private")
