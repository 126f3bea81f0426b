"""A remote server's JSON answers are read up to max_message_size and no further."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx2
import pytest

from cellblock.gateway.downstream.remote import BoundedTransport, MessageTooLarge

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def answer(request: httpx2.Request) -> httpx2.Response:
    """A JSON string of `size` bytes, streamed as the network would give it, in chunks."""
    size = int(request.url.params["size"])
    kind = request.url.params.get("type", "application/json")

    async def body() -> AsyncIterator[bytes]:
        yield b'"'
        for start in range(0, size, 1 << 14):
            yield b"x" * min(1 << 14, size - start)
        yield b'"'

    return httpx2.Response(200, headers={"content-type": kind}, content=body())


async def test_a_json_answer_over_the_limit_stops_being_read_and_a_smaller_one_arrives_whole() -> None:
    async with httpx2.AsyncClient(transport=BoundedTransport(1 << 16, httpx2.MockTransport(answer))) as client:
        small = await client.get("http://remote.test/", params={"size": 1000})
        assert len(small.content) == 1002
        with pytest.raises(MessageTooLarge, match="larger than Cellblock accepts"):
            await client.get("http://remote.test/", params={"size": 1 << 20})
        # an event stream is the SDK's to bound, event by event (its max_sse_event_size)
        streamed = await client.get("http://remote.test/", params={"size": 1 << 20, "type": "text/event-stream"})
        assert len(streamed.content) == (1 << 20) + 2
