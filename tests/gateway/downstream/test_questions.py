"""A server's questions during a call (`downstream/questions.py`): at most `MAX_QUESTIONS` of them
per call, forms and sampling requests together, in either era; the rest refused to the server,
the first refusal audited."""

from __future__ import annotations

import json
from typing import Any

import anyio
import mcp.types as types
import pytest

from cellblock.gateway.audit.log import Audit
from cellblock.gateway.downstream.questions import MAX_QUESTIONS
from cellblock.gateway.downstream.rounds import DownstreamError
from cellblock.gateway.serve.calls import Calls, ToolCall
from tests.gateway.serve.test_calls import OK, MockTarget, Reply, admitted, question, shared

pytestmark = pytest.mark.anyio
__all__ = ["shared"]  # the fixture, shared with the call tests

PARAMS = types.CreateMessageRequestParams(
    messages=[types.SamplingMessage(role="user", content=types.TextContent(type="text", text="hi"))], max_tokens=5
)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Answering:
    """A handshake client that answers every question and sampling request at once."""

    def __init__(self) -> None:
        self.asked = 0

    async def elicit(self, server: str, params: types.ElicitRequestParams) -> types.ElicitResult:
        return await self.ask(params)

    async def ask(self, params: types.ElicitRequestParams) -> types.ElicitResult:
        self.asked += 1
        return types.ElicitResult(action="accept", content={"name": "ada"})

    async def sample(self, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
        self.asked += 1
        return types.CreateMessageResult(role="assistant", content=types.TextContent(type="text", text="hi"), model="m")


def on_server(calls: Calls, audit: Audit, client: Answering) -> tuple[MockTarget, ToolCall]:
    ds = MockTarget()
    ds.audit, ds.questions.sampling = audit, "allow"
    tc = ToolCall(admitted(), ds, Reply(modern=False, direct=client), calls, {"name": "read"})
    tc.send()
    return ds, tc


def capped(audit: Audit) -> list[dict[str, Any]]:
    lines = (json.loads(line) for line in audit.path.read_text().splitlines())
    return [e for e in lines if e["event"] == "questions_capped"]


async def test_a_call_is_asked_at_most_the_cap_and_the_first_refusal_is_audited(shared: Any) -> None:
    calls, audit = shared
    client = Answering()
    ds, tc = on_server(calls, audit, client)
    refused: list[str] = []
    for n in range(MAX_QUESTIONS + 5):  # forms and sampling requests count together
        try:
            if n % 2:
                await ds.questions.sample(PARAMS, tc)
            else:
                await ds.questions.elicit(question(f"q{n}?"), tc)
        except DownstreamError as exc:
            refused.append(str(exc))
    assert client.asked == MAX_QUESTIONS and len(refused) == 5
    assert f"server 'fs' may ask at most {MAX_QUESTIONS} questions" in refused[0]
    [event] = capped(audit)
    assert (event["server"], event["limit"], event["what"]) == ("fs", MAX_QUESTIONS, "elicitation")
    # the SDK's callback refuses the server with the error, in words
    refusal = await ds.questions.on_elicit(None, question("more?"))  # type: ignore[arg-type]  # reason: unused
    assert isinstance(refusal, types.ErrorData) and "may ask at most" in refusal.message
    ds.sent[0][1](OK, None)  # the call still ends, and its end is recorded
    assert '"call_end"' in audit.path.read_text()
    # control: the next call has a count of its own
    _, other = on_server(calls, audit, client)
    await ds.questions.elicit(question("again?"), other)
    assert client.asked == MAX_QUESTIONS + 1 and len(capped(audit)) == 1


async def test_a_modern_servers_round_past_the_cap_ends_its_call_with_the_refusal(shared: Any) -> None:
    calls, audit = shared
    client = Answering()
    ds, tc = on_server(calls, audit, client)
    asked = {
        f"q{n}": types.ElicitRequest(params=question(f"q{n}?")).model_dump(by_alias=True, exclude_none=True)
        for n in range(MAX_QUESTIONS + 1)
    }
    ds.sent[0][1]({"resultType": "input_required", "inputRequests": asked, "requestState": "s"}, None)
    with anyio.fail_after(5):
        while not tc.reply.events:  # type: ignore[union-attr]  # reason: the call's Reply is the fake's
            await anyio.lowlevel.checkpoint()
    [(kind, result)] = tc.reply.events  # type: ignore[union-attr]  # reason: the call's Reply is the fake's
    assert kind == "answer" and result.is_error and "may ask at most" in result.content[0].text
    assert client.asked == MAX_QUESTIONS and len(ds.sent) == 1 and len(capped(audit)) == 1
