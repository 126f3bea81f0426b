"""`ask`, answered by a human: through the client's elicitation UI, or from a terminal.

For a call whose policy verdict is `ask`, in order:

1. an approval remembered for the session or for good (`approvals.json`) allows it;
2. a client that can elicit is asked with a form (handshake era: `elicitation/create` while the
   call waits; 2026-07-28: an `InputRequiredResult` whose `request_state` is sealed and bound to the
   server, the tool, a digest of the arguments and an expiry, redeemable once);
3. otherwise the call waits as a pending approval that `cellblock approve ID` / `cellblock deny ID`
   answer through the control socket; on timeout it is refused with the ID and the command.

Nothing the model sends can approve anything: answers come from the client's UI or the CLI, and
a retried call's state is checked against a key that exists only in this process. Remembered
approvals only turn `ask` into `allow`: the policy's `deny` rules and argument constraints are
applied before this module is consulted, so an approval cannot widen them.

A prompt get or a resource read under `ask` goes the same way, and the form says what is got or
read. Every remembered approval (once, session, always, pending) is keyed by kind as well as by
name: a server's tool named "prompt:greet" and its prompt "greet" never share a grant, whichever
of them was approved. "Always" is kept in approvals.json (`serve/remembered.py`), changed under
a lock off the event loop; `cellblock revoke` changes it, and tells each running gateway to
`forget` its session and retry grants of the same.

A path to share with a server (`serve/shares.py`) is asked the same ways, as kind "share" (its
`tool` is "read_write:PATH"): a form of its own, answered in words of its own (`share_once`,
`share_always`), so that no answer to a call's question grants a share nor the other way round;
never for the session; and its "always" is kept by the keeper the stage registers (`keepers`:
the config's jail), not in approvals.json.
"""

from __future__ import annotations

import base64
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import mcp.types as types
from mcp.server.session import ServerSession
from mcp.shared.exceptions import MCPError

from cellblock.gateway.ask.elicitation import elicits, elicits_url, samples
from cellblock.gateway.ask.forms import (
    MAX_VALUE,
    SHARE_CHOICES,
    SHOW_FULL,
    approval_form,
    args_digest,
    argument_lines,
    choice_schema,
    identity,
    review_form,
    share_answers,
    share_asks,
    share_form,
)
from cellblock.gateway.audit.log import Audit
from cellblock.gateway.serve.notify import notify
from cellblock.gateway.serve.remembered import ITEM_KINDS, Remembered
from cellblock.gateway.serve.running import approval_link
from cellblock.gateway.serve.sealed import APPROVAL_KEY, SealedAnswers
from cellblock.gateway.state import StateWriteError
from cellblock.policy.text import visible
from cellblock.policy.types import Decision, Verdict

if TYPE_CHECKING:
    from cellblock.gateway.serve.pipeline import Asking

__all__ = [
    "APPROVAL_KEY",
    "Approvals",
    "NeedsInput",
    "OnceOnly",
    "approval_form",
    "can_elicit",
    "choice_schema",
    "describe",
    "review_form",
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


class NeedsInput(Exception):
    """The call must be answered with this InputRequiredResult (2026-07-28 elicitation)."""

    def __init__(self, result: types.InputRequiredResult) -> None:
        super().__init__("input required")
        self.result = result


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


class Approvals:
    """Remembered approvals, pending ones, and the ways of asking."""

    def __init__(self, state: Path, audit: Audit, timeout: float) -> None:
        self.remembered = Remembered(state / "approvals.json")
        self.audit = audit
        self.timeout = timeout
        self.session: set[tuple[str, str, str]] = set()  # (server, kind, tool)
        self.pending: dict[str, Pending] = {}
        self._once: dict[tuple[str, str, str, str], float] = {}  # (server, kind, tool, digest): after a timeout
        self.sealed = SealedAnswers(timeout)  # the forms' request_state in the 2026-07-28 era
        # connections that stopped waiting, gone from `pending`: id -> (server, host:port, expiry),
        # so that a late `cellblock approve` says what happened and what works
        self._gave_up: dict[str, tuple[str, str, float]] = {}
        # how "always" is kept for a kind that approvals.json does not hold: "egress" (`network:
        # ask`) writes the host into the server's allow_hosts, "share" a path into its jail's grants
        # (the gateway sets them)
        self.keepers: dict[str, Callable[[str, str], Awaitable[None]]] = {}

    # -- remembered ------------------------------------------------------------------------

    def always(self) -> dict[str, set[tuple[str, str]]]:
        """server -> {(kind, tool)} always allowed, as approvals.json holds them now."""
        return self.remembered.table()

    async def remember(self, server: str, tool: str, kind: str = "tool") -> None:
        """Allow `tool` (of `kind`) of `server` always, from now on and after restarts; the file
        is changed under its lock in a worker thread, so the event loop never waits on the lock.

        Raises:
            StateWriteError: the approvals file (or for a host or a path, the config) could not be saved.
        """
        keeper = self.keepers.get(kind)
        if keeper is not None:
            await keeper(server, tool)
            return
        await anyio.to_thread.run_sync(self.remembered.add, server, kind, tool)

    def revoke(self, server: str, tool: str | None, kind: str = "tool") -> list[tuple[str, str]]:
        """Forget the always-approvals of `server` (one tool, prompt or resource, or all) in
        approvals.json; what was removed, each (kind, tool). It blocks on the file's lock (the CLI).

        Raises:
            StateWriteError: the approvals file could not be locked or saved (nothing is forgotten).
        """
        gone = self.remembered.remove(server, None if tool is None else _key(tool, kind))
        for k, name in gone:
            self.audit.write("approval_revoked", server, tool=name, scope="always", **_kind(k))
        return gone

    def forget(self, server: str, tool: str | None, kind: str = "tool") -> list[tuple[str, str, str]]:
        """`cellblock revoke` in a running gateway: drop the session grants of `server` (one tool,
        prompt or resource, or all) and the retries a late CLI approval let through, and read
        approvals.json again at once; what was dropped, each (kind, tool, scope)."""
        key = None if tool is None else _key(tool, kind)
        self.remembered.stale()

        def matches(s: str, k: str, t: str) -> bool:
            return s == server and (key is None or (k, t) == key)

        gone = [(k, t, "session") for s, k, t in sorted(self.session) if matches(s, k, t)]
        gone += [(k, t, "once") for s, k, t, _ in sorted(self._once) if matches(s, k, t)]
        self.session = {(s, k, t) for s, k, t in self.session if not matches(s, k, t)}
        self._once = {entry: exp for entry, exp in self._once.items() if not matches(*entry[:3])}
        for k, name, scope in gone:
            self.audit.write("approval_revoked", server, tool=name, scope=scope, **_kind(k))
        return gone

    # -- asking ----------------------------------------------------------------------------

    async def decide(self, server: str, tool: str, exposed: str, verdict: Verdict, call: Any) -> Verdict:
        """Turn an `ask` verdict into allow or deny, asking a human if nothing remembered answers.

        Raises:
            NeedsInput: a 2026-07-28 client must be asked through an InputRequiredResult.
        """
        arguments = call.arguments
        kind = getattr(call, "kind", "tool")
        # keyed by kind too: a tool named "prompt:greet" and the prompt greet share no grant
        if (kind, tool) in self.always().get(server, set()):
            return Verdict(Decision.ALLOW, "approval:always", f"always allowed by the user ({verdict.rule})")
        if (server, kind, tool) in self.session:
            return Verdict(Decision.ALLOW, "approval:session", f"allowed for this session ({verdict.rule})")
        if self._once.pop((server, kind, tool, args_digest(arguments)), 0.0) > time.time():
            return Verdict(
                Decision.ALLOW, "approval:once", f"approved by the user after the call gave up ({verdict.rule})"
            )
        # a retry's answer counts only for the question its form asked: any other is asked anew
        asked = f"{kind}:{tool}"
        human = getattr(call, "human", None) if getattr(call, "answered", None) == asked else None
        full = human is not None and _choice(human) == SHOW_FULL  # asked to read every argument first
        if human is not None and not full:  # the answer a 2026-07-28 client sent back with the retried call
            return await self._granted(server, tool, verdict, human, "elicitation", kind)
        ctx = call.ctx
        if ctx is not None and can_elicit(ctx.session):
            if ctx.modern:
                message, schema = self._form(server, tool, verdict.rule, arguments, full, kind)
                request = types.ElicitRequest(
                    params=types.ElicitRequestFormParams(message=message, requested_schema=schema)
                )
                self.audit.write("approval_asked", server, tool=tool, via="elicitation", **_kind(kind))
                raise NeedsInput(
                    types.InputRequiredResult(
                        input_requests={APPROVAL_KEY: request},
                        request_state=self.sealed.seal(exposed, arguments, asked),
                    )
                )
            return await self._elicit(ctx.session, ctx.request_id, server, tool, verdict, arguments, kind)
        return await self._wait_for_cli(server, tool, exposed, verdict, arguments, ctx, kind)

    def _form(
        self, server: str, tool: str, rule: str, arguments: dict[str, Any] | None, full: bool, kind: str = "tool"
    ) -> tuple[str, dict[str, Any]]:
        if kind == "share":  # `tool` is what to share, `rule` the call's tool; its own approval is asked apart
            return share_form(server, tool, rule)
        return approval_form(server, tool, rule, arguments, secrets=self.audit.secrets(), full=full, kind=kind)

    async def _elicit(
        self,
        session: ServerSession,
        request_id: Any,
        server: str,
        tool: str,
        verdict: Verdict,
        arguments: Any,
        kind: str = "tool",
    ) -> Verdict:
        for full in (False, True):  # a cut form offers only "show all" or deny; then every argument, uncut
            message, schema = self._form(server, tool, verdict.rule, arguments, full, kind)
            self.audit.write("approval_asked", server, tool=tool, via="elicitation", **_kind(kind))
            try:
                # the human has approvals.timeout to answer; silence is a refusal
                with anyio.fail_after(self.timeout):
                    result = await session.elicit_form(message, schema, related_request_id=request_id)
            except TimeoutError:
                return self._refused(
                    server, tool, verdict, "approval_timeout", f"no answer within {self.timeout:g}s", kind
                )
            except Exception as exc:  # the client failed the request: no answer is a refusal
                return self._refused(
                    server, tool, verdict, "approval_denied", f"the client could not ask ({exc})", kind
                )
            if full or _choice(result) != SHOW_FULL:
                break
        return await self._granted(server, tool, verdict, result, "elicitation", kind)

    async def _granted(
        self, server: str, tool: str, verdict: Verdict, result: types.ElicitResult, via: str, kind: str = "tool"
    ) -> Verdict:
        choice = _choice(result)
        # a share's answer is in words of its own: an answer to a call's question never grants one, nor back
        granting = SHARE_CHOICES[:2] if kind == "share" else ("allow_once", "allow_session", "allow_always")
        if choice not in granting:
            if choice == "deny":
                why = "the user denied it"
            elif result.action == "accept":  # a form of another question (a call's, for a share) was answered
                why = f"the answer {visible(str(choice))!r} is none of this question's ({', '.join(granting)})"
            else:
                why = f"the user answered '{result.action}'"
            return self._refused(server, tool, verdict, "approval_denied", why, kind)
        scope = str(choice).partition("_")[2]
        if scope == "session":
            self.session.add((server, kind, tool))
        elif scope == "always":
            try:
                await self.remember(server, tool, kind)
            except StateWriteError as exc:  # an "always" that would be forgotten is not what was granted
                return self._refused(
                    server, tool, verdict, "approval_denied", f"'always' could not be saved: {exc}", kind
                )
        self.audit.write("approval_granted", server, tool=tool, scope=scope, via=via, **_kind(kind))
        return Verdict(Decision.ALLOW, f"approval:{scope}", f"approved by the user ({verdict.rule})")

    def _refused(self, server: str, tool: str, verdict: Verdict, event: str, why: str, kind: str = "tool") -> Verdict:
        self.audit.write(event, server, tool=tool, reason=why, **_kind(kind))
        return Verdict(
            Decision.DENY,
            verdict.rule,
            f"{_what(tool, kind)} of server '{server}' needs the user's approval and did not get it: {why}",
        )

    async def _wait_for_cli(
        self,
        server: str,
        tool: str,
        exposed: str,
        verdict: Verdict,
        arguments: dict[str, Any] | None,
        ctx: Asking | None = None,
        kind: str = "tool",
    ) -> Verdict:
        self._expire()
        if len(self.pending) >= MAX_PENDING:
            return self._refused(server, tool, verdict, "approval_denied", "too many approvals are pending", kind)
        # a server's connections asked while another of its waits are one burst: one notification
        burst = kind == "egress" and any(p.kind == "egress" and p.server == server for p in self.pending.values())
        now = time.time()
        ident = base64.b32encode(os.urandom(5)).decode().lower()
        item = Pending(ident, server, tool, arguments, args_digest(arguments), now, now + PENDING_TTL, kind=kind)
        # a share names its path and what approving it does: never taken for the call's own approval
        item.asks = share_asks(server, tool, exposed) if kind == "share" else None
        self.pending[ident] = item
        self.audit.write("approval_asked", server, tool=tool, via="cli", id=ident, **_kind(kind))
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
            f"Cellblock: {_what(exposed)} waits up to {self.timeout:g}s for the user's approval. "
            f"Ask the user to run 'cellblock pending' to see it, then 'cellblock approve {ident}' "
            f"or 'cellblock deny {ident}' in a terminal.{on_page}"
        )
        shown = f"{_what(exposed)} waits for your approval: cellblock approve {ident}"
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
                return self._refused(server, tool, verdict, "approval_denied", why, kind)
            return Verdict(
                Decision.ALLOW, f"approval:{item.scope}", f"approved from {ANSWERED_FROM[item.via]} ({verdict.rule})"
            )
        item.waiting = False
        self.audit.write("approval_timeout", server, tool=tool, id=ident, **_kind(kind))
        if item.asks is not None:
            why = f"{item.asks}, and no answer came; {share_answers(ident)}, then ask again with the same arguments"
            return Verdict(Decision.DENY, verdict.rule, why)
        return Verdict(
            Decision.DENY,
            verdict.rule,
            f"{_what(exposed)} needs the user's approval. Ask the user to run 'cellblock approve {ident}' "
            f"(or 'cellblock approve {ident} --always') in a terminal, then ask again with the same "
            "arguments; or 'cellblock deny " + ident + "'.",
        )

    async def answer(self, ident: str, scope: str | None, via: str = "cli") -> bool:
        """The answer to pending approval `ident` (scope None: deny) given `via` the CLI or the
        dashboard (`ANSWERED_FROM`). False if there is none.

        Raises:
            StateWriteError: "always" could not be saved; the approval stays pending, unanswered.
            OnceOnly: "session" or "always" for a request for the client's model; it stays pending.
        """
        self._expire()
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
        item = self.pending.pop(ident, None)  # taken while "always" is saved: a second answer finds none
        if item is None:
            return False
        if scope == "always":
            try:
                await self.remember(item.server, item.tool, item.kind)
            except BaseException:
                self.pending.setdefault(ident, item)
                raise
        elif scope == "session":
            self.session.add((item.server, item.kind, item.tool))
        if scope is not None and not item.waiting:
            # the call already timed out: let the same call (same kind too) through once when the model retries
            self._once[(item.server, item.kind, item.tool, item.digest)] = item.expires
        item.scope, item.via = scope, via
        item.answer.set()
        event = "approval_granted" if scope is not None else "approval_denied"
        self.audit.write(event, item.server, tool=item.tool, scope=scope, via=via, id=ident, **_kind(item.kind))
        return True

    def _expire(self) -> None:
        now = time.time()
        for ident in [i for i, p in self.pending.items() if p.expires < now]:
            self.pending.pop(ident)
        for key in [k for k, exp in self._once.items() if exp < now]:
            self._once.pop(key)
        self._gave_up = {i: gone for i, gone in self._gave_up.items() if gone[2] >= now}

    async def sampling(self, server: str, params: types.CreateMessageRequestParams, entry: Any) -> str | None:
        """Ask whether `server` may use the client's model for this request; None if allowed, else why not."""
        verdict = Verdict(Decision.ASK, "sampling", "")
        summary = {
            "messages": len(params.messages),
            "max_tokens": params.max_tokens,
            "system_prompt": params.system_prompt,
            "last_message": params.messages[-1].model_dump(mode="json") if params.messages else None,
        }
        if entry.can_elicit and entry.asker is not None:
            # every part of the request, uncut: the human decides once on all of it
            message, _ = approval_form(
                server, "sampling (use your model)", "sampling: ask", summary, secrets=self.audit.secrets(), full=True
            )
            schema = choice_schema(("allow_once", "deny"), ("Allow once", "Deny"))
            # `kind: sampling`: the server's own request, held to its audit budget; and no answer
            # to it is remembered for a tool that happens to be named "sampling"
            self.audit.write("approval_asked", server, tool="sampling", via="elicitation", kind="sampling")
            with anyio.move_on_after(self.timeout):
                answer = await entry.asker.ask(types.ElicitRequestFormParams(message=message, requested_schema=schema))
                decided = await self._granted(server, "sampling", verdict, answer, "elicitation", "sampling")
                return None if decided.decision is Decision.ALLOW else decided.reason
            timed_out = self._refused(server, "sampling", verdict, "approval_timeout", "no answer in time", "sampling")
            return timed_out.reason
        decided = await self._wait_for_cli(server, "sampling", f"{server} sampling", verdict, summary, kind="sampling")
        return None if decided.decision is Decision.ALLOW else decided.reason

    async def egress(self, server: str, target: str, entry: Any) -> tuple[str | None, str]:
        """Ask whether `server` may connect to `target` ("host:port", `network: ask`): the scope
        granted ("once", or "always": kept by `keepers["egress"]`) or None, and how it was decided.
        Through the form of the call in flight when its client can show one, else pending."""
        verdict, summary = Verdict(Decision.ASK, "network: ask", ""), {"connect to": target}
        if self._once.pop((server, "egress", target, args_digest(summary)), 0.0) > time.time():
            return "once", "once, answered after an earlier attempt"
        if entry is not None and entry.can_elicit and entry.asker is not None:
            message, _ = approval_form(server, target, "network: ask", summary, full=True, kind="egress")
            labels = ("Allow until the server stops", "Always allow (added to allow_hosts)", "Deny")
            schema = choice_schema(("allow_once", "allow_always", "deny"), labels)
            self.audit.write("approval_asked", server, tool=target, via="elicitation", kind="egress")
            decided: Verdict | None = None
            with anyio.move_on_after(self.timeout):
                try:
                    answer = await entry.asker.ask(
                        types.ElicitRequestFormParams(message=message, requested_schema=schema)
                    )
                except (MCPError, ValueError, anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
                    answer = types.ElicitResult(action="cancel")
                    logger.info("server '%s': the client could not ask about %s: %s", server, target, exc)
                decided = await self._granted(server, target, verdict, answer, "elicitation", "egress")
            if decided is None:
                why = f"no answer within {self.timeout:g}s"
                decided = self._refused(server, target, verdict, "approval_timeout", why, "egress")
        elif sum(p.kind == "egress" for p in self.pending.values()) >= MAX_PENDING_EGRESS:
            why = f"{MAX_PENDING_EGRESS} connections of servers wait for approval already"
            decided = self._refused(server, target, verdict, "approval_denied", why, "egress")
        else:
            exposed = f"egress:{target} (server '{server}')"  # how the notification names it
            try:
                decided = await self._wait_for_cli(server, target, exposed, verdict, summary, kind="egress")
            finally:  # a connection that stopped waiting can use no later answer: its question leaves
                for ident, p in list(self.pending.items()):
                    if (p.server, p.tool, p.kind) == (server, target, "egress"):
                        del self.pending[ident]
                        if len(self._gave_up) >= MAX_PENDING:  # bounded: the oldest is forgotten
                            del self._gave_up[next(iter(self._gave_up))]
                        self._gave_up[ident] = (server, target, p.expires)
        if decided.decision is not Decision.ALLOW:
            _, said, why = decided.reason.rpartition("did not get it: ")  # else the pending one timed out
            return None, why if said else f"no answer within {self.timeout:g}s"
        scope = "always" if decided.rule == "approval:always" else "once"
        return scope, scope

    # -- what the control socket shows -----------------------------------------------------

    def listing(self, full: str | None = None) -> list[dict[str, Any]]:
        """The pending approvals, each argument a `"key": value` line of escaped JSON, cut (`cut`
        says how many); with `full`, only that approval, nothing cut. Only values Cellblock knows
        are secrets are hidden."""
        self._expire()
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


def describe(kind: str, tool: str, server: str = "") -> str:
    """How the CLI names a remembered approval: `p:echo` for a tool, `prompt p:greet`, `resource p:h://index`
    (without `server`: `echo`, `prompt greet`)."""
    where = f"{server}:" if server else ""
    return f"{where}{tool}" if kind == "tool" else f"{kind} {where}{tool.removeprefix(kind + ':')}"


def _what(tool: str, kind: str | None = None) -> str:
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


def _key(tool: str, kind: str) -> tuple[str, str]:
    """How a grant of `tool` (a prompt's or resource's plain name) of `kind` is kept: (kind, "prompt:greet")."""
    return kind, tool if kind == "tool" else f"{kind}:{tool}"


def _kind(kind: str) -> dict[str, str]:
    """The `kind` field of an approval's audit event: none for a tool, so tool records stay as they were."""
    return {} if kind == "tool" else {"kind": kind}


def _choice(result: types.ElicitResult) -> Any:
    return (result.content or {}).get("decision") if result.action == "accept" else None


def can_elicit(session: ServerSession) -> bool:
    return elicits(session.client_capabilities)


def can_sample(session: ServerSession) -> bool:
    return samples(session.client_capabilities)


def can_elicit_url(session: ServerSession) -> bool:
    """The client can open a URL for the user (URL-mode elicitation, 2025-11-25 and later)."""
    return elicits_url(session.client_capabilities)
