"""Carrying a downstream server's request for user input to the human, in either protocol era.

A downstream server may ask the user something in the middle of a tool call. How the question
reaches the client depends on the client's era:

- handshake era (up to 2025-11-25): the gateway sends `elicitation/create` to the client while
  the call is still open (`DirectAsker`);
- 2026-07-28: there is no back channel. The gateway answers the client's call with an
  `InputRequiredResult` and keeps the downstream call waiting (`serve/calls.ToolCall`, parked);
  the client's retry carries the answer and a sealed `request_state` that names the waiting call
  (`ParkedCalls`).

Either way the question is framed as that server's own (`forms.framed`): a fixed first line names
the server and says it is not a Cellblock approval, so the user knows who is asking.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio
import mcp.types as types
from mcp.server.session import ServerSession
from mcp.shared.message import ServerMessageMetadata

from cellblock.gateway.ask.forms import args_digest, framed

__all__ = [
    "PARK_SECONDS",
    "Asker",
    "DirectAsker",
    "InputNeeded",
    "Parked",
    "ParkedCalls",
    "Sealer",
    "StateRejected",
    "elicits",
    "elicits_url",
    "now",
]

# How long a parked call waits for the client's retry before the question counts as cancelled:
# a human may take a while, but a call must not wait forever.
PARK_SECONDS = 120.0
# Parked calls are created by downstream servers; cap them so one cannot grow memory unbounded.
MAX_PARKED = 256


def now() -> float:
    """The wall clock that sealed states and parked calls expire by: read through this one name,
    so a test can move it forward instead of sleeping out a lifetime."""
    return time.time()


class Asker(Protocol):
    """Carries one downstream server's request to the client: a question for the human, or a
    request to sample the client's model; or a question of Cellblock's own during its call."""

    async def elicit(self, server: str, params: types.ElicitRequestParams) -> types.ElicitResult:
        """`server`'s question, framed as that server's (`forms.framed`)."""
        ...

    async def ask(self, params: types.ElicitRequestParams) -> types.ElicitResult:
        """Cellblock's own question (an approval), as it is."""
        ...

    async def sample(self, params: types.CreateMessageRequestParams) -> types.CreateMessageResult: ...


@dataclass
class DirectAsker:
    """Handshake era: ask the client with an `elicitation/create` request tied to the open call."""

    session: ServerSession
    request_id: types.RequestId | None

    async def elicit(self, server: str, params: types.ElicitRequestParams) -> types.ElicitResult:
        return await self.ask(framed(server, params))

    async def ask(self, params: types.ElicitRequestParams) -> types.ElicitResult:
        metadata = ServerMessageMetadata(related_request_id=self.request_id) if self.request_id else None
        return await self.session.send_request(
            types.ElicitRequest(params=params), types.ElicitResult, metadata=metadata
        )

    async def sample(self, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
        metadata = ServerMessageMetadata(related_request_id=self.request_id) if self.request_id else None
        return await self.session.send_request(
            types.CreateMessageRequest(params=params), types.CreateMessageResult, metadata=metadata
        )


@dataclass
class InputNeeded:
    """A parked call's question, waiting for the client to retry with an answer."""

    request: types.ElicitRequest | types.CreateMessageRequest
    key: str  # what the client answers it under: each question of a call has its own
    answer: anyio.Event = field(default_factory=anyio.Event)
    raw: Any = None  # the client's answer, parsed by whoever asked


class Parked(Protocol):
    """A 2026-07-28 call waiting for the client's retry (`serve/calls.ToolCall`)."""

    def expire(self) -> None: ...


def elicits(caps: types.ClientCapabilities | None) -> bool:
    """The client declared it can show the user a form."""
    return bool(caps and caps.elicitation)


def samples(caps: types.ClientCapabilities | None) -> bool:
    """The client declared it can answer with its model (sampling)."""
    return bool(caps and caps.sampling)


def elicits_url(caps: types.ClientCapabilities | None) -> bool:
    """The client can open a URL for the user (URL-mode elicitation, 2025-11-25 and later)."""
    return bool(caps and caps.elicitation and caps.elicitation.url is not None)


class StateRejected(Exception):
    """A retried call's `request_state` is forged, expired, replayed or bound to another call."""


class Sealer:
    """Seals a claim about a call into a `request_state` only this process can have made.

    The state is `payload.hmac`, HMAC-SHA256 under a key that exists only in this process's
    memory; the claim binds the exposed tool name, a digest of the arguments and an expiry.
    What else it carries (a parked call's id, a nonce) and whether it can be redeemed twice is
    the caller's business.
    """

    def __init__(self, prefix: str = "") -> None:
        self._key = secrets.token_bytes(32)
        self._prefix = prefix

    def seal(self, tool: str, arguments: dict[str, Any] | None, seconds: float, **extra: Any) -> str:
        claim = {"tool": tool, "args": args_digest(arguments), "exp": now() + seconds, **extra}
        body = base64.urlsafe_b64encode(json.dumps(claim).encode()).decode()
        return f"{self._prefix}{body}.{self._mac(body)}"

    def open(self, state: str, tool: str, arguments: dict[str, Any] | None) -> dict[str, Any]:
        """The claim in `state`, checked against this call.

        Raises:
            StateRejected: forged, malformed, bound to another call, or expired.
        """
        body, _, mac = state.removeprefix(self._prefix).partition(".")
        if not hmac.compare_digest(mac, self._mac(body)):
            raise StateRejected("does not verify")
        try:
            claim: dict[str, Any] = json.loads(base64.urlsafe_b64decode(body.encode()))
        except ValueError:
            raise StateRejected("is malformed") from None
        if claim.get("tool") != tool or claim.get("args") != args_digest(arguments):
            raise StateRejected("belongs to a different call")
        if claim.get("exp", 0) < now():
            raise StateRejected("has expired")
        return claim

    def _mac(self, body: str) -> str:
        return hmac.new(self._key, body.encode(), hashlib.sha256).hexdigest()


class ParkedCalls:
    """Parked calls keyed by a sealed `request_state` naming them; each can be redeemed once."""

    def __init__(self) -> None:
        self._sealer = Sealer()
        self._calls: dict[str, tuple[Parked, float]] = {}

    def park(self, call: Parked, tool: str, arguments: dict[str, Any] | None) -> str:
        self._expire()
        if len(self._calls) >= MAX_PARKED:
            oldest = min(self._calls, key=lambda k: self._calls[k][1])
            self._calls.pop(oldest)[0].expire()
        call_id = base64.urlsafe_b64encode(os.urandom(12)).decode()
        self._calls[call_id] = (call, now() + PARK_SECONDS)
        return self._sealer.seal(tool, arguments, PARK_SECONDS, id=call_id)

    def redeem(self, state: str, tool: str, arguments: dict[str, Any] | None) -> Parked:
        """The parked call `state` names, removed from the table.

        Raises:
            StateRejected: the state does not verify or does not match this call.
        """
        try:
            claim = self._sealer.open(state, tool, arguments)
        except StateRejected as exc:
            raise StateRejected(f"request_state {exc}") from None
        entry = self._calls.pop(str(claim.get("id")), None)
        if entry is None:
            raise StateRejected("request_state was already used")
        return entry[0]

    def _expire(self) -> None:
        at = now()
        for call_id in [k for k, (_, exp) in self._calls.items() if exp < at]:
            self._calls.pop(call_id)[0].expire()
