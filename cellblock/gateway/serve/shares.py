"""The `share` stage: a path in a call's arguments that the server's jail does not share is put to
the user before the call runs, never silently written into the server's private home.

Flatpak's document portal is the model: the user's choice of a file is the grant. For a tool call
to a jailed local server, after the policy (its `deny` and `under:` constraints decide first) and
before the call's own approval, each argument that names a path in the user's home outside every
grant of that jail (`policy/pathargs.py`: what counts, and the least grant that works) is judged
by the gate every grant passes (`Gate`, the rules of `scan/gate.py`: never the home or above, a
secret, Cellblock's own, a socket, a hidden or program folder made writable): a grant it refuses
refuses the call, naming the path and why, and nobody is asked. Otherwise the user is asked,
through the same `Approvals` as an `ask` (the client's form, else a pending approval that
`cellblock approve ID [--always]` answers; silence refuses), to share it with this server:

- **until the server stops** (`share_once`, `cellblock approve ID`): the grant is added to the
  running server's jail; bwrap cannot add a mount to a running jail, so the server is restarted
  with it, and the call runs on the new process. It lasts while this gateway runs the server (a
  crash and restart keeps it) and goes with the gateway: the next one starts from the config;
- **always** (`share_always`, `--always`): the grant is written to the config file by the one
  config writer (`Gate.keep`, the writer of `scan --apply`, atomic, the gate judged again) and
  applied the same way;
- **deny**, or no answer: the call is refused, naming the path; nothing is made or shared.

What is made for a grant (a missing folder, or an empty file in the home itself) is made only
after the user shared it. Read-only tools (`readOnlyHint`) are shared what they read, read-only;
others read-write. A server with `learn: true` is not asked for: its calls meet the jail as it is,
and its trace is what `scan --from-learned` proposes grants from, through the same gate; nor is
one whose jail says `call_paths: private` (what a call names is its own, in its private home).
Without a gate (the in-memory harness), the stage is left out.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import anyio

from cellblock.gateway.config.model import JailConfig, LocalServer
from cellblock.gateway.downstream.server import Downstream
from cellblock.gateway.downstream.supervisor import State
from cellblock.gateway.serve.approvals import Approvals
from cellblock.gateway.serve.pipeline import Call, Refused, Wait
from cellblock.gateway.state import StateWriteError
from cellblock.policy.files import make_dirs
from cellblock.policy.pathargs import (
    Grant,
    Make,
    PathArgument,
    covered,
    grant_for,
    on_disk,
    path_arguments,
    shared,
)
from cellblock.policy.text import visible
from cellblock.policy.types import Decision, Verdict

__all__ = ["Gate", "Shares", "share_command", "share_key"]

MAX_ASKED = 256  # shares asked about whose grant's folder or file is remembered to make on a late "always"


class Gate(Protocol):
    """The rules every grant passes, and the config writer (`scan/shares.py`)."""

    def check(self, path: str, write: bool, writable: list[str]) -> str | None:
        """Why `path` may not be shared (`write`: read-write), None if it may; `writable`: where
        every jail of the config may write."""

    def keep(self, server: str, path: str, write: bool) -> bool:
        """Write the grant into the config file of `server`'s jail; False when it has it already.

        Raises:
            StateWriteError: it was not written, and why.
        """


def share_command(server: str, grant: Grant) -> str:
    """The command that shares `grant` with `server` for good (`cellblock share`), after what
    makes it: a denied share names it, as a refused connection names `cellblock allow-host`."""
    path = shlex.quote(grant.path)
    make = {"dir": f"mkdir -p {path} && ", "file": f"touch {path} && "}.get(grant.make, "")
    return visible(f"{make}cellblock share {server} {path}{'' if grant.write else ' --read-only'}")


def share_key(grant: Grant) -> str:
    """How a share is named in an approval (its `tool`): "read_write:PATH" or "read_only:PATH"."""
    return f"{'read_write' if grant.write else 'read_only'}:{grant.path}"


class Shares:
    """The `share` stage for the servers in `downstreams`, asking through `approvals`."""

    def __init__(
        self,
        downstreams: dict[str, Downstream],
        approvals: Approvals,
        gate: Gate,
        home: Callable[[], str] = lambda: os.path.expanduser("~"),
    ) -> None:
        self._downstreams = downstreams
        self._approvals = approvals
        self._gate = gate
        self._home = home
        self._makes: dict[tuple[str, str], Make] = {}  # (server, share_key) asked -> what its grant makes
        approvals.keepers["share"] = self._always

    def stage(self, call: Call) -> Wait | None:
        """None when the call names no path in the home its jail does not share; else the wait
        that refuses it, or asks and shares before it runs."""
        ds = self._downstreams.get(call.server)
        # a server that learns (`learn: true`) meets its jail as it is: the trace `scan --from-learned` reads
        jail = _jail(ds) if ds is not None else None
        if call.kind != "tool" or ds is None or jail is None or jail.call_paths == "private" or _learns(ds):
            return None
        home = self._home()
        unshared = [a for a in path_arguments(call.arguments, home) if not self._shared(ds, a.path)]
        if not unshared:  # most calls: nothing more to look up
            return None
        writes = not _read_only(ds, call.tool)
        wanted: list[tuple[PathArgument, Grant]] = []
        for argument in unshared:
            grant = grant_for(argument.path, home, writes, on_disk)
            if grant is not None and grant.path not in (g.path for _, g in wanted):
                wanted.append((argument, grant))
        if not wanted:
            return None

        async def share() -> None:
            for argument, grant in wanted:
                await self._share(call, ds, argument, grant)

        return share

    async def grant(self, server: str, path: str, write: bool) -> bool:
        """Apply a grant `cellblock share` wrote into the config: the running server is restarted
        with it. False when this gateway runs no such jailed server, or its jail shares it already.

        Raises:
            Refused: the gate refuses it now, or it does not exist (nothing is made for it).
        """
        ds = self._downstreams.get(server)
        jail = _jail(ds) if ds is not None else None
        if ds is None or jail is None or covered(path, jail.read_only, jail.read_write, write):
            return False
        if on_disk(path) is None:  # gone since the command looked: a jail granting it would not build
            raise Refused(
                Verdict(Decision.DENY, "share", f"{visible(path)} does not exist, so '{server}' was not restarted")
            )
        await self._apply(ds, Grant(path, write))
        return True

    def _shared(self, ds: Downstream, path: str) -> bool:
        jail = _jail(ds)
        grants = [*jail.read_only, *jail.read_write] if jail is not None else []
        return shared(path, grants) or shared(os.path.realpath(path), [os.path.realpath(g) for g in grants])

    async def _share(self, call: Call, ds: Downstream, argument: PathArgument, grant: Grant) -> None:
        named = f"{visible(argument.given)} (argument {visible(argument.where)})"
        if self._shared(ds, argument.path):  # shared meanwhile (an earlier path's grant holds it)
            return
        why = await anyio.to_thread.run_sync(self._gate.check, grant.path, grant.write, self._writable(grant.path))
        if why is not None:
            raise Refused(
                Verdict(
                    Decision.DENY,
                    "share",
                    f"{named} is not shared with server '{ds.name}', and cannot be: {why}. Nothing was written "
                    f"there; give the tool a path in a folder the server is given ('cellblock share {ds.name} "
                    "FOLDER' gives it one)",
                ),
                path=argument.path,
            )
        asked = dataclasses.replace(call, kind="share")
        self._makes[(call.server, share_key(grant))] = grant.make
        while len(self._makes) > MAX_ASKED:  # the model's calls make these: keep them bounded
            del self._makes[next(iter(self._makes))]
        question = Verdict(Decision.ASK, call.tool, "")  # the form names the call's tool
        verdict = await self._approvals.decide(call.server, share_key(grant), call.name, question, asked)
        call.human = None  # the answer was to this question: the call's own approval is asked anew
        if verdict.decision is not Decision.ALLOW:
            raise Refused(
                Verdict(
                    Decision.DENY,
                    "share",
                    f"{named} is not shared with server '{ds.name}', and the user did not share it: "
                    f"{verdict.reason}. Nothing was written there; to share it, call again and share it, or run "
                    f"'{share_command(ds.name, grant)}'",
                ),
                path=argument.path,
            )
        await self._apply(ds, grant)

    def _writable(self, path: str) -> list[str]:
        """Where every jail may write now, but `path` itself."""
        jails = [j for ds in self._downstreams.values() if (j := _jail(ds)) is not None]
        return [p for jail in jails for p in jail.read_write if p != path]

    async def _always(self, server: str, key: str) -> None:
        """The keeper of a share's "always": written to the config, then applied.

        Raises:
            StateWriteError: the config could not be written; nothing is shared.
        """
        ds = self._downstreams.get(server)
        if ds is None or _jail(ds) is None:
            raise StateWriteError(f"server '{server}' has no jail to share a path with")
        mode, _, path = key.partition(":")
        # what to make, as it was asked (the answer may come from the terminal after the call gave up)
        grant = Grant(path, mode == "read_write", self._makes.get((server, key), ""))
        try:
            await anyio.to_thread.run_sync(_make, grant)  # a grant of what does not exist would not start
        except OSError as exc:
            raise StateWriteError(f"{grant.path} could not be made to share it: {exc.strerror}") from exc
        await anyio.to_thread.run_sync(self._gate.keep, server, grant.path, grant.write)
        try:
            await self._apply(ds, grant)
        except Refused as exc:  # the keeper's caller (an answer from the terminal) knows this one
            raise StateWriteError(exc.verdict.reason) from exc

    async def _apply(self, ds: Downstream, grant: Grant) -> None:
        """Make what the grant needs, add it to the jail, and restart a running server with it."""
        config = ds.config
        if not isinstance(config, LocalServer) or config.jail is False:
            return
        jail = config.jail
        if grant.path in (jail.read_write if grant.write else jail.read_only):
            return
        # judged again as it is now: what the user was asked about may have changed while they read
        why = await anyio.to_thread.run_sync(self._gate.check, grant.path, grant.write, self._writable(grant.path))
        if why is not None:
            raise Refused(Verdict(Decision.DENY, "share", f"{visible(grant.path)} cannot be shared: {why}"))
        try:
            await anyio.to_thread.run_sync(_make, grant)
        except OSError as exc:
            raise Refused(
                Verdict(Decision.DENY, "share", f"{visible(grant.path)} could not be made to share it: {exc.strerror}"),
                path=grant.path,
            ) from exc
        key = "read_write" if grant.write else "read_only"
        added = jail.model_copy(update={key: [*getattr(jail, key), grant.path]})
        ds.config = config.model_copy(update={"jail": added})
        if ds.audit is not None:
            ds.audit.note("share", ds.name, path=grant.path, mode=key, made=grant.make or None)
        if ds.supervisor.state in (State.READY, State.STARTING):
            # a mount cannot be added to a running jail: the call waits for the new process
            ds.supervisor.restart(f"{grant.path} was shared with it ({key})", counted=False)


def _make(grant: Grant) -> None:
    if grant.make == "dir":
        make_dirs(Path(grant.path))
    elif grant.make == "file":
        with contextlib.suppress(FileExistsError):
            os.close(os.open(grant.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))


def _jail(ds: Downstream) -> JailConfig | None:
    config = ds.config
    return config.jail if isinstance(config, LocalServer) and config.jail is not False else None


def _read_only(ds: Downstream, tool: str) -> bool:
    """The server marks `tool` read-only (`readOnlyHint`): what it names is shared read-only."""
    listing = ds.listing
    found = next((t for t in listing.tools if t.name == tool), None) if listing is not None else None
    hints = found.annotations if found is not None else None
    return bool(hints is not None and hints.read_only_hint)


def _learns(ds: Downstream) -> bool:
    return isinstance(ds.config, LocalServer) and ds.config.learn
