"""One tool call's lifecycle (`serve/calls.ToolCall`), with a fake server and a fake client request:
its rounds, its states, its end (audited), a question parked for a
2026-07-28 client and resumed by the retry, and cancellation."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import mcp.types as types
import pytest
from mcp.shared.exceptions import MCPError

from cellblock.gateway.ask.elicitation import Asker, ParkedCalls
from cellblock.gateway.audit.log import Audit
from cellblock.gateway.config.model import LocalServer
from cellblock.gateway.credentials import CredentialError
from cellblock.gateway.downstream.keys import ServerKeys
from cellblock.gateway.downstream.questions import Questions
from cellblock.gateway.downstream.rounds import Caller, failed_result, owner_of
from cellblock.gateway.namespacing import UriTable
from cellblock.gateway.serve.calls import INPUT_KEY, Calls, CallState, ToolCall
from cellblock.gateway.serve.catalog import Catalog
from cellblock.gateway.serve.handshake_tasks import HandshakeTaskReply
from cellblock.gateway.serve.pipeline import Call, Pipeline
from cellblock.gateway.serve.tasks import Task
from cellblock.policy.types import Decision, Verdict

pytestmark = pytest.mark.anyio

QUESTION = types.ElicitRequestFormParams(message="Your name?", requested_schema={"type": "object", "properties": {}})
OK = {"content": [{"type": "text", "text": "done"}]}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Round:
    def __init__(self) -> None:
        self.cancelled: str | None = None

    def cancel(self, reason: str) -> None:
        self.cancelled = reason


class Changes:
    def __init__(self) -> None:
        self.told = 0

    def soon(self) -> None:
        self.told += 1


class MockTarget:
    """A server as a call sees it (`downstream/target.Target`): its rounds kept for the test to
    answer, its questions the gateway's own (`downstream/questions.Questions`)."""

    name = "fs"
    needs_login = False

    def __init__(self) -> None:
        config = LocalServer(command="server")
        self.sent: list[tuple[dict[str, Any], Any, Round]] = []
        self.in_flight: list[Caller] = []
        self.audit: Audit | None = None  # where the events about this server go
        self.changes = Changes()
        self.questions = Questions(
            self.name, config, "deny", None, self.event, ServerKeys(self.name, config, None, False), self.owner
        )

    def event(self, event: str, **fields: Any) -> None:
        if self.audit is not None:
            self.audit.write(event, self.name, **fields)

    def owner(self) -> Caller | None:
        return owner_of(self.in_flight)

    async def ready_client(self) -> object:
        return self

    async def login_through_client(self, asker: Asker) -> None:
        raise CredentialError("this server has no login")

    def track(self, caller: Caller) -> None:
        self.in_flight.append(caller)

    def untrack(self, caller: Caller) -> None:
        if caller in self.in_flight:
            self.in_flight.remove(caller)

    def send_call(self, params: dict[str, Any], answered: Any, progress: Any, logs: bool = True) -> Round:
        sent = Round()
        self.sent.append((params, answered, sent))
        return sent

    def failed_call(self, tool: str, exc: BaseException) -> types.CallToolResult:
        return failed_result(self.name, tool, 5.0, exc, None)


class Reply:
    """The client's request: what it was answered with, in order."""

    def __init__(self, modern: bool, direct: Any = None) -> None:
        self.modern = modern
        self.retried = True
        self.can_elicit, self.can_elicit_url, self.can_sample = True, False, True  # a form, the model
        self.wants_progress = self.carries_logs = True
        self.direct = direct
        self.events: list[Any] = []
        self.asked = anyio.Event()  # answered with a question

    def progress(self, value: float, total: float | None, message: str | None) -> None:
        self.events.append(("progress", value, message))

    def log(self, params: types.LoggingMessageNotificationParams) -> None:
        self.events.append(("log", params.data))

    def shape(self, result: dict[str, Any]) -> Any:
        return types.CallToolResult.model_validate(result, by_name=False)

    def answer(self, shaped: Any) -> None:
        self.events.append(("answer", shaped))

    def ask(self, question: types.InputRequiredResult) -> None:
        self.events.append(("ask", question))
        self.asked.set()


class User:
    """A handshake client's user, asked within the request (`Reply.direct`): each question waits
    until the test answers it."""

    def __init__(self) -> None:
        self.questions: list[tuple[str, anyio.Event, list[types.ElicitResult]]] = []
        self.new = anyio.Event()

    async def elicit(self, server: str, params: types.ElicitRequestParams) -> types.ElicitResult:
        return await self.ask(params)

    async def ask(self, params: types.ElicitRequestParams) -> types.ElicitResult:
        answered: list[types.ElicitResult] = []
        self.questions.append((params.message, done := anyio.Event(), answered))
        self.new.set()
        await done.wait()
        return answered[0]

    async def sample(self, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
        raise NotImplementedError

    async def asked(self, count: int) -> None:
        with anyio.fail_after(5):
            while len(self.questions) < count:
                self.new = anyio.Event()
                await self.new.wait()

    def answer(self, index: int, name: str) -> None:
        _, done, answered = self.questions[index]
        answered.append(types.ElicitResult(action="accept", content={"name": name}))
        done.set()


@pytest.fixture
async def shared(tmp_path: Path) -> AsyncIterator[tuple[Calls, Audit]]:
    audit = Audit(tmp_path / "audit.jsonl")
    pipeline = Pipeline(Catalog, lambda name: None, {}, audit, approver=_never)
    async with anyio.create_task_group() as tg:
        yield Calls(pipeline, ParkedCalls(), lambda: None, lambda: tg, UriTable, lambda *page: True), audit
        tg.cancel_scope.cancel()


async def _never(call: Call) -> Verdict:
    return Verdict(Decision.DENY, "test", "")


def admitted() -> Call:
    return Call("fs__read", {"path": "a"}, "fs", "read")


def audited(audit: Audit) -> list[str]:
    return [line for line in audit.path.read_text().splitlines() if '"call_end"' in line]


def sent(calls: Calls, reply: Reply) -> tuple[MockTarget, ToolCall, Reply]:
    """A call on a fake server, its first round sent; the server, the call, and `reply`."""
    ds = MockTarget()
    tc = ToolCall(admitted(), ds, reply, calls, {"name": "read"})
    tc.send()
    return ds, tc, reply


async def asks(ds: MockTarget, answers: dict[str, types.ElicitResult], text: str) -> None:
    """The server asks `text` during its call (as its session's elicitation callback does); the
    answer into `answers`."""
    answers[text] = await ds.questions.elicit(question(text), ds.owner())


async def asked_while_parked(tg: Any, ds: MockTarget, first: Reply, answers: dict[str, types.ElicitResult]) -> None:
    """The server asks `first?`, and once the call is parked on it (`first` answered with it),
    `second?`."""
    tg.start_soon(asks, ds, answers, "first?")
    await first.asked.wait()
    tg.start_soon(asks, ds, answers, "second?")


def question(text: str) -> types.ElicitRequestFormParams:
    return types.ElicitRequestFormParams(message=text, requested_schema={"type": "object", "properties": {}})


async def test_a_call_is_sent_answered_and_its_end_audited(shared: Any) -> None:
    calls, audit = shared
    ds, reply = MockTarget(), Reply(modern=False)
    tc = ToolCall(admitted(), ds, reply, calls, {"name": "read", "arguments": {"path": "a"}})
    tc.send()
    [(params, answered, _)] = ds.sent
    assert params["name"] == "read" and tc.state is CallState.RUNNING and ds.owner() is tc
    tc.progress(0.5, 1.0, "half")
    answered(OK, None)
    assert tc.state is CallState.DONE and ds.owner() is None
    assert reply.events[0] == ("progress", 0.5, "half")
    assert reply.events[1][0] == "answer" and reply.events[1][1].content[0].text == "done"
    assert len(audited(audit)) == 1


async def test_a_servers_question_goes_to_the_call_its_client_waits_on_not_to_a_newer_task(shared: Any) -> None:
    """Over the handshake a server's question names no call (`rounds.owner_of`). With a call in
    flight and a task started after it on the same server, the question goes to the call, whose
    client is asked at once; put to the newer task, it would wait for a tasks/result that a client
    waiting on the call need not send, and the call with it."""
    calls, _ = shared
    ds, user = MockTarget(), User()
    call = ToolCall(admitted(), ds, Reply(modern=False, direct=user), calls, {"name": "read"})
    # a handshake-era client's task: its questions wait for the client's tasks/result (`direct`)
    waits = User()
    reply = HandshakeTaskReply(Task("t", "fs", "read"), Reply(modern=False), waits)
    task = ToolCall(admitted(), ds, reply, calls, {"name": "read"})
    call.send()
    task.send()
    answers: dict[str, types.ElicitResult] = {}
    async with anyio.create_task_group() as tg:
        tg.start_soon(asks, ds, answers, "which?")
        await user.asked(1)
        user.answer(0, "Ada")
    assert answers["which?"].content == {"name": "Ada"} and waits.questions == []
    # the task's own questions are still its own once the call has ended
    ds.sent[0][1](OK, None)
    assert ds.owner() is task


async def test_a_round_that_times_out_is_answered_with_an_error_naming_the_server(shared: Any) -> None:
    calls, _ = shared
    ds, _tc, reply = sent(calls, Reply(modern=False))
    ds.sent[0][1](None, TimeoutError())
    [(kind, result)] = reply.events
    assert kind == "answer" and result.is_error
    assert "call to 'read' on server 'fs' took longer than 5s" in result.content[0].text


async def test_a_cancelled_call_is_never_answered_and_its_round_is_stopped(shared: Any) -> None:
    calls, audit = shared
    ds, tc, reply = sent(calls, Reply(modern=False))
    tc.cancel("cancelled by the client")
    ds.sent[0][1](OK, None)  # a late answer
    assert tc.state is CallState.CANCELLED and ds.sent[0][2].cancelled == "cancelled by the client"
    assert reply.events == [] and audited(audit) == [] and ds.owner() is None


async def retried(calls: Calls, tc: ToolCall, asking: Reply, responses: Any) -> tuple[Any, Reply]:
    """Once `asking` is answered with a question (the call parked), the client's retry as the
    gateway takes it: the state redeemed, the call resumed with `responses` (the question's
    answer) on a new request. The question, and that request."""
    with anyio.fail_after(5):
        await asking.asked.wait()
    [*_, (kind, question)] = asking.events
    assert kind == "ask" and tc.state is CallState.PARKED and tc.reply is None
    assert calls.parked.redeem(question.request_state, "fs__read", {"path": "a"}) is tc
    retry = Reply(modern=True)
    tc.resume(retry, {INPUT_KEY: responses})
    return question.input_requests[INPUT_KEY], retry


# What the client answers to a server's two questions, one retry after the other.
IN_TURN = {"first?": {"name": "ada"}, "second?": {"name": "bob"}}


async def answered_in_turn(calls: Calls, tc: ToolCall, first: Reply) -> tuple[Reply, Reply]:
    """The client's two retries of a parked call, answering `first?` then `second?` as IN_TURN
    has it; the two retries' requests."""
    one, retry = await retried(calls, tc, first, accepted("ada"))
    two, last = await retried(calls, tc, retry, accepted("bob"))
    assert "first?" in one.params.message and "second?" in two.params.message
    return retry, last


def accepted(name: str) -> dict[str, Any]:
    return {"action": "accept", "content": {"name": name}}


@pytest.mark.parametrize(
    ("responses", "answer"),
    [
        (accepted("ada"), types.ElicitResult(action="accept", content={"name": "ada"})),
        ({"action": "maybe"}, types.ElicitResult(action="cancel")),  # a retry without a usable answer
    ],
)
async def test_a_question_for_a_modern_client_parks_the_call_and_the_retry_resumes_it(
    shared: Any, responses: Any, answer: types.ElicitResult
) -> None:
    calls, audit = shared
    ds, tc, first = sent(calls, Reply(modern=True))
    answers: list[types.ElicitResult] = []

    async def server_asks() -> None:
        answers.append(await tc.elicit("fs", QUESTION))

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(server_asks)
            request, retry = await retried(calls, tc, first, responses)
            assert request.params.message.startswith("Question from server 'fs' (not a Cellblock approval)")
    assert answers == [answer]
    assert tc.state is CallState.RUNNING  # the round goes on with the server
    ds.sent[0][1](OK, None)
    assert [kind for kind, *_ in retry.events] == ["answer"] and len(audited(audit)) == 1


async def test_a_server_that_asks_twice_in_a_row_has_each_answer_from_its_own_retry(shared: Any) -> None:
    calls, audit = shared
    ds, tc, first = sent(calls, Reply(modern=True))
    answers: dict[str, types.ElicitResult] = {}

    async def server_asks() -> None:
        for text in ("first?", "second?"):
            await asks(ds, answers, text)

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(server_asks)
            retry, last = await answered_in_turn(calls, tc, first)
    assert {text: a.content for text, a in answers.items()} == IN_TURN
    ds.sent[0][1](OK, None)
    assert [kind for kind, *_ in retry.events] == ["ask"] and [kind for kind, *_ in last.events] == ["answer"]
    assert len(audited(audit)) == 1


async def test_two_questions_at_once_reach_a_modern_client_one_retry_after_the_other(shared: Any) -> None:
    calls, _ = shared
    ds, tc, first = sent(calls, Reply(modern=True))
    answers: dict[str, types.ElicitResult] = {}
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            await asked_while_parked(tg, ds, first, answers)
            await anyio.wait_all_tasks_blocked()
            assert answers == {}  # nobody has answered either yet
            _retry, last = await answered_in_turn(calls, tc, first)
    assert {text: a.content for text, a in answers.items()} == IN_TURN
    ds.sent[0][1](OK, None)
    assert [kind for kind, *_ in last.events] == ["answer"]


async def test_questions_waiting_on_a_retry_that_never_comes_are_cancelled(
    shared: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("cellblock.gateway.serve.calls.PARK_SECONDS", 0.2)
    calls, _ = shared
    ds, _tc, first = sent(calls, Reply(modern=True))
    answers: dict[str, types.ElicitResult] = {}
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            await asked_while_parked(tg, ds, first, answers)
    assert {text: a.action for text, a in answers.items()} == {"first?": "cancel", "second?": "cancel"}
    assert [kind for kind, *_ in first.events] == ["ask"]  # the second was never put to anyone


@pytest.mark.parametrize("end", ["timeout", "crash"])
async def test_a_call_that_ends_while_parked_answers_the_retry_with_how_it_ended(shared: Any, end: str) -> None:
    """The server's round timed out (or the server went away) while the user thought: the end is
    the retry's answer, not a wait for a round that will never come."""
    calls, audit = shared
    ds, tc, first = sent(calls, Reply(modern=True))
    answers: dict[str, types.ElicitResult] = {}
    failure = TimeoutError() if end == "timeout" else MCPError(types.CONNECTION_CLOSED, "Connection closed")
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(asks, ds, answers, "first?")
            await first.asked.wait()
            ds.sent[0][1](None, failure)  # the round ends while the call is parked
            [(_, asked)] = first.events
            assert calls.parked.redeem(asked.request_state, "fs__read", {"path": "a"}) is tc
            retry = Reply(modern=True)
            tc.resume(retry, {INPUT_KEY: accepted("ada")})
    [(kind, result)] = retry.events
    assert kind == "answer" and result.is_error and "server 'fs'" in result.content[0].text
    assert tc.state is CallState.DONE and len(audited(audit)) == 1
    assert answers["first?"].action == "cancel"  # the server's question went with its round


async def test_a_sampling_request_while_parked_is_approved_by_the_client_and_sent_on_the_retry(shared: Any) -> None:
    calls, _ = shared
    ds, first = MockTarget(), Reply(modern=True)
    first.can_elicit = True
    tc = ToolCall(admitted(), ds, first, calls, {"name": "read"})
    tc.send()
    approvable: list[bool] = []

    async def approve(server: str, params: Any, entry: Any) -> str | None:
        approvable.append(entry.can_elicit)  # the approval can be asked of the client, not the CLI
        return None

    ds.questions.sampling, ds.questions.approve = "ask", approve
    sampled: list[types.CreateMessageResult] = []

    async def server_samples() -> None:
        message = types.SamplingMessage(role="user", content=types.TextContent(type="text", text="hi"))
        params = types.CreateMessageRequestParams(messages=[message], max_tokens=5)
        sampled.append(await ds.questions.sample(params, ds.owner()))

    completion = {"role": "assistant", "content": {"type": "text", "text": "hello"}, "model": "m"}
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(ds.questions.elicit, question("first?"), tc)
            await first.asked.wait()
            tg.start_soon(server_samples)
            await anyio.wait_all_tasks_blocked()
            _, retry = await retried(calls, tc, first, accepted("ada"))
            asked, _ = await retried(calls, tc, retry, completion)
    assert approvable == [True] and asked.method == "sampling/createMessage"
    assert [s.content.text for s in sampled if isinstance(s.content, types.TextContent)] == ["hello"]


async def test_two_questions_at_once_reach_a_handshake_client_together(shared: Any) -> None:
    calls, _ = shared
    user = User()
    ds, tc, reply = sent(calls, Reply(modern=False, direct=user))
    answers: dict[str, types.ElicitResult] = {}
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(asks, ds, answers, "first?")
            tg.start_soon(asks, ds, answers, "second?")
            await user.asked(2)
            assert tc.state is CallState.ASKING
            user.answer(1, "bob")  # the later question answered first
            user.answer(0, "ada")
    asked = [text.rsplit("\n", 1)[-1] for text, *_ in user.questions]
    assert answers[asked[0]].content == {"name": "ada"} and answers[asked[1]].content == {"name": "bob"}
    ds.sent[0][1](OK, None)
    assert [kind for kind, *_ in reply.events] == ["answer"]


async def test_a_server_that_asks_in_rounds_gets_the_answers_and_the_call_sent_again(shared: Any) -> None:
    calls, _ = shared
    ds, tc, _reply = sent(calls, Reply(modern=False))
    roots = types.ListRootsRequest()
    asked = {
        "resultType": "input_required",
        "inputRequests": {"r": roots.model_dump(by_alias=True)},
        "requestState": "s1",
    }
    ds.sent[0][1](asked, None)
    with anyio.fail_after(5):
        while len(ds.sent) < 2:
            await anyio.lowlevel.checkpoint()
    again = ds.sent[1][0]
    assert again["requestState"] == "s1" and again["inputResponses"] == {"r": {"roots": []}}
    assert tc.state is CallState.RUNNING


def input_round(state: str, *texts: str) -> dict[str, Any]:
    """A 2026-07-28 server's answer that asks for input: a question under each key of `texts`."""
    asked = {t: types.ElicitRequest(params=question(t)).model_dump(by_alias=True, exclude_none=True) for t in texts}
    return {"resultType": "input_required", "inputRequests": asked, "requestState": state}


async def sent_again(ds: MockTarget, count: int) -> dict[str, Any]:
    with anyio.fail_after(5):
        while len(ds.sent) < count:
            await anyio.lowlevel.checkpoint()
    params: dict[str, Any] = ds.sent[-1][0]
    return params


async def test_a_modern_servers_rounds_reach_a_modern_client_one_question_a_retry(shared: Any) -> None:
    calls, audit = shared
    ds, tc, first = sent(calls, Reply(modern=True))
    ds.sent[0][1](input_round("s1", "a?", "b?"), None)  # two questions in one round
    one, retry = await retried(calls, tc, first, accepted("ada"))
    two, again = await retried(calls, tc, retry, accepted("bob"))
    assert ["a?" in one.params.message, "b?" in two.params.message] == [True, True]
    params = await sent_again(ds, 2)
    assert params["requestState"] == "s1"
    assert params["inputResponses"] == {"a?": accepted("ada"), "b?": accepted("bob")}
    ds.sent[1][1](input_round("s2", "c?"), None)  # and a round after it
    three, last = await retried(calls, tc, again, accepted("cy"))
    params = await sent_again(ds, 3)
    assert "c?" in three.params.message and params["inputResponses"] == {"c?": accepted("cy")}
    assert params["requestState"] == "s2"
    ds.sent[2][1](OK, None)
    assert [kind for kind, *_ in last.events] == ["answer"] and len(audited(audit)) == 1


async def test_a_modern_servers_rounds_reach_a_handshake_client_within_its_request(shared: Any) -> None:
    calls, _ = shared
    user = User()
    ds, _tc, reply = sent(calls, Reply(modern=False, direct=user))
    ds.sent[0][1](input_round("s1", "a?", "b?"), None)
    for index, name in enumerate(["ada", "bob"]):
        await user.asked(index + 1)
        user.answer(index, name)
    params = await sent_again(ds, 2)
    assert params["inputResponses"] == {"a?": accepted("ada"), "b?": accepted("bob")}
    ds.sent[1][1](input_round("s2", "c?"), None)
    await user.asked(3)
    user.answer(2, "cy")
    assert (await sent_again(ds, 3))["inputResponses"] == {"c?": accepted("cy")}
    ds.sent[2][1](OK, None)
    assert [kind for kind, *_ in reply.events] == ["answer"]


class Garbled(User):
    """A handshake client that answers every question with something that is no answer (the
    wire's `request` raises ValueError for it)."""

    async def ask(self, params: types.ElicitRequestParams) -> types.ElicitResult:
        raise ValueError("1 validation error for ElicitResult")


async def test_a_handshake_clients_unusable_answer_is_a_cancel_and_the_server_goes_on(shared: Any) -> None:
    calls, _ = shared
    ds, _tc, reply = sent(calls, Reply(modern=False, direct=Garbled()))
    assert (await ds.questions.elicit(QUESTION, ds.owner())).action == "cancel"
    asked = {
        "resultType": "input_required",
        "inputRequests": {"q": types.ElicitRequest(params=QUESTION).model_dump(by_alias=True, exclude_none=True)},
        "requestState": "s1",
    }
    ds.sent[0][1](asked, None)  # a 2026-07-28 server asks the same in an input round
    with anyio.fail_after(5):
        while len(ds.sent) < 2 and not reply.events:
            await anyio.lowlevel.checkpoint()
    assert reply.events == [] and ds.sent[1][0]["inputResponses"] == {"q": {"action": "cancel"}}


class Refusing(User):
    """A handshake client that answers every question with an error."""

    async def ask(self, params: types.ElicitRequestParams) -> types.ElicitResult:
        raise MCPError(types.METHOD_NOT_FOUND, "Method not found")


async def test_a_clients_error_for_a_modern_servers_question_ends_the_call_naming_the_client(shared: Any) -> None:
    calls, _ = shared
    ds, _tc, reply = sent(calls, Reply(modern=False, direct=Refusing()))
    ds.sent[0][1](input_round("s1", "a?"), None)
    with anyio.fail_after(5):
        while not reply.events:
            await anyio.lowlevel.checkpoint()
    [(kind, result)] = reply.events
    assert kind == "answer" and result.is_error and len(ds.sent) == 1
    assert result.content[0].text == "the client did not answer the question of server 'fs': Method not found"
