"""What a server asks of the client during a call: the user (elicitation), the client's model
(sampling), its roots, and a 2026-07-28 server's input rounds.

A question goes to the call it belongs to (`Downstream.owner`), framed as the server's own; one
that may not be shown (`forms.refusal`), or a URL that would carry a secret the gateway gave the
server, is declined. Sampling follows the server's `sampling:` setting, passes on no secret the
gateway holds, and no request that speaks in Cellblock's name (`forms.sampling_refusal`). One call
may put at most `MAX_QUESTIONS` questions and sampling requests to the client; the server is
refused the rest, and the first refusal is audited (`questions_capped`).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import anyio.to_thread
import mcp.types as types
from mcp.client.session import ClientRequestContext
from mcp.shared.exceptions import MCPError
from pydantic import BaseModel, FileUrl

from cellblock.gateway.ask.forms import refusal, sampling_refusal
from cellblock.gateway.config.model import LocalServer, RemoteServer
from cellblock.gateway.downstream.keys import ServerKeys
from cellblock.gateway.downstream.roots import granted_roots
from cellblock.gateway.downstream.rounds import Caller, DownstreamError
from cellblock.gateway.scrub import Scrubbed
from cellblock.gateway.scrub import scrub as scrub_secrets

__all__ = ["MAX_QUESTIONS", "Questions", "SamplingApproval"]

logger = logging.getLogger(__name__)

# Questions (forms for the user, requests for the client's model) one call may ask, whatever the
# era: a human does not answer more forms than this for one call, nor does a model's loop on a
# server's behalf need more turns; a server flooding one call (1,500 sampling requests) gets the
# rest refused, and leaves one audit line for them.
MAX_QUESTIONS = 32

P = TypeVar("P", bound=BaseModel)  # a server's question or sampling request
A = TypeVar("A", bound=BaseModel)  # the answer to one
# asks the human whether a server may use the client's model (`sampling: ask`): None when they
# allowed it, else why not
SamplingApproval = Callable[[str, types.CreateMessageRequestParams, Caller], Awaitable[str | None]]


@dataclass
class Questions:
    """One server's questions; see the module docstring."""

    name: str
    config: LocalServer | RemoteServer
    sampling: str  # "deny" | "ask" | "allow"
    approve: SamplingApproval | None
    event: Callable[..., None]  # an audit event about this server
    keys: ServerKeys  # the secrets the gateway holds, and whose each is
    owner: Callable[[], Caller | None]  # the call a question belongs to (`Downstream.owner`)

    # -- the SDK client's callbacks: questions that come over the server's session ---------

    async def on_elicit(
        self, context: ClientRequestContext, params: types.ElicitRequestParams
    ) -> types.ElicitResult | types.ErrorData:
        return await _or_refusal(self.elicit(params, self.owner()))

    async def on_sampling(
        self, context: ClientRequestContext, params: types.CreateMessageRequestParams
    ) -> types.CreateMessageResult | types.ErrorData:
        return await _or_refusal(self.sample(params, self.owner()))

    async def on_roots(self, context: ClientRequestContext) -> types.ListRootsResult:
        return self.roots()

    def callbacks(self, offered: list[str]) -> dict[str, Any]:
        """The SDK client's callbacks for what the server is offered (`Offer.names`): the SDK
        declares to the server a capability for each callback it is given, and none for the rest."""
        return {
            "list_roots_callback": self.on_roots,
            "elicitation_callback": self.on_elicit if "elicitation" in offered else None,
            "sampling_callback": self.on_sampling if "sampling" in offered else None,
        }

    # -- each kind of question -------------------------------------------------------------

    def without_secrets(self, params: P) -> tuple[P, int]:
        """A server's question or sampling request with every secret the gateway holds replaced,
        and how many were.

        Raises:
            DownstreamError: it is nested too deeply to be checked.
        """
        try:
            clean, count = scrub_secrets(params.model_dump(by_alias=True, mode="json"), self.keys.pattern())
        except Scrubbed as exc:
            raise DownstreamError(f"server '{self.name}' sent a request that is {exc}") from None
        return (type(params).model_validate(clean), count) if count else (params, 0)

    def count(self, entry: Caller, what: str) -> None:
        """Count one more question of `entry`'s call; past `MAX_QUESTIONS` it is refused, and the
        first refused is audited.

        Raises:
            DownstreamError: the call has asked `MAX_QUESTIONS` already.
        """
        entry.questions += 1
        if entry.questions <= MAX_QUESTIONS:
            return
        if entry.questions == MAX_QUESTIONS + 1:
            self.event("questions_capped", limit=MAX_QUESTIONS, what=what)
            logger.warning(
                "server '%s' asked more than %d questions in one call; the rest are refused", self.name, MAX_QUESTIONS
            )
        raise DownstreamError(
            f"server '{self.name}' may ask at most {MAX_QUESTIONS} questions (forms and sampling requests) "
            f"in one call; this {what} request is refused"
        )

    async def elicit(self, params: types.ElicitRequestParams, entry: Caller | None) -> types.ElicitResult:
        """The server's question put to the user, or declined: nobody to ask, a client that cannot
        show it, or it may not be shown (`forms.refusal`: a URL a browser should not open, or the
        look of an approval).

        Raises:
            DownstreamError: the call has asked as many questions as it may (`count`).
        """
        if entry is None or entry.asker is None:
            return types.ElicitResult(action="decline")
        self.count(entry, "elicitation")
        url = params.url if isinstance(params, types.ElicitRequestURLParams) else None
        if not (entry.can_elicit_url if url is not None else entry.can_elicit):
            # a question the client did not say it can show would fail its call there, unanswered
            self.event("elicitation_refused", mode=params.mode, reason="the client cannot show it", url=url)
            return types.ElicitResult(action="decline")
        try:
            params, found = self.without_secrets(params)
            why = refusal(params)
        except DownstreamError as exc:
            found, why = 0, str(exc)
        if found and isinstance(params, types.ElicitRequestURLParams):
            # a page the user opens could be told what the gateway gave the server; it is not opened
            why = "its URL or message holds a secret the gateway gave the server"
        if why is not None:
            self.event("elicitation_refused", mode=params.mode, reason=why, url=url)
            logger.warning("server '%s': its question was not shown to the user: %s", self.name, why)
            return types.ElicitResult(action="decline")
        return await entry.asker.elicit(self.name, params)

    async def sample(self, params: types.CreateMessageRequestParams, entry: Caller | None) -> types.CreateMessageResult:
        """Pass a request for the client's model on, as `sampling:` allows.

        Raises:
            DownstreamError: refused by the config or the user, the call has asked as many
                questions as it may (`count`), or the client could not answer.
        """
        if entry is not None:
            self.count(entry, "sampling")
        if self.sampling == "deny":
            self.event("sampling", decision="deny", reason="sampling: deny")
            raise DownstreamError(
                f"server '{self.name}' may not use the client's model (sampling: deny in cellblock.yaml)"
            )
        if entry is None or entry.asker is None:
            raise DownstreamError(f"server '{self.name}' asked for sampling outside any call; refused")
        if not entry.can_sample:  # asked anyway, the client would fail the call on it
            self.event("sampling", decision="deny", reason="the client cannot sample")
            raise DownstreamError(f"server '{self.name}' asked for the model of a client that has none to offer")
        # folding every text of a large request takes a while: not on the event loop
        why = await anyio.to_thread.run_sync(sampling_refusal, params)
        if why is not None:
            self.event("sampling", decision="deny", reason=why)
            raise DownstreamError(f"server '{self.name}' may not use the client's model: {why}")
        if self.sampling == "ask" and self.approve is not None:
            refusal = await self.approve(self.name, params, entry)
            if refusal is not None:
                self.event("sampling", decision="deny", reason=refusal)
                raise DownstreamError(f"server '{self.name}' may not use the client's model: {refusal}")
        # not `max_tokens`: a key with TOKEN in it is written as [redacted] (audit/secretnames.py)
        self.event("sampling", decision="allow", max_output=params.max_tokens)
        params, _ = self.without_secrets(params)  # the client's model sees no secret of the gateway's
        try:
            answer = await entry.asker.sample(params)
        except (MCPError, ValueError) as exc:
            raise DownstreamError(f"the client did not complete the sampling request of '{self.name}': {exc}") from exc
        self._carries_no_secret(answer)
        return answer

    def _carries_no_secret(self, answer: types.CreateMessageResult) -> None:
        """The model's answer goes to the server that asked: like a call's arguments, it must not
        carry a secret held for another server (a model can be led to copy one there).

        Raises:
            DownstreamError: it does, named (never its value); audited.
        """
        try:
            found = [held.name for held in self.keys.carried(answer.model_dump(by_alias=True, mode="json"))]
        except Scrubbed as exc:
            found = [f"(an answer {exc})"]
        if found:
            self.event(
                "sampling", decision="deny", reason="the answer carries a secret held for another server", carried=found
            )
            raise DownstreamError(
                f"the client's answer to the sampling request of '{self.name}' carries {', '.join(found)}, "
                "held for another server; refused"
            )

    def roots(self) -> types.ListRootsResult:
        """The directories granted to the server's jail that are the user's work (`granted_roots`),
        and never more (none for unjailed or remote servers)."""
        paths = granted_roots(self.config) if isinstance(self.config, LocalServer) else []
        return types.ListRootsResult(
            roots=[types.Root(uri=FileUrl(Path(p).resolve().as_uri()), name=Path(p).name or p) for p in paths]
        )

    async def answer(self, request: types.InputRequest, caller: Caller) -> types.InputResponse:
        """The answer to one of a 2026-07-28 server's input requests during `caller`'s call.

        Raises:
            DownstreamError: a sampling request refused, a question past `MAX_QUESTIONS`, or the
                client could not answer it.
        """
        if isinstance(request, types.ElicitRequest):
            return await self.elicit(request.params, caller)
        if isinstance(request, types.ListRootsRequest):
            return self.roots()
        return await self.sample(request.params, caller)


async def _or_refusal(answer: Awaitable[A]) -> A | types.ErrorData:
    """The answer to a server's request over its session, or the refusal, in words, as an error."""
    try:
        return await answer
    except DownstreamError as exc:
        return types.ErrorData(code=types.INVALID_REQUEST, message=str(exc))
