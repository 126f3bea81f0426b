"""A downstream server's question reaches the client framed as that server's: asked at once in the
handshake era (`DirectAsker`), or parked until the client's retry on 2026-07-28 (`ParkedCall`),
whose sealed state names the waiting call and redeems once (`ParkedCalls`, `Sealer`)."""

from __future__ import annotations

from typing import Any

import anyio
import mcp.types as types
import pytest

from cellblock.gateway.ask.elicitation import (
    MAX_PARKED,
    DirectAsker,
    InputNeeded,
    ParkedCall,
    ParkedCalls,
    Sealer,
    StateRejected,
)

pytestmark = pytest.mark.anyio

QUESTION = types.ElicitRequestFormParams(message="Your name?", requested_schema={"type": "object", "properties": {}})
FRAMED = "Question from server 'fs' (not a Cellblock approval):\nYour name?"
ACCEPTED = types.ElicitResult(action="accept", content={"name": "ada"})


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Session:
    """The client's session as `DirectAsker` uses it: every request it sends, answered with `reply`."""

    def __init__(self, reply: Any) -> None:
        self.reply = reply
        self.sent: list[tuple[Any, Any]] = []

    async def send_request(self, request: Any, result_type: Any, metadata: Any = None) -> Any:
        self.sent.append((request, metadata))
        return self.reply


async def test_a_servers_question_goes_to_the_client_at_once_under_a_line_naming_the_server() -> None:
    session = Session(ACCEPTED)
    asker = DirectAsker(session, request_id=7)
    assert await asker.elicit("fs", QUESTION) == ACCEPTED
    [(request, metadata)] = session.sent
    assert isinstance(request, types.ElicitRequest) and request.params.message == FRAMED
    assert metadata.related_request_id == 7  # tied to the open call, so the client shows it there


async def test_cellblocks_own_question_goes_as_it_is() -> None:
    session = Session(ACCEPTED)
    await DirectAsker(session, request_id=None).ask(QUESTION)
    [(request, metadata)] = session.sent
    assert request.params.message == "Your name?" and metadata is None


async def test_a_parked_calls_question_waits_for_the_retry_and_gets_its_answer() -> None:
    parked = ParkedCall(entry=None, server="fs")
    answers: list[types.ElicitResult] = []

    async def downstream() -> None:
        answers.append(await parked.elicit("fs", QUESTION))

    with anyio.fail_after(5):  # the downstream call's wait for the answer too
        async with anyio.create_task_group() as tg:
            tg.start_soon(downstream)
            event = await parked.next_event()
            assert isinstance(event, InputNeeded) and isinstance(event.request, types.ElicitRequest)
            assert event.request.params.message == FRAMED
            parked.answer({"q": ACCEPTED}, "q")
    assert answers == [ACCEPTED]


@pytest.mark.parametrize("reply", [{"action": "maybe"}, None])
async def test_a_retry_without_a_usable_answer_is_a_cancel(reply: Any) -> None:
    parked = ParkedCall(entry=None, server="fs")
    answers: list[types.ElicitResult] = []

    async def downstream() -> None:
        answers.append(await parked.ask(QUESTION))

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(downstream)
            await parked.next_event()
            parked.answer({"q": reply} if reply is not None else {}, "q")
    assert [a.action for a in answers] == ["cancel"]


async def test_a_parked_calls_result_is_the_next_event() -> None:
    parked = ParkedCall(entry=None, server="fs")
    done = types.CallToolResult(content=[types.TextContent(type="text", text="done")])
    parked.finish(done)
    with anyio.fail_after(5):
        assert await parked.next_event() == done


async def test_a_parked_call_is_redeemed_once_and_only_by_the_call_it_was_parked_for() -> None:
    calls = ParkedCalls()
    parked = ParkedCall(entry=None, server="fs")
    state = calls.park(parked, "fs__read", {"path": "a"})
    with pytest.raises(StateRejected, match="request_state belongs to a different call"):
        calls.redeem(state, "fs__read", {"path": "b"})
    with pytest.raises(StateRejected, match="request_state does not verify"):
        calls.redeem(state[:-4] + "0000", "fs__read", {"path": "a"})
    assert calls.redeem(state, "fs__read", {"path": "a"}) is parked
    with pytest.raises(StateRejected, match="request_state was already used"):
        calls.redeem(state, "fs__read", {"path": "a"})


async def test_parked_calls_are_bounded_and_the_oldest_is_cancelled_to_make_room() -> None:
    calls = ParkedCalls()
    first = ParkedCall(entry=None, server="fs")
    oldest = calls.park(first, "fs__read", None)
    for _ in range(MAX_PARKED):
        calls.park(ParkedCall(entry=None, server="fs"), "fs__read", None)
    assert first.scope.cancel_called
    with pytest.raises(StateRejected, match="already used"):
        calls.redeem(oldest, "fs__read", None)


def test_a_sealed_state_past_its_time_is_refused() -> None:
    sealer = Sealer("x.")
    with pytest.raises(StateRejected, match="has expired"):
        sealer.open(sealer.seal("fs__read", None, -1), "fs__read", None)
    assert sealer.open(sealer.seal("fs__read", None, 60, id="a"), "fs__read", None)["id"] == "a"
