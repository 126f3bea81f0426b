"""Whether a server that is not running can start, asked before a call to it goes any further.

A server whose package is not installed, or whose secret the keyring does not give, cannot start
however often it is tried, and only a command of the user's puts it right (`cellblock install
NAME`, `cellblock auth set ENTRY`). A call to one is refused at once with that cause and command,
before anyone is asked to approve it (`Pipeline`'s `start` stage). When the cause is gone (the
user ran the command while the gateway runs), the server is started again and the call goes on.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Mapping

import anyio.to_thread

from cellblock.gateway.config.model import LocalServer
from cellblock.gateway.credentials import CredentialError
from cellblock.gateway.downstream.packages import InstallError, installed, recorded
from cellblock.gateway.downstream.server import Downstream
from cellblock.gateway.downstream.supervisor import State

__all__ = ["cannot_start", "startable_of", "unavailable_of", "unstartable", "why_down"]


async def cannot_start(ds: Downstream) -> str | None:
    """Why the local server of `ds` cannot start now, for a cause the user puts right with a
    command (the message names it); None when nothing known stops it. The install's record and
    the keyring's entries; the installed files too once it failed (they may be why), since
    checking them costs a read of the tree."""
    if not isinstance(ds.config, LocalServer):
        return None  # a remote server's login and reachability are found out by connecting
    try:
        if ds.supervisor.state is State.FAILED:
            await anyio.to_thread.run_sync(installed, ds.name, ds.config)
        else:
            recorded(ds.name, ds.config)
        await ds.keys.environment()
    except (InstallError, CredentialError) as exc:
        return str(exc)
    return None


async def why_down(ds: Downstream) -> str | None:
    """Why `ds` does not run and cannot: it failed for good, or cannot start for a cause only the
    user puts right; None when it runs or may start. Changes nothing (`cellblock ps` shows it)."""
    if ds.supervisor.state is State.READY:
        return None
    if ds.supervisor.state is State.FAILED and not ds.supervisor.retryable:
        return f"server '{ds.name}' is not running: {ds.supervisor.error}"
    cause = await cannot_start(ds)
    return None if cause is None else f"server '{ds.name}' cannot start: {cause.removeprefix(f'server {ds.name!r}: ')}"


async def unstartable(ds: Downstream) -> str | None:
    """`why_down`, for a call to `ds` about to go further; a server that had failed for a cause
    the user has put right since is started again (the call waits for it, as any call does)."""
    why = await why_down(ds)
    if why is None:
        ds.supervisor.retry()
    return why


def startable_of(downstreams: Mapping[str, Downstream]) -> Callable[[str], Callable[[], Awaitable[str | None]] | None]:
    """For the pipeline's `start` stage: server -> None when it runs, else what says why it cannot
    start (`unstartable`)."""

    def startable(server: str) -> Callable[[], Awaitable[str | None]] | None:
        ds = downstreams[server]
        return None if ds.supervisor.state is State.READY else functools.partial(unstartable, ds)

    return startable


def unavailable_of(downstreams: Mapping[str, Downstream], separator: str) -> Callable[[str], str | None]:
    """For a name that is not in the catalog: why it may belong to a server that is down (a
    server that failed for a cause the user may have put right is started again), else None."""

    def unavailable(name: str) -> str | None:
        prefix, sep, _ = name.partition(separator)
        ds = downstreams.get(prefix) if sep else None
        if ds is not None and ds.supervisor.retryable:
            error = ds.supervisor.error
            ds.supervisor.retry()  # the user may have put it right: its tools are announced if it starts
            return f"server '{ds.name}' is not running: {error}"
        if ds is not None and ds.supervisor.state in (State.FAILED, State.RESTARTING, State.STARTING):
            return f"server '{ds.name}' is not available ({ds.supervisor.state}): {ds.supervisor.error or 'starting'}"
        return None

    return unavailable
