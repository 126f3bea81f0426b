"""The resources the gateway is subscribed to on one server, kept across the server's restarts.

A handshake-era server is sent `resources/subscribe` and `resources/unsubscribe`, once per URI,
and again after each restart; it answers with `notifications/resources/updated`. A 2026-07-28
server has no such requests: the URIs go in the filter of its `subscriptions/listen` stream
(`changes.listen`), which is opened again whenever the set changes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import anyio
from mcp import Client
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

__all__ = ["Watched"]

logger = logging.getLogger(__name__)


@dataclass(eq=False)
class Watched:
    """The URIs subscribed to on one server, and where its updates go (`updated(uri)`)."""

    name: str
    updated: Callable[[str], None] = lambda uri: None
    uris: set[str] = field(default_factory=set)
    _client: Client | None = None  # the current connection, once it is ready
    _changed: anyio.Event = field(default_factory=anyio.Event)  # set at the next change of `uris`

    @staticmethod
    def offered(client: Client) -> bool:
        caps = client.server_capabilities
        return bool(caps.resources and caps.resources.subscribe)

    async def add(self, uri: str) -> None:
        """Subscribe to `uri` (once, however many ask for it).

        Raises:
            MCPError: the server refused (the URI is then not watched).
        """
        if uri in self.uris:
            return
        self.uris.add(uri)
        try:
            await self._send("resources/subscribe", uri)
        except BaseException:
            self.uris.discard(uri)
            raise
        self._tell()

    async def remove(self, uri: str) -> None:
        if uri not in self.uris:
            return
        self.uris.discard(uri)
        self._tell()
        try:
            await self._send("resources/unsubscribe", uri)
        except Exception as exc:  # noqa: BLE001 - best effort: it stops telling, or its updates find no subscriber
            logger.info("server '%s': could not unsubscribe from %s: %s", self.name, uri, exc)

    def next_change(self) -> anyio.Event:
        """An event set the next time the set of URIs changes."""
        return self._changed

    async def connected(self, client: Client | None) -> None:
        """A new connection is ready (or, with None, gone): a handshake-era one is subscribed again."""
        self._client = client
        if client is None or client.protocol_version in MODERN_PROTOCOL_VERSIONS:
            return
        for uri in sorted(self.uris):
            try:
                await client.subscribe_resource(uri)
            except Exception as exc:  # noqa: BLE001 - one refused URI must not fail the new connection
                logger.warning("server '%s': no longer takes the subscription to %s: %s", self.name, uri, exc)

    def _tell(self) -> None:
        changed, self._changed = self._changed, anyio.Event()
        changed.set()

    async def _send(self, method: str, uri: str) -> None:
        client = self._client
        if client is None or client.protocol_version in MODERN_PROTOCOL_VERSIONS:
            return  # the next connection subscribes it; a 2026-07-28 stream re-listens on `_tell`
        if method == "resources/subscribe":
            await client.subscribe_resource(uri)
        else:
            await client.unsubscribe_resource(uri)
