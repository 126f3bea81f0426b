"""`ask`, answered by a human: through the client's elicitation UI, or from a terminal.

For a call whose policy verdict is `ask`, in order:

1. an approval remembered for the session or for good (`approvals.json`) allows it;
2. a client that can elicit is asked with a form (handshake era: `elicitation/create` while the
   call waits; 2026-07-28: an `InputRequiredResult` whose `request_state` is sealed and bound to the
   server, the tool, a digest of the arguments and an expiry, redeemable once);
3. otherwise the call waits as a pending approval that `cellblock approve ID` / `cellblock deny ID`
   answer through the control socket; on timeout it is refused with the ID and the command
   (`serve/pending.py`).

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

import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import mcp.types as types
from mcp.server.session import ServerSession
from mcp.shared.exceptions import MCPError

from cellblock.gateway.ask.elicitation import elicits, elicits_url, samples
from cellblock.gateway.ask.forms import (
    SHARE_CHOICES,
    SHOW_FULL,
    approval_form,
    choice_schema,
    review_form,
    share_form,
)
from cellblock.gateway.audit.log import Audit
from cellblock.gateway.serve.pending import MAX_PENDING_EGRESS, Queue, kind_field, refused
from cellblock.gateway.serve.remembered import Remembered
from cellblock.gateway.serve.sealed import APPROVAL_KEY, SealedAnswers
from cellblock.gateway.state import StateWriteError
from cellblock.policy.text import visible
from cellblock.policy.types import Decision, Verdict

if TYPE_CHECKING:
    from cellblock.gateway.serve.pipeline import Call

__all__ = [
    "APPROVAL_KEY",
    "Approvals",
    "NeedsInput",
    "approval_form",
    "can_elicit",
    "choice_schema",
    "describe",
    "review_form",
]

logger = logging.getLogger(__name__)


class NeedsInput(Exception):
    """The call must be answered with this InputRequiredResult (2026-07-28 elicitation)."""

    def __init__(self, result: types.InputRequiredResult) -> None:
        super().__init__("input required")
        self.result = result


class Approvals:
    """Remembered approvals, pending ones, and the ways of asking."""

    def __init__(self, state: Path, audit: Audit, timeout: float) -> None:
        self.remembered = Remembered(state / "approvals.json")
        self.audit = audit
        self.timeout = timeout
        self.session: set[tuple[str, str, str]] = set()  # (server, kind, tool)
        self.queue = Queue(audit, timeout)  # what waits for the CLI or the dashboard
        self.pending = self.queue.pending
        self.sealed = SealedAnswers(timeout)  # the forms' request_state in the 2026-07-28 era
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
            self.audit.note("approval_revoked", server, tool=name, scope="always", **kind_field(k))
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
        once = self.queue.once
        gone += [(k, t, "once") for s, k, t, _ in sorted(once) if matches(s, k, t)]
        self.session = {(s, k, t) for s, k, t in self.session if not matches(s, k, t)}
        for entry in [entry for entry in once if matches(*entry[:3])]:
            del once[entry]
        for k, name, scope in gone:
            self.audit.note("approval_revoked", server, tool=name, scope=scope, **kind_field(k))
        return gone

    # -- asking ----------------------------------------------------------------------------

    async def approve(self, call: Call) -> Verdict:
        """The pipeline's approval stage: the call's verdict (ask, where it has none) decided."""
        verdict = call.verdict or Verdict(Decision.ASK, "default", "")
        return await self.decide(call.server, call.tool, call.name, verdict, call)

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
        if self.queue.let_once(server, kind, tool, arguments):
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
                self.audit.note("approval_asked", server, tool=tool, via="elicitation", **kind_field(kind))
                raise NeedsInput(
                    types.InputRequiredResult(
                        input_requests={APPROVAL_KEY: request},
                        request_state=self.sealed.seal(exposed, arguments, asked),
                    )
                )
            return await self._elicit(ctx.session, ctx.request_id, server, tool, verdict, arguments, kind)
        return await self.queue.wait(server, tool, exposed, verdict, arguments, ctx, kind)

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
            self.audit.note("approval_asked", server, tool=tool, via="elicitation", **kind_field(kind))
            try:
                # the human has approvals.timeout to answer; silence is a refusal
                with anyio.fail_after(self.timeout):
                    result = await session.elicit_form(message, schema, related_request_id=request_id)
            except TimeoutError:
                return self._refused(
                    server, tool, verdict, "approval_timeout", f"no answer within {self.timeout:g}s", kind
                )
            except Exception as exc:  # noqa: BLE001 - whatever failed the client's answer, no answer is a refusal
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
        self.audit.note("approval_granted", server, tool=tool, scope=scope, via=via, **kind_field(kind))
        return Verdict(Decision.ALLOW, f"approval:{scope}", f"approved by the user ({verdict.rule})")

    def _refused(self, server: str, tool: str, verdict: Verdict, event: str, why: str, kind: str = "tool") -> Verdict:
        return refused(self.audit, server, tool, verdict, event, why, kind)

    async def answer(self, ident: str, scope: str | None, via: str = "cli") -> bool:
        """The answer to pending approval `ident` (scope None: deny) given `via` the CLI or the
        dashboard (`ANSWERED_FROM`). False if there is none.

        Raises:
            StateWriteError: "always" could not be saved; the approval stays pending, unanswered.
            OnceOnly: "session" or "always" for a request for the client's model; it stays pending.
        """
        item = self.queue.take(ident, scope)
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
        self.queue.answered(item, scope, via)
        return True

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
            self.audit.note("approval_asked", server, tool="sampling", via="elicitation", kind="sampling")
            with anyio.move_on_after(self.timeout):
                answer = await entry.asker.ask(types.ElicitRequestFormParams(message=message, requested_schema=schema))
                decided = await self._granted(server, "sampling", verdict, answer, "elicitation", "sampling")
                return None if decided.decision is Decision.ALLOW else decided.reason
            timed_out = self._refused(server, "sampling", verdict, "approval_timeout", "no answer in time", "sampling")
            return timed_out.reason
        decided = await self.queue.wait(server, "sampling", f"{server} sampling", verdict, summary, kind="sampling")
        return None if decided.decision is Decision.ALLOW else decided.reason

    async def egress(self, server: str, target: str, entry: Any) -> tuple[str | None, str]:
        """Ask whether `server` may connect to `target` ("host:port", `network: ask`): the scope
        granted ("once", or "always": kept by `keepers["egress"]`) or None, and how it was decided.
        Through the form of the call in flight when its client can show one, else pending."""
        verdict, summary = Verdict(Decision.ASK, "network: ask", ""), {"connect to": target}
        if self.queue.let_once(server, "egress", target, summary):
            return "once", "once, answered after an earlier attempt"
        if entry is not None and entry.can_elicit and entry.asker is not None:
            message, _ = approval_form(server, target, "network: ask", summary, full=True, kind="egress")
            labels = ("Allow until the server stops", "Always allow (added to allow_hosts)", "Deny")
            schema = choice_schema(("allow_once", "allow_always", "deny"), labels)
            self.audit.note("approval_asked", server, tool=target, via="elicitation", kind="egress")
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
                decided = await self.queue.wait(server, target, exposed, verdict, summary, kind="egress")
            finally:  # a connection that stopped waiting can use no later answer: its question leaves
                self.queue.gave_up(server, target)
        if decided.decision is not Decision.ALLOW:
            _, said, why = decided.reason.rpartition("did not get it: ")  # else the pending one timed out
            return None, why if said else f"no answer within {self.timeout:g}s"
        scope = "always" if decided.rule == "approval:always" else "once"
        return scope, scope

    # -- what the control socket shows -----------------------------------------------------

    def listing(self, full: str | None = None) -> list[dict[str, Any]]:
        """The pending approvals, as the control socket shows them (`Queue.listing`)."""
        return self.queue.listing(full)


def describe(kind: str, tool: str, server: str = "") -> str:
    """How the CLI names a remembered approval: `p:echo` for a tool, `prompt p:greet`, `resource p:h://index`
    (without `server`: `echo`, `prompt greet`)."""
    where = f"{server}:" if server else ""
    return f"{where}{tool}" if kind == "tool" else f"{kind} {where}{tool.removeprefix(kind + ':')}"


def _key(tool: str, kind: str) -> tuple[str, str]:
    """How a grant of `tool` (a prompt's or resource's plain name) of `kind` is kept: (kind, "prompt:greet")."""
    return kind, tool if kind == "tool" else f"{kind}:{tool}"


def _choice(result: types.ElicitResult) -> Any:
    return (result.content or {}).get("decision") if result.action == "accept" else None


def can_elicit(session: ServerSession) -> bool:
    return elicits(session.client_capabilities)


def can_sample(session: ServerSession) -> bool:
    return samples(session.client_capabilities)


def can_elicit_url(session: ServerSession) -> bool:
    """The client can open a URL for the user (URL-mode elicitation, 2025-11-25 and later)."""
    return elicits_url(session.client_capabilities)
