"""The call path, in one place: route -> lock -> policy -> approval -> (forward) -> audit.

Each stage can only refuse or pass a call on; none can widen what an earlier one decided. A
refusal is a tool error the model can read, and every decision is written to the audit log
before anything is forwarded: if that write fails, the call is refused.

`admit` runs every stage. `admit_item` runs the policy, approval and audit stages for a prompt get
or a resource read that the gateway has routed and checked against the lock itself: the same
rules machinery, the same approvals, the same `call` audit record (its `tool` is "prompt:NAME"
or "resource:URI"). `allow_now` is the fast path's admission (gateway/serve/fastpath.py): the
same route, lock and policy stages, taken only when they allow the call without asking anyone;
whatever else they would say, it says nothing and leaves the call to `admit`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any

import mcp.types as types

from cellblock.gateway.audit.log import Audit
from cellblock.gateway.downstream.rounds import error_result
from cellblock.gateway.serve.catalog import Catalog
from cellblock.policy.rules import Policy
from cellblock.policy.types import Decision, Verdict

__all__ = ["STAGES", "Approver", "Asking", "Call", "Pipeline", "Reviewer"]

STAGES = ("route", "lock", "policy", "approval")


@dataclass
class Call:
    """One tools/call (or prompts/get, resources/read) as it moves through the stages."""

    name: str  # the exposed name the client used ("prompt:NAME" or "resource:URI" for those)
    arguments: dict[str, Any] | None
    server: str = ""
    tool: str = ""  # the server's tool; for a prompt or resource its kind and name: "prompt:greet"
    kind: str = "tool"  # "tool", "prompt" or "resource"
    verdict: Verdict | None = None
    ctx: Asking | None = None  # how to reach the human who may approve it
    human: types.ElicitResult | None = None  # their answer, when a 2026-07-28 retry carries it


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


class Pipeline:
    """Runs the stages for a call against the current catalog, lock holds and policies."""

    def __init__(
        self,
        catalog: Callable[[], Catalog],
        unavailable: Callable[[str], str | None],
        policies: Mapping[str, Policy],
        audit: Audit,
        approver: Approver,
        reviewer: Reviewer | None = None,
    ) -> None:
        self._catalog = catalog
        self._unavailable = unavailable
        self._policies = policies
        self._audit = audit
        self._approver = approver
        self._reviewer = reviewer

    async def admit(self, call: Call) -> types.CallToolResult | None:
        """None when the call may be forwarded (its allow already audited), else the refusal to return."""
        catalog = self._catalog()
        route = catalog.tool_routes.get(call.name)
        held = catalog.held.get(call.name) if route is None else None
        if held is not None and self._reviewer is not None:
            call.server, call.tool = held
            # a human may accept the changed catalog right here (through elicitation)
            if await self._reviewer(call):
                catalog = self._catalog()
                route = catalog.tool_routes.get(call.name)
                held = catalog.held.get(call.name) if route is None else None
        if route is None:
            if held is not None:  # lock: new or changed since approval
                call.server, call.tool = held
                reason = (
                    f"tool '{call.name}' of server '{held[0]}' is new or changed since the server was approved; "
                    f"see 'cellblock diff {held[0]}', accept with 'cellblock approve {held[0]}'"
                )
                return self._refuse(call, Verdict(Decision.DENY, "lock", reason))
            reason = self._unavailable(call.name) or (
                f"unknown tool '{call.name}': it is not in Cellblock's catalog; list the tools again"
            )
            return self._refuse(call, Verdict(Decision.DENY, "route", reason))
        call.server, call.tool = route
        refused = await self.admit_item(call, self._policies[call.server], call.tool)
        return None if refused is None else error_result(refused)

    async def admit_item(self, call: Call, policy: Policy, name: str) -> str | None:
        """Policy, approval and audit for a routed call that the lock lets through: a tool call,
        a prompt (`name`, with `call.arguments`) or a resource (`name` is the server's URI).
        None when it may be forwarded (its allow audited), else the refusal's text (audited).

        Raises:
            NeedsInput: a 2026-07-28 client must be asked through an InputRequiredResult.
        """
        verdict = policy.decide(name, call.arguments)
        call.verdict = verdict
        if verdict.decision is Decision.ASK:
            verdict = await self._approver(call)
            call.verdict = verdict
        if verdict.decision is not Decision.ALLOW:
            return self.refusal(call, verdict)
        return self._allowed(call, verdict)

    def server_of(self, name: str) -> str | None:
        """The server an exposed name belongs to, whether the lock holds it or not."""
        catalog = self._catalog()
        route = catalog.tool_routes.get(name) or catalog.held.get(name)
        return None if route is None else route[0]

    def route(self, name: str) -> tuple[str, str] | None:
        """(server, tool) for an exposed tool name that is in the catalog and not held."""
        return self._catalog().tool_routes.get(name)

    def allow_now(self, call: Call, route: tuple[str, str]) -> bool:
        """The fast path's admission of a call whose name routes to `route`: True when the policy
        allows it without asking anyone, and the allow is audited. False decides and writes
        nothing: the call then goes through `admit`, which asks, refuses or records the failure.
        """
        verdict = self._policies[route[0]].decide(route[1], call.arguments)
        if verdict.decision is not Decision.ALLOW:
            return False
        call.server, call.tool = route
        call.verdict = verdict
        return self._allow(call, verdict) is None

    def recheck(self, call: Call) -> types.CallToolResult | None:
        """After waiting for its server to start, an admitted call still routes where it did:
        None, or the refusal (audited). A server listed from its lock before it answered may
        turn out to offer something else; the lock then holds it, and this call must not pass."""
        if self.route(call.name) == (call.server, call.tool):
            return None
        reason = (
            f"tool '{call.name}' of server '{call.server}' changed when the server started, since it was approved; "
            f"see 'cellblock diff {call.server}', accept with 'cellblock approve {call.server}'"
        )
        return self._refuse(call, Verdict(Decision.DENY, "lock", reason))

    def finished(self, call: Call, is_error: bool, duration_ms: float) -> None:
        self._audit.write(
            "call_end",
            call.server,
            tool=call.tool,
            duration_ms=round(duration_ms, 3),
            is_error=is_error,
            **_kind(call),
        )

    def _allow(self, call: Call, verdict: Verdict) -> types.CallToolResult | None:
        refused = self._allowed(call, verdict)
        return None if refused is None else error_result(refused)

    def _allowed(self, call: Call, verdict: Verdict) -> str | None:
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
        if self._audit.failed:
            return f"refused: the audit log {self._audit.path} cannot be written, and no call runs unrecorded"
        return None

    def _refuse(self, call: Call, verdict: Verdict) -> types.CallToolResult:
        return error_result(self.refusal(call, verdict))

    def refusal(self, call: Call, verdict: Verdict) -> str:
        """Audit the refusal of `call` and give its text."""
        call.verdict = verdict
        self._audit.write(
            "call",
            call.server,
            tool=call.tool or call.name,
            decision="deny",
            rule=verdict.rule,
            reason=verdict.reason,
            arguments=call.arguments,
            **_kind(call),
        )
        prefix = "denied by policy" if verdict.rule not in ("route", "lock") else "refused"
        return f"{prefix}: {verdict.rule}: {verdict.reason}"


def _kind(call: Call) -> dict[str, str]:
    """A prompt get's or resource read's `kind` field; a tool call's record has none (and no extra bytes),
    so a tool named "prompt:greet" and the prompt greet are told apart."""
    return {} if call.kind == "tool" else {"kind": call.kind}
