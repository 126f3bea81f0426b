"""The connections `serve --http` holds: how many at once, how long a request may take to arrive,
and what running out of file descriptors costs (nothing that lasts).

uvicorn serves the requests, but left to itself it takes every connection asyncio's accept loop
hands it and waits for a request as long as a client likes; once descriptors run out, asyncio
logs a traceback for every connection waiting in the backlog at every turn of the loop (1,100
half-sent requests: authenticated clients timed out, 91 MB of log in 20 s, and servers starting
then failed for good). So the gateway accepts its connections itself (`Connections.serve`):

- at most `cap` at once (`connection_cap`): half of the open files beyond `RESERVED_FILES` for
  the gateway's own, so that servers starting, and their egress, keep theirs; the limit of open
  files is first raised to the hard limit (`open_files`);
- at the cap, the connection that has waited longest for its client (a request begun and not
  arrived, none begun, or an answer its client does not take) is closed for each new one: a flood
  of half-sent requests, or of requests whose answers are never read, pushes out its own
  connections, never a client that sends its request at once and reads its answer, nor a stream
  being answered;
- a request, head and body, must arrive within `ARRIVAL_SECONDS` of when the gateway began to
  wait for it (the connection, or the last answer on it), and an answer the kernel holds no more
  of for the client must be taken within as long: a client that never reads would otherwise hold
  its connection for good, answered and so never waiting for a request;
- a failed accept waits and tries again, and what a client makes the gateway log is budgeted
  (`http.BudgetedLog`).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import sys
from collections.abc import Callable
from typing import Any

import anyio
import h11
from uvicorn.config import Config
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.server import ServerState

from cellblock.gateway.downstream.ratelimit import Budget
from cellblock.sandbox.unix import accept

__all__ = [
    "ARRIVAL_SECONDS",
    "MAX_CONNECTIONS",
    "RESERVED_FILES",
    "Connection",
    "Connections",
    "connection_cap",
    "open_files",
]

logger = logging.getLogger(__name__)

# Seconds for a request (head and body) to arrive once the gateway waits for one, and for a client
# to take an answer the kernel holds no more of. A client sends its request at once and reads what
# it asked for; only a connection held open on purpose takes this long.
ARRIVAL_SECONDS = 10.0
# Connections at once, whatever the limit of open files: a few clients, each with a stream or two
# open and a request in flight, need a few dozen.
MAX_CONNECTIONS = 512
FEWEST_CONNECTIONS = 8
# Descriptors kept for the gateway itself (its listeners, state and audit files, the keyring's
# bus) beyond which HTTP connections may take half; servers and their egress have the rest.
RESERVED_FILES = 64
# Where the hard limit is "unlimited", the soft one is raised this far (Linux's default nr_open).
_MOST_FILES = 1 << 20
# A report of the gateway's own trouble with its connections: one every 10 s at most, with a count.
_TELL_RATE = 0.1


def open_files() -> int:
    """Raise this process's soft limit of open files to its hard limit, and return the soft limit now.

    Sound: a child (a server) inherits the raised limit, but could have raised it itself; epoll,
    not select, waits on the descriptors, so numbers past 1,024 are fine.
    """
    if sys.platform == "win32":  # no such limit to raise: the cap alone holds
        return _MOST_FILES
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = _MOST_FILES if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
        except (ValueError, OSError) as exc:  # a hard limit above the kernel's nr_open: keep the soft one
            logger.debug("cannot raise the limit of open files to %d: %s", wanted, exc)
    return _MOST_FILES if soft == resource.RLIM_INFINITY else soft


def connection_cap(files: int) -> int:
    """How many HTTP connections at once when the process may open `files` descriptors."""
    return max(FEWEST_CONNECTIONS, min(MAX_CONNECTIONS, (files - RESERVED_FILES) // 2))


class Connections:
    """The HTTP connections of one gateway: accepted here, at most `cap` at once."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self._open: set[Connection] = set()
        # connections waiting for their client, the longest waiting first
        self._waiting: dict[Connection, None] = {}
        self._closed = anyio.Event()
        self._scope = anyio.CancelScope()
        self._full = Budget(rate=_TELL_RATE, burst=1.0)
        self._late = Budget(rate=_TELL_RATE, burst=1.0)

    async def serve(self, sock: socket.socket, factory: Callable[[], Connection]) -> None:
        """Accept connections on the listening `sock` for `factory`'s protocol until `stop`."""
        loop = asyncio.get_running_loop()
        sock.setblocking(False)
        with self._scope:
            while True:
                await anyio.wait_readable(sock)  # room is made only for a connection that is there
                while len(self._open) >= self.cap:
                    self._make_room()
                    await self._closed.wait()
                conn = await accept(sock, "serve --http")
                try:
                    await loop.connect_accepted_socket(factory, conn)
                except OSError as exc:  # the loop could not watch it (out of memory): the client tries again
                    conn.close()
                    logger.warning("serve --http: could not take a connection: %s", exc.strerror)

    def stop(self) -> None:
        """Accept no more connections (those open stay, for the server's shutdown to end)."""
        self._scope.cancel()

    def _make_room(self) -> None:
        if self._full.take():
            dropped = self._full.settle()
            logger.warning(
                "serve --http: %d connections at once, the most it takes; closing the one waiting longest "
                "for its client for each new one%s",
                self.cap,
                f" ({dropped} more times since the last report)" if dropped else "",
            )
        for connection in self._waiting:
            connection.drop()
            return  # the oldest; the loop comes back once it has closed

    # -- told by the connections --------------------------------------------------------------

    def opened(self, connection: Connection) -> None:
        self._open.add(connection)

    def waiting(self, connection: Connection) -> None:
        self._waiting.setdefault(connection, None)

    def busy(self, connection: Connection) -> None:
        self._waiting.pop(connection, None)

    def late(self, untaken: bool) -> None:
        if self._late.take():
            dropped = self._late.settle()
            logger.info(
                "serve --http: closed a connection whose %s within %gs%s",
                "client did not take its answer" if untaken else "request did not arrive",
                ARRIVAL_SECONDS,
                f" ({dropped} more since the last report)" if dropped else "",
            )

    def closed(self, connection: Connection) -> None:
        self._open.discard(connection)
        self._waiting.pop(connection, None)
        self._closed.set()
        self._closed = anyio.Event()


class Connection(H11Protocol):
    """uvicorn's HTTP/1.1 connection, counted by `pool`, with `ARRIVAL_SECONDS` for each request."""

    def __init__(self, pool: Connections, config: Config, server_state: ServerState, app_state: dict[str, Any]):
        super().__init__(config, server_state, app_state)
        self._pool = pool
        self._deadline: asyncio.TimerHandle | None = None

    @property
    def waiting(self) -> bool:
        """Waiting for its client: for a request to begin, for the rest of one begun, or to take
        an answer (the kernel holds no more of it: `pause_writing`), even one it was closed after."""
        if self.untaken:
            return True
        return not self.transport.is_closing() and self.conn.their_state in (h11.IDLE, h11.SEND_BODY)

    @property
    def untaken(self) -> bool:
        """An answer is written that its client does not take: the kernel holds no more of it."""
        return self.flow.write_paused

    def drop(self) -> None:
        """Close the connection now, whatever it was waiting for: an answer not taken is thrown
        away (a close would wait for the client to take it first)."""
        self._pool.busy(self)
        self.transport.abort()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]  # as uvicorn's
        super().connection_made(transport)
        # told (`pause_writing`) as soon as the kernel holds no more of an answer, not 64 KiB later:
        # an answer its client does not take is then what the connection waits for
        transport.set_write_buffer_limits(high=0)
        self._pool.opened(self)
        self._watch()

    def pause_writing(self) -> None:
        super().pause_writing()
        self._watch()

    def resume_writing(self) -> None:
        super().resume_writing()
        self._watch()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._watch()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._watch()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self._disarm()
        self._pool.closed(self)

    def _watch(self) -> None:
        if not self.waiting:
            self._disarm()
            self._pool.busy(self)
        elif self._deadline is None:
            # from the moment it began to wait: a request sent a byte at a time gets no longer
            self._deadline = self.loop.call_later(ARRIVAL_SECONDS, self._too_late)
            self._pool.waiting(self)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _too_late(self) -> None:
        self._deadline = None
        if self.waiting:
            self._pool.late(self.untaken)
            self.drop()
