"""The decisions on a call: route -> start -> secrets -> lock -> policy -> share -> approval -> record.
They are the middle of a tools/call's one list of steps (`serve/callhandler.py: CallHandler.path`),
and then (the call's own, `serve/calls.py`) it is forwarded and the audit of its end written.

The stages are data (`Pipeline.stages`), run in order by every decision. Each can only pass a
call on, refuse it by raising `Refused` (audited, and a tool error the model can read), or
return a wait for someone (the human's review of a held catalog, an `ask`); none can widen what
an earlier one decided. Every allow is written to the audit log before anything is forwarded:
if that write fails, the call is refused (`Unrecorded`).

`decide` runs one stage and waits where it asks to; a call that may not go on is raised as
`NotAdmitted` (a `Refused`, audited, or `Unrecorded`), which the caller answers. `decide_now` is
the fast path's (gateway/serve/fastpath.py): the same stage, taken only when it lets the call on
without waiting for anyone; whatever else it would say, it says nothing and leaves the call to
the SDK's path, which decides again. `admit` runs every stage (`decide`); `admit_item` runs the
stages from secrets on, but the lock and the share, for a prompt get or a resource read that the
gateway has routed and checked against the lock itself: the same rules machinery, the same
approvals, the same `call` audit record (its `tool` is "prompt:NAME" or "resource:URI").

`start` refuses a call to a server that cannot start (its package not installed, its secret not
in the keyring) or failed for good, with the cause and the command that puts it right, before
anyone is asked anything (`downstream/startable.py`); a running server passes at once.

`secrets` refuses a call whose arguments (a read's URI) carry a secret the gateway holds for
another server, or its own (the HTTP token), in any form `scrub.HeldSecrets.carried` knows: a
model can be tricked into copying a token from one tool's output into another tool's call. A
server's own secret is let through: it holds it already, and refusing it would break a server
whose tools take the key they were configured with. Every server's credentials are read from
the keyring once, as the gateway starts (`learn_secrets`); a decision before that has ended
waits for it, at most `KEYRING_SECONDS`, and is refused past that rather than let through.

`share` asks the user to share with the server a path in the home that the call names and its
jail does not, or refuses the call naming it (`serve/shares.py`); after the policy, whose `deny`
and `under:` constraints decide first, and before the call's own approval.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any

import anyio
import mcp.types as types

from cellblock.gateway.audit.log import Audit, AuditUnwritten
from cellblock.gateway.downstream.rounds import error_result
from cellblock.gateway.scrub import Held, Scrubbed
from cellblock.gateway.serve.catalog import Catalog
from cellblock.policy.rules import Policy
from cellblock.policy.types import Decision, Verdict

__all__ = [
    "Approver",
    "Asking",
    "Call",
    "NotAdmitted",
    "Pipeline",
    "Refused",
    "Reviewer",
    "Stage",
    "Startable",
    "Unrecorded",
]


@dataclass
class Call:
    """One tools/call (or prompts/get, resources/read) as it moves through the stages."""

    name: str  # the exposed name the client used ("prompt:NAME" or "resource:URI" for those)
    arguments: dict[str, Any] | None
    server: str = ""
    tool: str = ""  # the server's tool; for a prompt or resource its kind and name: "prompt:greet"
    kind: str = "tool"  # "tool", "prompt" or "resource"
    verdict: Verdict | None = None
    held: bool = False  # the lock holds the item it names (new or changed since approval)
    policy: Policy | None = None  # a prompt's or resource's rules (else its server's tool rules)
    item: str = ""  # what `policy` judges: the prompt's name, the server's URI
    ctx: Asking | None = None  # how to reach the human who may approve it
    human: types.ElicitResult | None = None  # their answer, when a 2026-07-28 retry carries it
    answered: str = ""  # the question that answer is to, as its sealed state says ("tool:save", "share:...")


@dataclass(frozen=True)
class Asking:
    """The upstream request a call came in on: where an approval question can be sent."""

    session: Any
    request_id: Any
    modern: bool
    # tells the client about the call while it waits (a progress message where it asked for
    # progress, else a log message): how a client that cannot ask the user learns what to do
    tell: Callable[[str], Coroutine[Any, Any, None]] | None = None


Approver = Callable[[Call], Awaitable[Verdict]]
# True when the human accepted the held catalog of the call's server (the lock then lets it through)
Reviewer = Callable[[Call], Awaitable[bool]]
# server -> None when it runs, else what says why it cannot start (None: it may)
Startable = Callable[[str], Callable[[], Awaitable[str | None]] | None]


class NotAdmitted(Exception):
    """The pipeline did not let the call on; `text` says why, as the client reads it."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    @property
    def result(self) -> types.CallToolResult:
        """The refusal as a tool call's error result, which the model reads."""
        return error_result(self.text)


class Refused(NotAdmitted):
    """A stage refuses the call, with this verdict (and `fields` for its record). Out of the
    pipeline it is audited, and `text` is the refusal as the client reads it."""

    def __init__(self, verdict: Verdict, **fields: Any) -> None:
        super().__init__(verdict.reason)
        self.verdict = verdict
        self.fields = fields


class Unrecorded(NotAdmitted):
    """The allow could not be written to the audit log: no call runs unrecorded."""


logger = logging.getLogger(__name__)

# Seconds a call waits for the secrets the gateway holds to be read from the keyring (begun once,
# when the gateway starts): a keyring that must first be unlocked waits for a person. Past it the
# call is refused, since what it carries cannot be checked.
KEYRING_SECONDS = 60.0

# A stage looks at the call and either lets it on (None), refuses it (raises Refused), or needs to
# wait for someone: the wait it returns refuses, or narrows the call, by raising or by returning.
Wait = Callable[[], Awaitable[None]]
Stage = Callable[[Call], Wait | None]


class Pipeline:
    """Runs the stages for a call against the current catalog, lock holds and policies.

    One sequence, `stages` (route -> start -> secrets -> lock -> policy -> share -> approval -> record), for every
    decision: `decide` waits where a stage asks to, `decide_now` (the fast path's) stops there and
    says nothing; `admit_item` runs the same stages from secrets on, but the lock. Forwarding and
    the audit of the call's end are the call's own (`serve/calls.ToolCall`). `learn` reads every
    server's credentials (None: the config names none), once, in `learn_secrets`.
    """

    def __init__(
        self,
        catalog: Callable[[], Catalog],
        unavailable: Callable[[str], str | None],
        policies: Mapping[str, Policy],
        audit: Audit,
        approver: Approver,
        reviewer: Reviewer | None = None,
        learn: Callable[[], Awaitable[None]] | None = None,
        unasked: Callable[[str], frozenset[str]] = lambda server: frozenset(),
        startable: Startable | None = None,
        share: Stage | None = None,
    ) -> None:
        self._catalog = catalog
        self._unasked = unasked
        self._unavailable = unavailable
        self._policies = policies
        self._audit = audit
        self._approver = approver
        self._reviewer = reviewer
        self._learn = learn
        self._startable = startable
        self._shares = share
        self._learned = anyio.Event()  # every server's credentials are known to `audit.held`...
        self._unread: str | None = None  # ...unless this says why they could not be read
        if learn is None:
            self._learned.set()
        self.stages: tuple[Stage, ...] = (
            *(self._route, self._start, self._secrets, self._lock),
            *(self._policy, self._share, self._approval, self._record),
        )
        self.item_stages: tuple[Stage, ...] = (self._secrets, self._policy, self._approval, self._record)

    async def admit(self, call: Call) -> None:
        """Return when the call may be forwarded (its allow already audited).

        Raises:
            NotAdmitted: refused (audited), or its allow could not be recorded.
            NeedsInput: a 2026-07-28 client must be asked through an InputRequiredResult.
        """
        await self._run(call, self.stages)

    async def admit_item(self, call: Call, policy: Policy, name: str) -> None:
        """Policy, approval and audit for a routed call that the lock lets through: a prompt
        (`name`, with `call.arguments`) or a resource (`name` is the server's URI). Returns when it
        may be forwarded (its allow audited).

        Raises:
            NotAdmitted: refused (audited), or its allow could not be recorded.
            NeedsInput: a 2026-07-28 client must be asked through an InputRequiredResult.
        """
        call.policy, call.item = policy, name
        await self._run(call, self.item_stages)

    async def decide(self, call: Call, stage: Stage) -> None:
        """One stage for the call, waiting where it asks to: what the SDK's path runs.

        Raises:
            NotAdmitted: refused (audited), or its allow could not be recorded.
            NeedsInput: a 2026-07-28 client must be asked through an InputRequiredResult.
        """
        try:
            wait = stage(call)
            if wait is not None:
                await wait()
        except Refused as refused:
            refused.text = self.refusal(call, refused.verdict, **refused.fields)
            raise

    def decide_now(self, call: Call, stage: Stage) -> bool:
        """One stage for the fast path: True when it lets the call on without waiting for anyone.
        False decides and writes nothing (but a failed audit write): the call then goes the SDK's
        way, where the stages decide again, and ask, refuse or record the failure.
        """
        try:
            return stage(call) is None
        except NotAdmitted:
            return False

    async def _run(self, call: Call, stages: tuple[Stage, ...]) -> None:
        for stage in stages:
            await self.decide(call, stage)

    # -- the stages -----------------------------------------------------------------------------

    def _route(self, call: Call) -> Wait | None:
        catalog = self._catalog()
        route = catalog.tool_routes.get(call.name)
        found = route if route is not None else catalog.held.get(call.name)
        if found is None:
            raise Refused(Verdict(Decision.DENY, "route", self.unknown(call.name, "tool")))
        call.server, call.tool = found
        call.held = route is None
        return None

    def unknown(self, name: str, kind: str) -> str:
        """Why `name` (a tool, prompt, ...) is not in the catalog: its server is down, or it is unknown."""
        return (
            self._unavailable(name)
            or f"unknown {kind} '{name}': it is not in Cellblock's catalog; list the {kind}s again"
        )

    def _start(self, call: Call) -> Wait | None:
        why_not = self._startable(call.server) if self._startable is not None else None
        if why_not is None:
            return None

        async def startable() -> None:
            reason = await why_not()
            if reason is not None:
                raise Refused(Verdict(Decision.DENY, "start", reason))

        return startable

    async def learn_secrets(self) -> None:
        """Read every server's credentials into `audit.held`, once; the gateway starts this when it
        starts, and until it has ended a call waits for it (`KEYRING_SECONDS` at most)."""
        if self._learned.is_set():
            return
        try:
            if self._learn is not None:
                await self._learn()
        except Exception as exc:  # the top of its own task: every call is refused, none let through
            logger.exception("could not read the secrets Cellblock holds from the keyring")
            self._unread = (
                f"Cellblock could not read the secrets it holds from the keyring ({type(exc).__name__}), so "
                "no call can be checked for a secret another server holds; see 'cellblock doctor', then "
                "restart the client"
            )
        finally:
            self._learned.set()

    def _secrets(self, call: Call) -> Wait | None:
        if self._learned.is_set():
            self._carries_no_secret(call)
            return None

        async def learned() -> None:
            with anyio.move_on_after(KEYRING_SECONDS):
                await self._learned.wait()
            self._carries_no_secret(call)

        return learned

    def _carries_no_secret(self, call: Call) -> None:
        if self._unread is not None:
            raise Refused(Verdict(Decision.DENY, "secret", self._unread))
        if not self._learned.is_set():
            raise Refused(
                Verdict(
                    Decision.DENY,
                    "secret",
                    f"the keyring did not give Cellblock the secrets it holds within {KEYRING_SECONDS:g} s "
                    "(is it locked?), so this call cannot be checked for a secret another server holds; "
                    "unlock it, and call again",
                )
            )
        held = self._audit.held
        carries = call.item if call.kind == "resource" else call.arguments
        try:
            found = held.carried(call.server, carries)
            if found:  # the refusal's record keeps the arguments: none of their forms of the secret
                call.arguments = held.hidden(call.server, call.arguments)
                call.tool, call.name = held.hidden(call.server, call.tool), held.hidden(call.server, call.name)
        except Scrubbed as exc:
            raise Refused(Verdict(Decision.DENY, "secret", f"the arguments are {exc}")) from None
        if found:
            raise Refused(
                Verdict(Decision.DENY, "secret", _carried_reason(found, call.server, call.kind)),
                carried=[held.name for held in found],
                held_for=[held.server or "cellblock" for held in found],
            )

    def _lock(self, call: Call) -> Wait | None:
        if not call.held:
            return None
        reason = (
            f"tool '{call.name}' of server '{call.server}' is new or changed since the server was approved; "
            f"see 'cellblock diff {call.server}', accept with 'cellblock approve {call.server}'"
        )
        reviewer = self._reviewer
        if reviewer is None:
            raise Refused(Verdict(Decision.DENY, "lock", reason))

        async def review() -> None:
            # a human may accept the changed catalog right here (through elicitation)
            route = self.route(call.name) if await reviewer(call) else None
            if route is None:
                raise Refused(Verdict(Decision.DENY, "lock", reason))
            (call.server, call.tool), call.held = route, False

        return review

    def _policy(self, call: Call) -> Wait | None:
        policy = call.policy or self._policies[call.server]
        # a tool the user let run without asking, as the lock approved it (never a prompt or resource)
        unasked = call.policy is None and not call.held and call.tool in self._unasked(call.server)
        call.verdict = policy.decide(call.item or call.tool, call.arguments, unasked=unasked)
        if call.verdict.decision is Decision.DENY:
            raise Refused(call.verdict)
        return None

    def _share(self, call: Call) -> Wait | None:
        return self._shares(call) if self._shares is not None else None

    def _approval(self, call: Call) -> Wait | None:
        if call.verdict is None or call.verdict.decision is not Decision.ASK:
            return None

        async def ask() -> None:
            call.verdict = await self._approver(call)
            if call.verdict.decision is not Decision.ALLOW:
                raise Refused(call.verdict)

        return ask

    def _record(self, call: Call) -> Wait | None:
        verdict = call.verdict
        if verdict is None:  # the policy stage before this one always gives one
            raise RuntimeError(f"the call to '{call.name}' reached the audit record without a verdict")
        try:
            self._audit.write(
                "call",
                call.server,
                tool=call.tool,
                decision="allow",
                rule=verdict.rule,
                reason=verdict.reason,
                arguments=call.arguments,
                **_kind(call),
            )
        except AuditUnwritten:
            raise Unrecorded(
                f"refused: the audit log {self._audit.path} cannot be written, and no call runs unrecorded"
            ) from None
        return None

    # -- around the stages ----------------------------------------------------------------------

    def route(self, name: str) -> tuple[str, str] | None:
        """(server, tool) for an exposed tool name that is in the catalog and not held."""
        return self._catalog().tool_routes.get(name)

    def recheck(self, call: Call) -> None:
        """After waiting for its server to start, an admitted call still routes where it did. A
        server listed from its lock before it answered may turn out to offer something else; the
        lock then holds it, and this call must not pass.

        Raises:
            Refused: it no longer routes there (audited).
        """
        if self.route(call.name) == (call.server, call.tool):
            return
        reason = (
            f"tool '{call.name}' of server '{call.server}' changed when the server started, since it was approved; "
            f"see 'cellblock diff {call.server}', accept with 'cellblock approve {call.server}'"
        )
        refused = Refused(Verdict(Decision.DENY, "lock", reason))
        refused.text = self.refusal(call, refused.verdict)
        raise refused

    def finished(self, call: Call, is_error: bool, duration_ms: float) -> None:
        self._audit.note(
            "call_end",
            call.server,
            tool=call.tool,
            duration_ms=round(duration_ms, 3),
            is_error=is_error,
            **_kind(call),
        )

    def refusal(self, call: Call, verdict: Verdict, **fields: Any) -> str:
        """Audit the refusal of `call` (with `fields`) and give its text."""
        call.verdict = verdict
        self._audit.note(
            "call",
            call.server,
            tool=call.tool or call.name,
            decision="deny",
            rule=verdict.rule,
            reason=verdict.reason,
            arguments=call.arguments,
            **_kind(call),
            **fields,
        )
        prefix = "denied by policy" if verdict.rule not in ("route", "start", "lock", "secret", "share") else "refused"
        return f"{prefix}: {verdict.rule}: {verdict.reason}"


def _kind(call: Call) -> dict[str, str]:
    """A prompt get's or resource read's `kind` field; a tool call's record has none (and no extra bytes),
    so a tool named "prompt:greet" and the prompt greet are told apart."""
    return {} if call.kind == "tool" else {"kind": call.kind}


def _carried_reason(found: list[Held], server: str, kind: str) -> str:
    """Why a call that carries secrets held for others is refused: which (by name), and why."""
    what = "URI" if kind == "resource" else "arguments"
    return (
        f"its {what} carry {'; '.join(map(str, found))}: a secret goes only to the server it belongs to, "
        f"never to '{server}' (a tool's output may have asked for it to be passed on); nothing was sent to '{server}'"
    )
