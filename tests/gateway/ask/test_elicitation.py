"""A downstream server's question reaches the client framed as that server's: asked at once in the
handshake era (`DirectAsker`), or parked until the client's retry on 2026-07-28 (the call parked
is tested in test_calls.py), whose sealed state names the waiting call and redeems once
(`ParkedCalls`, `Sealer`)."""

from __future__ import annotations

from typing import Any

import mcp.types as types
import pytest

from cellblock.gateway.ask.elicitation import (
    MAX_PARKED,
    DirectAsker,
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


class Parked:
    """A parked call as `ParkedCalls` sees it."""

    expired = False

    def expire(self) -> None:
        self.expired = True


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


async def test_a_parked_call_is_redeemed_once_and_only_by_the_call_it_was_parked_for() -> None:
    calls = ParkedCalls()
    parked = Parked()
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
    first = Parked()
    oldest = calls.park(first, "fs__read", None)
    for _ in range(MAX_PARKED):
        calls.park(Parked(), "fs__read", None)
    assert first.expired
    with pytest.raises(StateRejected, match="already used"):
        calls.redeem(oldest, "fs__read", None)


def test_a_sealed_state_past_its_time_is_refused() -> None:
    sealer = Sealer("x.")
    with pytest.raises(StateRejected, match="has expired"):
        sealer.open(sealer.seal("fs__read", None, -1), "fs__read", None)
    assert sealer.open(sealer.seal("fs__read", None, 60, id="a"), "fs__read", None)["id"] == "a"
