"""Approvals that wait for an answer from the CLI or the dashboard (`cellblock approve|deny ID`).

A call, a prompt get, a read, a server's connection or request for the client's model that must
be asked when no form can be shown waits here as a `Pending` approval, under an ID nobody can
guess, for `approvals.timeout`: the client is told why it waits, the desktop shows it (with the
running dashboard's link), and the answer comes through the control socket. An answer after the
call gave up lets the same call, with the same arguments, through once (`once`). The table is
bounded: the model's calls create its entries.
"""

from __future__ import annotations

import base64
import logging
import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio

from cellblock.gateway.ask.forms import MAX_VALUE, args_digest, argument_lines, identity, share_answers, share_asks
from cellblock.gateway.audit.log import Audit
from cellblock.gateway.serve.notify import notify
from cellblock.gateway.serve.remembered import ITEM_KINDS
from cellblock.gateway.serve.running import approval_link
from cellblock.policy.text import visible
from cellblock.policy.types import Decision, Verdict

if TYPE_CHECKING:
    from cellblock.gateway.serve.pipeline import Asking

__all__ = [
    "ANSWERED_FROM",
    "MAX_PENDING",
    "MAX_PENDING_EGRESS",
    "PENDING_TTL",
    "OnceOnly",
    "Pending",
    "Queue",
    "kind_field",
    "refused",
    "what",
]

logger = logging.getLogger(__name__)
# who can answer a pending approval besides a form, as its reason says it
ANSWERED_FROM = {"cli": "the CLI", "dashboard": "the dashboard"}

# A pending approval answered after its call timed out still lets the same call through once,
# for this long (the model is told to retry after the user approves).
PENDING_TTL = 600.0
MAX_PENDING = 64  # pending approvals are created by the model's calls: keep them bounded
# servers' connections (`network: ask`) may hold only this share of them: the rest stay the calls'
MAX_PENDING_EGRESS = MAX_PENDING // 4


class OnceOnly(ValueError):
    """An answer that would be remembered, to a question that is asked every time: a server's
    request for the client's model (`sampling: ask`) is allowed once or denied, never for good."""


@dataclass
class Pending:
    id: str
    server: str
    tool: str
    arguments: dict[str, Any] | None
    digest: str
    created: float
    expires: float
    answer: anyio.Event = field(default_factory=anyio.Event)
    scope: str | None = None  # "once", "session", "always"; None = denied or unanswered
    waiting: bool = True  # False once the call gave up waiting (timed out)
    kind: str = "tool"  # or "prompt", "resource": `tool` is then "prompt:NAME" or "resource:URI"
    asks: str | None = None  # a share's question in words of its own (`forms.share_asks`)
    via: str = "cli"  # who answered it: "cli" (`cellblock approve|deny`) or "dashboard"


class Queue:
    """The pending approvals, the calls an answer after their timeout lets through once, and the
    connections that gave up waiting (so that a late answer says what happened)."""

    def __init__(self, audit: Audit, timeout: float) -> None:
        self.audit = audit
        self.timeout = timeout
        self.pending: dict[str, Pending] = {}
        self.once: dict[tuple[str, str, str, str], float] = {}  # (server, kind, tool, digest): after a timeout
        # connections that stopped waiting, gone from `pending`: id -> (server, host:port, expiry)
        self._gave_up: dict[str, tuple[str, str, float]] = {}

    def let_once(self, server: str, kind: str, tool: str, arguments: Any) -> bool:
        """Whether an answer after its timeout lets this very call through (once: it is used up)."""
        return self.once.pop((server, kind, tool, args_digest(arguments)), 0.0) > time.time()

    async def wait(
        self,
        server: str,
        tool: str,
        exposed: str,
        verdict: Verdict,
        arguments: dict[str, Any] | None,
        ctx: Asking | None = None,
        kind: str = "tool",
    ) -> Verdict:
        """Wait (up to the timeout) for the answer to a new pending approval."""
        self.expire()
        if len(self.pending) >= MAX_PENDING:
            return refused(self.audit, server, tool, verdict, "approval_denied", "too many approvals are pending", kind)
        # a server's connections asked while another of its waits are one burst: one notification
        burst = kind == "egress" and any(p.kind == "egress" and p.server == server for p in self.pending.values())
        now = time.time()
        ident = base64.b32encode(os.urandom(5)).decode().lower()
        item = Pending(ident, server, tool, arguments, args_digest(arguments), now, now + PENDING_TTL, kind=kind)
        # a share names its path and what approving it does: never taken for the call's own approval
        item.asks = share_asks(server, tool, exposed) if kind == "share" else None
        self.pending[ident] = item
        self.audit.note("approval_asked", server, tool=tool, via="cli", id=ident, **kind_field(kind))
        logger.warning(
            "approval %s: server '%s' wants to %s '%s'; run 'cellblock approve %s' or 'cellblock deny %s'",
            ident,
            server,
            {"egress": "connect to", "share": "share"}.get(kind, "run"),
            tool,
            ident,
            ident,
        )
        link = approval_link(ident)  # the running dashboard's page for it, if one runs
        on_page = f" Or answer it on the dashboard: {link}" if link else ""
        waiting = (
            f"Cellblock: {what(exposed)} waits up to {self.timeout:g}s for the user's approval. "
            f"Ask the user to run 'cellblock pending' to see it, then 'cellblock approve {ident}' "
            f"or 'cellblock deny {ident}' in a terminal.{on_page}"
        )
        shown = f"{what(exposed)} waits for your approval: cellblock approve {ident}"
        if item.asks is not None:
            waiting = (
                f"Cellblock: {item.asks}; it waits up to {self.timeout:g}s for the user. Ask the user to run "
                f"'cellblock pending' to see it; in a terminal, {share_answers(ident)}.{on_page}"
            )
            shown = f"{item.asks}: {share_answers(ident)}"
        if link:
            shown += f", or on the dashboard: {link}"
        async with anyio.create_task_group() as tg:
            # never a silent wait: the client hears why (and so can the model), the desktop shows it
            if ctx is not None and ctx.tell is not None:
                tg.start_soon(ctx.tell, waiting)
            if not burst:
                tg.start_soon(notify, shown)
            with anyio.move_on_after(self.timeout):
                await item.answer.wait()
            tg.cancel_scope.cancel()
        if item.answer.is_set():
            if item.scope is None:
                why = f"denied from {ANSWERED_FROM[item.via]} ({ident})"
                return refused(self.audit, server, tool, verdict, "approval_denied", why, kind)
            return Verdict(
                Decision.ALLOW, f"approval:{item.scope}", f"approved from {ANSWERED_FROM[item.via]} ({verdict.rule})"
            )
        item.waiting = False
        self.audit.note("approval_timeout", server, tool=tool, id=ident, **kind_field(kind))
        if item.asks is not None:
            why = f"{item.asks}, and no answer came; {share_answers(ident)}, then ask again with the same arguments"
            return Verdict(Decision.DENY, verdict.rule, why)
        return Verdict(
            Decision.DENY,
            verdict.rule,
            f"{what(exposed)} needs the user's approval. Ask the user to run 'cellblock approve {ident}' "
            f"(or 'cellblock approve {ident} --always') in a terminal, then ask again with the same "
            "arguments; or 'cellblock deny " + ident + "'.",
        )

    def take(self, ident: str, scope: str | None) -> Pending | None:
        """The pending approval `ident`, out of the table, to be answered with `scope`; None if
        there is none.

        Raises:
            OnceOnly: `scope` is not one this approval can be given (it stays pending).
        """
        self.expire()
        asked = self.pending.get(ident)
        if asked is None and ident in self._gave_up:
            who, target, _ = self._gave_up[ident]
            raise OnceOnly(
                f"'{ident}' was a connection of server '{who}' to {target} that gave up waiting and was refused; "
                f"the server is refused {target} until you allow it: 'cellblock allow-host {who} {target}' "
                "(its next try then connects)"
            )
        if asked is not None and asked.kind == "sampling" and scope in ("session", "always"):
            raise OnceOnly(
                f"'{ident}' is a request of server '{asked.server}' to use your model, which is asked each time "
                f"(sampling: ask): it can be allowed once, not --{scope}; run 'cellblock approve {ident}'"
            )
        if asked is not None and asked.kind == "egress" and scope == "session":
            raise OnceOnly(
                f"'{ident}' is a connection of server '{asked.server}' to {asked.tool}: allow it with "
                f"'cellblock approve {ident}' (until the server stops) or '--always' (added to its allow_hosts)"
            )
        if asked is not None and asked.kind == "share" and scope == "session":
            raise OnceOnly(
                f"'{ident}' asks to share a path with server '{asked.server}': it is shared until the server stops "
                f"('cellblock approve {ident}') or always ('--always', written to the config), not --session"
            )
        return self.pending.pop(ident, None)  # taken while "always" is saved: a second answer finds none

    def answered(self, item: Pending, scope: str | None, via: str) -> None:
        """`item` (taken) was answered with `scope` (None: denied) `via` the CLI or the dashboard."""
        if scope is not None and not item.waiting:
            # the call already timed out: let the same call (same kind too) through once when the model retries
            self.once[(item.server, item.kind, item.tool, item.digest)] = item.expires
        item.scope, item.via = scope, via
        item.answer.set()
        event = "approval_granted" if scope is not None else "approval_denied"
        self.audit.note(event, item.server, tool=item.tool, scope=scope, via=via, id=item.id, **kind_field(item.kind))

    def gave_up(self, server: str, target: str) -> None:
        """A connection of `server` to `target` stopped waiting: its question leaves the table,
        and a late answer to it is told what happened."""
        for ident, p in list(self.pending.items()):
            if (p.server, p.tool, p.kind) == (server, target, "egress"):
                del self.pending[ident]
                if len(self._gave_up) >= MAX_PENDING:  # bounded: the oldest is forgotten
                    del self._gave_up[next(iter(self._gave_up))]
                self._gave_up[ident] = (server, target, p.expires)

    def expire(self) -> None:
        now = time.time()
        for ident in [i for i, p in self.pending.items() if p.expires < now]:
            self.pending.pop(ident)
        for key in [k for k, exp in self.once.items() if exp < now]:
            self.once.pop(key)
        self._gave_up = {i: gone for i, gone in self._gave_up.items() if gone[2] >= now}

    def listing(self, full: str | None = None) -> list[dict[str, Any]]:
        """The pending approvals, each argument a `"key": value` line of escaped JSON, cut (`cut`
        says how many); with `full`, only that approval, nothing cut. Only values Cellblock knows
        are secrets are hidden."""
        self.expire()
        secrets = self.audit.secrets()
        listed = []
        for p in self.pending.values():
            if full is not None and p.id != full:
                continue
            lines, cut = argument_lines(p.arguments, secrets, None if full is not None else MAX_VALUE)
            listed.append(
                {
                    "id": p.id,
                    "server": p.server,
                    "tool": p.tool,
                    "kind": p.kind,
                    "asks": p.asks,
                    "identity": identity(p.server, p.tool, p.arguments, p.kind),
                    "digest": p.digest,
                    "arguments": lines,
                    "cut": cut,
                    "created": p.created,
                    # the waiting call gives up at `waits_until`; an answer until `expires` lets its retry through
                    "waits_until": p.created + self.timeout if p.waiting else None,
                    "expires": p.expires,
                }
            )
        return listed


def refused(
    audit: Audit, server: str, tool: str, verdict: Verdict, event: str, why: str, kind: str = "tool"
) -> Verdict:
    """The refusal of what was asked and not granted, audited as `event`."""
    audit.note(event, server, tool=tool, reason=why, **kind_field(kind))
    return Verdict(
        Decision.DENY,
        verdict.rule,
        f"{what(tool, kind)} of server '{server}' needs the user's approval and did not get it: {why}",
    )


def what(tool: str, kind: str | None = None) -> str:
    """How a message names what was asked about: "tool 'x'", "prompt 'greet'", "resource 'a://b'".
    Without `kind`, `tool` is an exposed name ("prompt:p__greet" is the client's prompt get)."""
    prefix, sep, name = tool.partition(":")
    if kind == "share":  # "read_write:PATH"
        return f"sharing {visible(name)} ({prefix.replace('_', '-')})"
    if kind == "egress" or (kind is None and prefix == "egress"):
        return f"the connection to {visible(name if kind is None else tool)}"
    if kind in ITEM_KINDS or (kind is None and sep and prefix in ITEM_KINDS):
        return f"{prefix} {visible(name)!r}"
    return f"tool {visible(tool)!r}"


def kind_field(kind: str) -> dict[str, str]:
    """The `kind` field of an approval's audit event: none for a tool, so tool records stay as they were."""
    return {} if kind == "tool" else {"kind": kind}
