"""A downstream server's supervision: its start, its restarts, and where it is.

A `Supervisor` runs the connections of one server (`Supervised.run`) one after another. A crash
is followed by a restart with exponential backoff; after `Backoff.restarts` quick failures in a
row the server is marked failed. A failure the user can put right while the gateway runs (a
credential, a login, a remote server that was down) is tried again on the next use. Calls wait
for a start or restart in progress (`ready`), and fail at once on a server that failed.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

import anyio
import anyio.abc

from cellblock.gateway.credentials import CredentialError
from cellblock.gateway.downstream.backoff import Backoff, OutOfDescriptors, short_of_descriptors
from cellblock.gateway.downstream.connection import START_SECONDS
from cellblock.gateway.downstream.packages import InstallError
from cellblock.gateway.downstream.rounds import DownstreamError
from cellblock.sandbox.types import JailError

__all__ = ["START_SECONDS", "State", "Supervised", "Supervisor"]

logger = logging.getLogger(__name__)


class State(StrEnum):
    """Where a server's supervisor is (a string, as `cellblock ps` shows it)."""

    STOPPED = "stopped"
    STARTING = "starting"
    READY = "ready"
    RESTARTING = "restarting"
    FAILED = "failed"


class Supervised(Protocol):
    """What the supervisor needs of the server it keeps running (`downstream/server.py`)."""

    @property
    def is_remote(self) -> bool: ...

    async def run(self) -> None:
        """One run, from its start until it ends (`Supervisor.up` once it is ready): one connection,
        or two when the server refuses the era it was first spoken to in."""

    def ended(self, exc: BaseException | None) -> str:
        """Why the run ended: it exited (`exc` None), or `exc`; with what the server last wrote."""

    def refused(self) -> bool:
        """The remote server refused us or wants a login: the user can put it right."""

    def drop(self) -> None:
        """Forget the connection's client: calls from now on wait for the next one, or fail."""


@dataclass(eq=False)
class Supervisor:
    """One server's supervision; see the module docstring."""

    name: str
    server: Supervised
    event: Callable[..., None]  # an audit event about this server
    backoff: Backoff = field(default_factory=Backoff)  # the waits between restarts of a server that keeps crashing
    state: State = State.STOPPED
    error: str | None = None
    last_exit: str | None = None  # why the server last stopped, for `cellblock ps`
    restart_reason: str | None = None  # why the gateway ended the current connection itself
    tg: anyio.abc.TaskGroup | None = None  # where it runs, once started
    _ready: anyio.Event = field(default_factory=anyio.Event)
    _settled: anyio.Event = field(default_factory=anyio.Event)
    _started: bool = False
    # failed for a reason the user can fix while the gateway runs (a credential, a remote server
    # that was down): the next use starts it again
    _retry_on_use: bool = False
    _closed: anyio.Event | None = None  # set to end the current connection
    _uncounted = False  # ...and it was no failure of the server's (a path shared with it): not counted
    _ran: bool = False  # the current run was ready: its end is an exit to tell

    def start(self, tg: anyio.abc.TaskGroup) -> None:
        """Start the supervisor in `tg` (once)."""
        if not self._started:
            self._started = True
            self.tg = tg
            self.state = State.STARTING
            tg.start_soon(self._supervise)

    async def wait_settled(self, timeout: float) -> None:
        """Wait until the first start attempt has succeeded or failed, at most `timeout` s."""
        with anyio.move_on_after(timeout):
            await self._settled.wait()

    async def ready(self) -> None:
        """Wait for a (re)start in progress, at most `START_SECONDS`.

        Raises:
            DownstreamError: the server is failed.
        """
        self.retry()
        if self.state == State.FAILED:
            raise self.not_running()
        with anyio.move_on_after(START_SECONDS):
            await self._ready.wait()

    def not_running(self) -> DownstreamError:
        """The error of a call to a server that is failed, or did not come up in time."""
        return DownstreamError(f"server '{self.name}' is not running: {self.error or 'did not start in time'}")

    @property
    def retryable(self) -> bool:
        """Failed for a reason the user can fix while the gateway runs; see `retry`."""
        return self.state == State.FAILED and self._retry_on_use

    def retry(self) -> bool:
        """Start again a server that failed for a reason the user may have fixed since (a missing
        credential, a login, a remote server that was down). True when a new attempt began."""
        if not self.retryable or self.tg is None:
            return False
        self._retry_on_use = False
        self.state, self._ready, self._settled = State.STARTING, anyio.Event(), anyio.Event()
        self.tg.start_soon(self._supervise)
        return True

    def reconnect(self) -> bool:
        """After a credential changed: start a failed server again, or reconnect a running one so
        it reads the keyring anew (a token set, replaced or logged out). True when something began."""
        if self.retry():
            return True
        if self.state == State.READY and self._closed is not None:
            self.event("server_reconnect", reason="its credentials changed")
            self._closed.set()
            self._waiting("reconnecting: its credentials changed")  # calls wait for the new connection
            return True
        return False

    def restart(self, reason: str, counted: bool = True) -> None:
        """End the current connection (how the server behaves; not `counted`, a path shared with it)."""
        if self.restart_reason is None and self._closed is not None:
            logger.warning("server '%s' is restarted: %s", self.name, reason)
            self.restart_reason, self._uncounted = reason, not counted
            # calls from now on wait for the new process, never reach the one being ended
            self._waiting(reason)
            self._closed.set()

    # -- what a run tells its supervisor ------------------------------------------------------

    def opened(self) -> anyio.Event:
        """A run begins: the event that, set, ends its connection."""
        self._closed = anyio.Event()
        return self._closed

    def up(self) -> None:
        """The run's server is ready: waiting calls go on."""
        self.state, self.error = State.READY, None
        self._ready.set()

    def settled(self) -> None:
        """The run's catalog has been reviewed: the first start attempt is over."""
        self._settled.set()

    def ran(self) -> None:
        """The run's connection ended after it was ready: calls wait for the restart."""
        self._ran = True
        self._waiting(self.exit_reason)

    def lost(self, reason: str) -> None:
        """The connection is no longer usable (`reason`): end it; calls wait for the new one."""
        self._down(reason)
        if self._closed is not None:
            self._closed.set()

    @property
    def exit_reason(self) -> str:
        return self.restart_reason or self.server.ended(None)

    # -- the loop ---------------------------------------------------------------------------------

    async def _supervise(self) -> None:
        failures = 0
        while True:
            began = anyio.current_time()
            self.restart_reason, exhausted, self._uncounted = None, False, False
            try:
                await short_of_descriptors(self.server.run(), alone=(InstallError, JailError, CredentialError))
                reason = self.exit_reason
            except InstallError as exc:
                # `cellblock install` puts it right; the next call retries
                self._fail(self.server.ended(exc), retry_on_use=True)
                return
            except JailError as exc:
                # no jail, no start: retrying cannot help and running unjailed is not an option
                self._fail(self.server.ended(exc))
                return
            except CredentialError as exc:
                # restarting cannot conjure a token; the user adds it, and the next call retries
                self._fail(str(exc), retry_on_use=True)
                return
            except Exception as exc:  # noqa: BLE001 - the supervisor: any failure means restart, never a crash
                exhausted = isinstance(exc, OutOfDescriptors)  # the gateway's state: it passes, never given up on
                reason = self.server.ended(exc)
                if self.server.refused():
                    self._fail(reason, retry_on_use=True)
                    return
            self._down(reason)
            lasted = math.inf if self._uncounted else anyio.current_time() - began
            failures = self.backoff.count(failures, lasted, exhausted)
            if failures > self.backoff.restarts:
                self._fail(
                    f"{reason} (gave up after {self.backoff.restarts} restarts)", retry_on_use=self.server.is_remote
                )
                return
            delay = self.backoff.delay(failures)
            logger.warning("server '%s' is down (%s); restarting in %.1fs", self.name, reason, delay)
            self._settled.set()
            await anyio.sleep(delay)

    def _fail(self, reason: str, retry_on_use: bool = False) -> None:
        self.event("server_failed", reason=reason)
        self._retry_on_use = retry_on_use
        self.state, self.error = State.FAILED, reason
        self.server.drop()
        logger.error("server '%s' failed: %s", self.name, reason)
        self._settled.set()
        self._ready.set()  # wake waiting calls: they see the failure

    def _down(self, reason: str) -> None:
        self.event("server_exit" if self.state == State.READY or self._ran else "server_start_failed", reason=reason)
        self._ran = False
        self._waiting(reason)

    def _waiting(self, reason: str) -> None:
        """Calls from now on wait for the restart instead of failing at once."""
        self.server.drop()
        self.last_exit = reason
        self.error = reason
        self.state = State.RESTARTING
        if self._ready.is_set():
            self._ready = anyio.Event()
