"""What the gateway offers the servers behind it: the questions its client can answer, in the
client's era.

A server learns from its client's capabilities whether it may ask the user (elicitation) or the
client's model (sampling), and some change what they list by it (server-everything adds a tool for
each). The gateway offers a server elicitation and sampling only when the client it serves can
answer them, so a server lists no tool its user cannot use; roots always, as the gateway answers
them itself (the directories of the server's jail).

Over stdio the gateway serves one client, whose first request says what it can do; a server
started before then waits for it (bounded: a client that says nothing is offered everything, as
when no client is expected). `cellblock serve --http` serves several clients at once and
`review` none: their servers are offered everything the gateway can pass on, and each question
still goes only to a client that can answer it (`Caller.can_elicit`, `can_sample`).

The same first request says the client's era. A local server with `protocol: auto` is spoken to
in it (`spoken`): to a client that opened with the `initialize` handshake, the handshake, as the
client would speak to the server itself; the SDK's server spends less on each request in that era
(docs/performance.md). Each start follows what is known when it starts (a start that gave up
waiting is met as configured, a restart after the client spoke follows it), and a server that
answered that handshake with an error is met as configured from then on (`Downstream._connect`).
Every other server, and every server of `--http` or `review`, is met as its config says.
"""

from __future__ import annotations

from collections.abc import Callable

import anyio
import mcp.types as types

from cellblock.gateway.ask.elicitation import elicits, samples
from cellblock.gateway.config.model import LocalServer, RemoteServer

__all__ = ["WAIT_SECONDS", "Offer"]

# How long a server's start waits for the client to introduce itself (a client sends its first
# request as soon as it has started the gateway, long before a jailed server is up).
WAIT_SECONDS = 5.0


class Offer:
    """The capabilities the client the gateway serves declared, once it has (see the module)."""

    def __init__(self) -> None:
        self._client: types.ClientCapabilities | None = None  # None: offer everything
        self._handshake = False  # the client opened with the handshake
        self._known = anyio.Event()
        self._known.set()

    def expecting(self) -> Callable[[types.ClientCapabilities | None, bool], None]:
        """One client will introduce itself, by the function returned: servers wait for it before
        they are offered anything."""
        if self._client is None:
            self._known = anyio.Event()
        return self.introduce

    def introduce(self, capabilities: types.ClientCapabilities | None, handshake: bool) -> None:
        """The client's first request said what it can do (None: it said nothing usable), and
        whether it was the handshake's `initialize`."""
        if not self._known.is_set():
            self._client = capabilities or types.ClientCapabilities()
            self._handshake = handshake
            self._known.set()

    async def client(self) -> types.ClientCapabilities | None:
        """What the client can do (waiting for it, bounded); None when a server is offered everything."""
        with anyio.move_on_after(WAIT_SECONDS):
            await self._known.wait()
        return self._client

    def spoken(self, server: LocalServer | RemoteServer) -> str:
        """The protocol `server` is spoken to in, once `client` has returned: the handshake
        (`legacy`) where it follows a client that opened with one, else its config's."""
        return "legacy" if self._handshake and _follows_client(server) else server.protocol

    @staticmethod
    def names(client: types.ClientCapabilities | None, sampling: str) -> list[str]:
        """What a server is offered, by capability name: roots, and elicitation and sampling where
        the client answers them (and, for sampling, where the server's `sampling:` is not deny)."""
        offered = ["roots"]
        if client is None or elicits(client):
            offered.append("elicitation")
        if sampling != "deny" and (client is None or samples(client)):
            offered.append("sampling")
        return offered


def _follows_client(server: LocalServer | RemoteServer) -> bool:
    """`server` is spoken to in its client's era (see the module): a local one with `protocol:
    auto`. A remote one is not: its transport is its own, not the client's pipe."""
    return isinstance(server, LocalServer) and server.protocol == "auto"
