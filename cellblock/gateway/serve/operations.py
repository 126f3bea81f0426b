"""What the CLI asks of a running gateway over its control socket (`serve/control.py`):
pending approvals and their answers, a revoke, a reconnect after a credential changed, and `ps`."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cellblock.gateway.audit.log import Audit
from cellblock.gateway.config.model import Config, LocalServer
from cellblock.gateway.downstream.server import Downstream
from cellblock.gateway.downstream.startable import why_down
from cellblock.gateway.serve.approvals import Approvals
from cellblock.gateway.serve.control import NOT_FOUND, ControlServer, socket_path
from cellblock.gateway.serve.details import details
from cellblock.gateway.serve.locking import Locks
from cellblock.gateway.serve.pending import ANSWERED_FROM, OnceOnly
from cellblock.gateway.serve.pipeline import Refused
from cellblock.gateway.serve.review import Review
from cellblock.gateway.serve.shares import Shares
from cellblock.gateway.state import StateWriteError

__all__ = ["Operations"]

KINDS = ("tool", "prompt", "resource")


@dataclass
class Operations:
    """The control socket's requests, answered from the gateway's parts."""

    config: Config
    state: Path
    locks: Locks
    approvals: Approvals
    downstreams: dict[str, Downstream]
    shares: Shares | None  # the paths shared with servers (None: nobody is asked)
    source: Path | None  # the config file this gateway serves
    review: Review

    def control(self, runtime: Path, audit: Audit) -> ControlServer:
        """The control socket this gateway answers on, in `runtime`: the processes of its own
        servers are refused, and each refusal (a foreign uid, a server, no or a wrong token) is audited."""

        def servers() -> set[int]:
            return {ds.channel.pid for ds in self.downstreams.values() if ds.channel is not None and ds.channel.pid}

        def refused(op: str, pid: int | None, uid: int | None, why: str) -> None:
            audit.note("control_refused", "", op=op, peer_pid=pid, peer_uid=uid, reason=why)

        return ControlServer(socket_path(runtime), self.answer, servers, refused)

    async def answer(self, message: dict[str, Any]) -> dict[str, Any]:
        """One request from the control socket (the CLI of the same user)."""
        op = message.get("op")
        if op == "pending":
            full = message.get("full")  # one approval's id: its arguments in full
            if full is not None and not isinstance(full, str):
                return {"ok": False, "error": "'full' must be a pending approval's id"}
            return {"ok": True, "pending": self.approvals.listing(full)}
        if op in ("approve", "deny"):
            ident = str(message.get("id", ""))
            scope = str(message.get("scope", "once")) if op == "approve" else None
            if scope not in (None, "once", "session", "always"):
                return {"ok": False, "error": f"unknown scope {scope!r}"}
            via = message.get("via", "cli")
            if via not in ANSWERED_FROM:
                return {"ok": False, "error": f"'via' is one of {', '.join(ANSWERED_FROM)}"}
            try:
                found = await self.approvals.answer(ident, scope, via)
            except StateWriteError as exc:  # the approval stays pending: approve it for now, or free space
                return {"ok": False, "error": f"the 'always' approval was not saved: {exc}; it is still pending"}
            except OnceOnly as exc:
                return {"ok": False, "error": str(exc)}
            if not found:
                return {"ok": False, "error": f"no pending approval '{ident}'", "code": NOT_FOUND}
            return {"ok": True}
        if op == "held":  # the held catalogs, each with the hash an approval is bound to
            return {"ok": True, "held": self.review.held()}
        if op == "approve_catalog":
            return await self.review.approve_catalog(message.get("server"), message.get("hash"))
        if op == "revoke":
            # `cellblock revoke` changed approvals.json; what this gateway holds of the same goes too
            server, tool, kind = message.get("server"), message.get("tool"), message.get("kind", "tool")
            if not isinstance(server, str) or not isinstance(tool, str | None) or kind not in KINDS:
                return {
                    "ok": False,
                    "error": "revoke takes a 'server', a 'tool' (or null) and a 'kind' of " + str(KINDS),
                }
            gone = self.approvals.forget(server, tool, kind)
            return {"ok": True, "revoked": [{"kind": k, "tool": t, "scope": scope} for k, t, scope in gone]}
        if op == "allow_host":
            # `cellblock allow-host` wrote it into this gateway's config: its proxy allows it now
            ds = self.downstreams.get(str(message.get("server", "")))
            entry = message.get("entry")
            if ds is None or not self._ours(message) or not isinstance(entry, str) or ds.egress.jail is None:
                return {"ok": True, "applied": False}  # another config, or a server without a proxy
            try:
                ds.egress.allow(entry)
            except ValueError as exc:
                return {"ok": False, "error": f"not an allow_hosts entry: {exc}"}
            return {"ok": True, "applied": True}
        if op == "share":
            # `cellblock share` wrote a grant into this gateway's config: the server restarts with it
            server, path, write = message.get("server"), message.get("path"), message.get("write")
            shares = self.shares
            if shares is None or not self._ours(message) or not isinstance(server, str) or not isinstance(path, str):
                return {"ok": True, "applied": False}  # another config, or a gateway without the stage
            try:
                applied = await shares.grant(server, path, write is True)
            except Refused as exc:
                return {"ok": False, "error": exc.verdict.reason}
            return {"ok": True, "applied": applied}
        if op == "reconnect":
            # `cellblock auth set|login|logout` changed a credential this server uses
            ds = self.downstreams.get(str(message.get("server", "")))
            if ds is None:
                return {"ok": False, "error": f"no server '{message.get('server')}'", "code": NOT_FOUND}
            return {"ok": True, "restarted": ds.supervisor.reconnect(), "state": ds.supervisor.state}
        if op == "ps":
            servers = [
                {
                    "name": name,
                    "state": ds.supervisor.state,
                    "jail": _network_of(ds),
                    # what built its jail the last time it started (None: not started, or no jail)
                    "backend": ds.plan.backend
                    if ds.plan is not None and _network_of(ds) not in (False, "remote")
                    else None,
                    "not_enforced": list(ds.plan.gaps) if ds.plan is not None else [],
                    "tools": len(ds.listing.tools) if ds.listing else 0,
                    "calls": ds.calls,
                    "fast_calls": ds.fast_calls,
                    "last_exit": ds.supervisor.last_exit,
                    # why it does not run and what to do, as a call to it is told (None: it runs or may)
                    "down": await why_down(ds),
                    # its stderr lines, jail, package and lock (`serve/details.py`)
                    **await details(self.config, self.state, self.locks, name, ds),
                }
                for name, ds in self.downstreams.items()
            ]
            pending = len(self.approvals.listing())
            return {
                "ok": True,
                "pid": os.getpid(),
                "config": str(self.source),
                "servers": servers,
                "pending": pending,
            }
        return {"ok": False, "error": f"unknown op {op!r}"}

    def _ours(self, message: dict[str, Any]) -> bool:
        """The config a command changed (its "config") is the one this gateway serves."""
        source = self.source
        return source is not None and str(source.resolve()) == message.get("config")


def _network_of(ds: Downstream) -> str | bool:
    """What `cellblock ps` shows of a server's jail: its network, False unjailed, or "remote"."""
    if not isinstance(ds.config, LocalServer):
        return "remote"
    return ds.config.jail.network if ds.config.jail else False
