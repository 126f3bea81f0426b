"""One tool call, from its admission to the last byte of its answer.

A `ToolCall` is made once the pipeline has admitted a call (`serve/pipeline.py`), whichever way
it came in: the fast path's allow (`serve/fastpath.py`) or the SDK's handler (`serve/callhandler.py`),
which may have asked the user first. From there this one object carries it: each round it sends
to the server (`Target.send_call`: a local server's over its pipes, a remote one's through
the SDK's client), the server's questions to the user while it runs, the rounds a 2026-07-28
server asks for, progress and logs, cancellation, the timeout (the channel's, per round), the
shaping of the result, the end of its audit record, and the answer.

Where the answer goes is the `Reply` of the request the call came on (`serve/replies.py`): the wire, for the fast
path, or the SDK handler that awaits it. Asking the user is a change of state, never a change of
machinery: a handshake-era client is asked within the request (`Reply.direct`); a 2026-07-28
client is answered with the question, the call is parked (`ask/elicitation.ParkedCalls`), and
the client's retry brings the call its next `Reply`. One question is with a 2026-07-28 client at
a time: another the server asks meanwhile waits, and goes to the client on the retry.
"""

from __future__ import annotations

import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any, cast

import anyio
import anyio.abc
import mcp.types as types
from mcp.shared.exceptions import MCPError
from mcp_types import methods as _methods
from pydantic import BaseModel

from cellblock.gateway.ask.elicitation import PARK_SECONDS, Asker, InputNeeded, ParkedCalls
from cellblock.gateway.ask.forms import framed
from cellblock.gateway.credentials import CredentialError
from cellblock.gateway.downstream.rounds import DownstreamError, Round
from cellblock.gateway.downstream.target import Target
from cellblock.gateway.namespacing import UriTable
from cellblock.gateway.scrub import Scrubbed, scrub, scrub_result
from cellblock.gateway.serve.items import held_reason
from cellblock.gateway.serve.pipeline import Call, NotAdmitted, Pipeline
from cellblock.gateway.serve.shaping import exposed_result

if TYPE_CHECKING:
    from cellblock.gateway.serve.replies import Reply

__all__ = ["INPUT_KEY", "CallState", "Calls", "ToolCall"]

# The key of the one question a parked 2026-07-28 call puts to the client at a time. A retry
# carries the answer to the question its request state names; a task's tasks/update names only
# the key, so there each question has one of its own (`cellblock-2` for the second, and so on).
INPUT_KEY = "cellblock"
# Downstream 2026-07-28 servers may ask for input in rounds; bound them like the SDK does.
MAX_INPUT_ROUNDS = 8


class CallState(Enum):
    STARTING = "starting"  # admitted; its server may still be starting
    RUNNING = "running"  # a round is with the server
    ASKING = "asking"  # the server asked something: the user or the client's model answers
    PARKED = "parked"  # 2026-07-28: the client holds the question; the call waits for its retry
    DONE = "done"  # answered (or the answer had nobody left to go to)
    CANCELLED = "cancelled"  # the client cancelled it, or its retry never came: never answered


@dataclass
class Calls:
    """What the calls of one gateway share."""

    pipeline: Pipeline
    parked: ParkedCalls
    secrets: Callable[[], re.Pattern[str] | None]
    tasks: Callable[[], anyio.abc.TaskGroup]
    uris: Callable[[], UriTable]  # the catalog's, as it is when the call ends
    # whether a page a tool result embeds under (server, its ui:// URI) may go to the client: no
    # default, which would pass every page
    page_passes: Callable[[str, str, dict[str, Any]], bool]
    # the steps of a call once it is a `ToolCall` (`CallHandler.path`'s `then` faces, in order):
    # False from one, the call has ended
    then: tuple[Callable[[ToolCall], Awaitable[bool]], ...] = ()


def _dumped(model: BaseModel) -> dict[str, Any]:
    return model.model_dump(by_alias=True, mode="json", exclude_none=True)


@dataclass(eq=False)
class ToolCall:
    """One admitted tool call; see the module docstring. It is what the server's questions and
    logs reach while it runs (`Target.track`), and an `Asker` for them."""

    call: Call
    ds: Target  # the server it goes to
    reply: Reply | None
    shared: Calls
    params: dict[str, Any]  # the round sent next: the server's tool name, the arguments, the caller's _meta
    state: CallState = CallState.STARTING
    began: float = field(default_factory=time.perf_counter)
    rounds: int = 0
    asked: int = 0  # questions put to a 2026-07-28 client so far
    questions: int = 0  # questions and sampling requests the server put to this call (`Questions.count`)
    _round: Round | None = None
    _question: InputNeeded | None = None
    _held: Reply | None = None  # parked: the request the question went to (what that client can do)
    _ended: dict[str, Any] | None = None  # the result of a call that ended while parked, for the retry
    _logged_in: bool = False  # a login through the client was tried for this call (it is sent again once)
    _asking: anyio.Lock = field(default_factory=anyio.Lock)  # one question to a 2026-07-28 client at a time
    _starting: anyio.CancelScope = field(default_factory=anyio.CancelScope)  # `start`, until it sends

    def __post_init__(self) -> None:
        self.ds.track(self)

    # -- what the server reaches while the call runs ------------------------------------------

    @property
    def asker(self) -> Asker | None:
        # parked, it still asks: a question waits for the retry, and is put to the client on it
        return self if self.reply is not None or self.state is CallState.PARKED else None

    @property
    def waiting(self) -> bool:
        # every request but a task's is answered by the request (or its retry)
        return self.reply is not None and self.reply.retried

    @property
    def can_elicit(self) -> bool:
        client = self._client
        return client is not None and client.can_elicit

    @property
    def can_elicit_url(self) -> bool:
        client = self._client
        return client is not None and client.can_elicit_url

    @property
    def can_sample(self) -> bool:
        client = self._client
        return client is not None and client.can_sample

    @property
    def parked(self) -> bool:
        return self.state is CallState.PARKED

    @property
    def _client(self) -> Reply | None:
        """The request the call answers, or (parked) the one its question went to."""
        return self.reply if self.reply is not None else self._held

    @property
    def question(self) -> dict[str, Any] | None:
        """While parked: the input requests its client holds, as JSON."""
        question = self._question if self.state is CallState.PARKED else None
        return None if question is None else {question.key: _dumped(question.request)}

    def log(self, params: types.LoggingMessageNotificationParams) -> None:
        if self.reply is not None:
            self.reply.log(params)

    def progress(self, value: float, total: float | None, message: str | None) -> None:
        if self.reply is not None and self.reply.wants_progress:
            if message is not None:
                message = scrub(message, self.shared.secrets())[0]
            self.reply.progress(value, total, message)

    async def elicit(self, server: str, params: types.ElicitRequestParams) -> types.ElicitResult:
        return await self.ask(framed(server, params))

    async def ask(self, params: types.ElicitRequestParams) -> types.ElicitResult:
        reply = self.reply
        if reply is not None and not reply.modern and reply.direct is not None:
            try:
                return cast(types.ElicitResult, await self._direct(reply.direct.ask(params)))
            except ValueError:  # the client's answer is no answer: nobody accepted, as on a retry without one
                return _CANCEL
        raw = await self._park(types.ElicitRequest(params=params))
        try:
            return types.ElicitResult.model_validate(raw, by_name=False) if raw is not None else _CANCEL
        except ValueError:
            return _CANCEL

    async def sample(self, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
        """The client's completion.

        Raises:
            ValueError: the client sent no usable answer.
            MCPError: the client answered with an error.
        """
        reply = self.reply
        if reply is not None and not reply.modern and reply.direct is not None:
            return cast(types.CreateMessageResult, await self._direct(reply.direct.sample(params)))
        raw = await self._park(types.CreateMessageRequest(params=params))
        try:
            return types.CreateMessageResult.model_validate(raw, by_name=False)
        except ValueError:
            raise ValueError("the client did not answer the sampling request") from None

    async def _direct(self, asked: Any) -> Any:
        state, self.state = self.state, CallState.ASKING
        try:
            return await asked
        finally:
            if self.state is CallState.ASKING:
                self.state = state

    async def _park(self, request: types.ElicitRequest | types.CreateMessageRequest) -> Any:
        """2026-07-28: answer the client's request with the question and wait for its retry."""
        async with self._asking:
            reply = self.reply
            if reply is None or self.state in (CallState.DONE, CallState.CANCELLED):
                return None
            self.asked += 1
            key = INPUT_KEY if reply.retried or self.asked == 1 else f"{INPUT_KEY}-{self.asked}"
            question = self._question = InputNeeded(request, key)
            # a retry brings the next request to answer; a task's client keeps the one it has
            state = self.shared.parked.park(self, self.call.name, self.call.arguments) if reply.retried else None
            resume, self.state, self._held = self.state, CallState.PARKED, reply
            if reply.retried:
                self.reply = None
            reply.ask(types.InputRequiredResult(input_requests={key: request}, request_state=state))
            # no retry in time: nobody answered, which is a cancel, never an accept
            with anyio.move_on_after(PARK_SECONDS):
                await question.answer.wait()
            self._question = self._held = None
            if self.state in (CallState.PARKED, CallState.ASKING):  # answered, or no retry in time
                self.state = resume
            return question.raw

    def resume(self, reply: Reply, responses: dict[str, Any] | None) -> None:
        """The client's retry of a parked call: its answer to the question, and the request that
        the call answers from now on."""
        self.reply = reply
        if self._ended is not None:  # it ended while parked (its server timed out, say)
            reply.answer(self._shaped(reply, self._ended)[0])
            return
        question = self._question
        if question is None:
            return
        raw = (responses or {}).get(question.key)
        question.raw = _dumped(raw) if isinstance(raw, BaseModel) else raw
        self.state = CallState.ASKING
        question.answer.set()

    def expire(self) -> None:
        """The client's retry did not come in time (`ParkedCalls`)."""
        self.cancel("the client did not retry the call in time")

    # -- the rounds -----------------------------------------------------------------------------

    async def start(self) -> None:
        """The steps after admission (`Calls.then`: ready, recheck, send), until one ends the call.
        A call refused meanwhile is answered with its refusal."""
        for then in self.shared.then:
            if not await then(self):
                return

    async def ready(self) -> bool:
        """Wait for the server to be up: it may be starting, or need a login that the client can
        carry. False: the call has ended (answered with why the server is not up) or was
        cancelled meanwhile."""
        with self._starting:
            if not await self._ready():
                return False
        return self.state is not CallState.CANCELLED

    async def _ready(self) -> bool:
        ds = self.ds
        try:
            for attempt in (1, 2):
                if ds.needs_login and self.can_elicit_url:
                    await ds.login_through_client(self)
                try:
                    await ds.ready_client()
                    return True
                except DownstreamError:
                    if attempt == 1 and ds.needs_login and self.can_elicit_url:
                        continue  # it failed just now for want of a login: log in through the client
                    raise
        except (DownstreamError, CredentialError) as exc:
            self._end(self._failed(exc))
        return False

    def recheck(self) -> bool:
        """A server that was not up at admission may offer something else now that it is: the
        call still routes where it did (`Pipeline.recheck`), or it ends with the refusal."""
        try:
            self.shared.pipeline.recheck(self.call)
        except NotAdmitted as refused:
            self._end(_dumped(refused.result))
            return False
        return True

    def send(self) -> None:
        """Send the current round to the server, without waiting for it."""
        self.state = CallState.RUNNING
        progress = self.progress if self.reply is not None and self.reply.wants_progress else None
        logs = self.reply is not None and self.reply.carries_logs
        try:
            self._round = self.ds.send_call(self.params, self._answered, progress, logs)
        except OSError as exc:  # the server went away just now: answered as a closed connection
            self._end(self._failed(MCPError(types.CONNECTION_CLOSED, f"Connection closed: {exc}")))
        except (ValueError, RecursionError) as exc:  # arguments nested too deep to encode again
            why = f"Cellblock could not pass the call to '{self.call.name}' on: {type(exc).__name__}"
            self._end(self._failed(DownstreamError(why)))

    def _answered(self, result: dict[str, Any] | None, failure: BaseException | None) -> None:
        """The server answered the round (or failed it, or it timed out)."""
        self._round = None
        if self.state in (CallState.DONE, CallState.CANCELLED):
            return
        if failure is not None and self.ds.needs_login and self.can_elicit_url and not self._logged_in:
            # a step-up: the server wants more scope; a login through the client, then the call once more
            self._logged_in = True
            self.state = CallState.STARTING
            self.shared.tasks().start_soon(self._log_in_again)
        elif failure is not None or result is None:
            self._end(self._failed(failure or ValueError("the result is not an object")))
        elif _methods.is_input_required(result):
            self.state = CallState.ASKING
            self.shared.tasks().start_soon(self._next_round, dict(result))
        else:
            self._end(result)

    async def _log_in_again(self) -> None:
        try:
            await self.ds.login_through_client(self)
        except CredentialError as exc:
            return self._end(self._failed(exc))
        return await self.start()

    async def _next_round(self, result: dict[str, Any]) -> None:
        """A 2026-07-28 server asks for input before it answers: each request answered, then the
        call sent again with the answers."""
        self.rounds += 1
        if self.rounds >= MAX_INPUT_ROUNDS:
            why = f"server '{self.ds.name}' asked for input more than {MAX_INPUT_ROUNDS} times"
            return self._end(_dumped(types.CallToolResult(content=[_text(why)], is_error=True)))
        try:
            asked = types.InputRequiredResult.model_validate(result, by_name=False)
        except ValueError as exc:
            return self._end(self._failed(exc))
        try:
            responses = {
                key: _dumped(await self.ds.questions.answer(req, self))
                for key, req in (asked.input_requests or {}).items()
            }
        except MCPError as exc:  # the client's, to a question (a refused sampling is a DownstreamError)
            why = f"the client did not answer the question of server '{self.ds.name}': {exc.message}"
            return self._end(self._failed(DownstreamError(why)))
        except (DownstreamError, ValueError) as exc:
            return self._end(self._failed(exc))
        if self.state in (CallState.DONE, CallState.CANCELLED):
            return None
        self.params = {**self.params, "inputResponses": responses, "requestState": asked.request_state}
        self.send()
        return None

    def cancel(self, reason: str) -> None:
        """Stop the call and tell the server to stop; it ends unanswered."""
        if self.state in (CallState.DONE, CallState.CANCELLED):
            return
        self.state = CallState.CANCELLED
        self._starting.cancel()
        if self._round is not None:
            self._round.cancel(reason)
            self._round = None
        if self._question is not None:
            self._question.answer.set()  # a question left with the client counts as cancelled
        self.ds.untrack(self)

    # -- the end ----------------------------------------------------------------------------------

    def _failed(self, exc: BaseException) -> dict[str, Any]:
        return _dumped(self.ds.failed_call(self.call.tool, exc))

    def _end(self, result: dict[str, Any]) -> None:
        """Shape the result for the client, write the end of the call's record, then answer."""
        if self.state in (CallState.DONE, CallState.CANCELLED):
            return
        self.state = CallState.DONE
        self.ds.untrack(self)
        reply, secrets = self.reply, self.shared.secrets()
        try:
            result = self._pages_checked(result)
            result = scrub_result(exposed_result(self.shared.uris(), self.call.server, result), secrets)
        except (Scrubbed, ValueError) as exc:  # Scrubbed is a ValueError: too deep to check for secrets
            result = scrub_result(self._failed(exc), secrets)
        shaped, result = self._shaped(reply, result)
        # the record is complete before the answer leaves
        duration_ms = (time.perf_counter() - self.began) * 1000
        self.shared.pipeline.finished(self.call, bool(result.get("isError")), duration_ms)
        if reply is not None:
            reply.answer(shaped)
        elif self._question is not None:  # parked: the client's retry is answered with the end
            self._ended = result
        if self._question is not None:
            self._question.answer.set()  # the server's question has nobody left to answer it

    def _pages_checked(self, result: dict[str, Any]) -> dict[str, Any]:
        """`result` without an app page it embeds that is not the page the lock approved: a host
        may render it as that app. Each one left out is said in its place, and has the server's
        catalog read again, which holds the new page for review."""
        content = result.get("content")
        if not isinstance(content, list):
            return result
        server, kept, changed = self.call.server, [], False
        for item in content:
            inner = item.get("resource") if isinstance(item, dict) and item.get("type") == "resource" else None
            uri = inner.get("uri") if isinstance(inner, dict) else None
            if isinstance(uri, str) and not self.shared.page_passes(server, uri, inner):  # type: ignore[arg-type]
                changed = True
                why = held_reason("app", uri, server)
                kept.append({"type": "text", "text": f"[cellblock: an embedded app page left out: {why}]"})
            else:
                kept.append(item)
        if not changed:
            return result
        self.ds.changes.soon()
        return {**result, "content": kept}

    def _shaped(self, reply: Reply | None, result: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        """The result as `reply` answers with it, and the result; one that does not validate is
        answered as the error it is."""
        if reply is None:
            return result, result
        try:
            return reply.shape(result), result
        except ValueError as exc:
            # the server's error text is its own too (one line of text: it cannot be too deep to scrub)
            result = scrub_result(self._failed(exc), self.shared.secrets())
            return reply.shape(result), result


_CANCEL = types.ElicitResult(action="cancel")


def _text(text: str) -> types.TextContent:
    return types.TextContent(type="text", text=text)
