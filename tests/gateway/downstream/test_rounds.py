"""A round of a call to a tool that a 2025-11-25 server runs only as a task (`rounds.TaskRound`),
with the requests it sends kept for the test to answer: the call with `task`, then `tasks/result`,
whose answer is the round's; cancelled or timed out, the server is told to cancel the task too. The real
server behind it is server-everything's `simulate-research-query` (tests/integration/test_real_peers.py)."""

from __future__ import annotations

from typing import Any

from cellblock.gateway.downstream.rounds import TaskRound

CREATED = {"task": {"taskId": "t-1", "status": "working", "createdAt": "2026-12-04T00:00:00Z", "ttl": None}}
RESULT = {
    "content": [{"type": "text", "text": "done"}],
    "_meta": {"io.modelcontextprotocol/related-task": {"taskId": "t-1"}},
}


class Sent:
    def __init__(self, method: str, params: dict[str, Any], answered: Any) -> None:
        self.method, self.params, self.answered = method, params, answered
        self.cancelled: str | None = None

    def cancel(self, reason: str) -> None:
        self.cancelled = reason


class Server:
    def __init__(self) -> None:
        self.sent: list[Sent] = []

    def send(self, method: str, params: dict[str, Any], answered: Any) -> Sent:
        self.sent.append(sent := Sent(method, params, answered))
        return sent


def started() -> tuple[Server, TaskRound, list[Any]]:
    server, told = Server(), []
    round_ = TaskRound.start(server.send, {"name": "research", "arguments": {"q": 1}}, lambda r, f: told.append((r, f)))
    return server, round_, told


def test_the_call_asks_for_a_task_and_the_tasks_result_is_the_rounds_answer() -> None:
    server, _, told = started()
    call = server.sent[0]
    assert (call.method, call.params) == ("tools/call", {"name": "research", "arguments": {"q": 1}, "task": {}})
    call.answered(CREATED, None)
    assert not told  # the task is made: its result is still to come
    result = server.sent[1]
    assert (result.method, result.params) == ("tasks/result", {"taskId": "t-1"})
    result.answered(RESULT, None)
    # the server's task id goes no further than the gateway
    assert told == [({"content": [{"type": "text", "text": "done"}]}, None)]


def test_a_server_that_answers_without_a_task_or_with_an_error_is_told_as_is() -> None:
    server, _, told = started()
    server.sent[0].answered({"content": []}, None)
    failure = ValueError("no")
    server2, _, told2 = started()
    server2.sent[0].answered(None, failure)
    assert told == [({"content": []}, None)] and told2 == [(None, failure)]
    assert len(server.sent) == len(server2.sent) == 1  # no tasks/result for a task never made


def test_a_cancelled_round_stops_the_request_and_cancels_the_task() -> None:
    server, round_, told = started()
    round_.cancel("too early")  # before the task exists: only the call is stopped
    assert server.sent[0].cancelled == "too early" and len(server.sent) == 1
    server, round_, told = started()
    server.sent[0].answered(CREATED, None)
    round_.cancel("by the client")
    assert server.sent[1].cancelled == "by the client"
    cancel = server.sent[2]
    assert (cancel.method, cancel.params) == ("tasks/cancel", {"taskId": "t-1"})
    round_.cancel("again")
    assert len(server.sent) == 3 and not told  # once; and a cancelled round is never answered


def test_a_round_that_timed_out_waiting_for_the_tasks_result_cancels_the_task() -> None:
    server, _, told = started()
    server.sent[0].answered(CREATED, None)
    timed_out = TimeoutError()
    server.sent[1].answered(None, timed_out)  # the request itself was cancelled where it timed out
    cancel = server.sent[2]
    assert (cancel.method, cancel.params) == ("tasks/cancel", {"taskId": "t-1"})
    assert told == [(None, timed_out)]
    # the control: a task that ends in an error of the server's is over already
    server, _, told = started()
    server.sent[0].answered(CREATED, None)
    server.sent[1].answered(None, ValueError("no"))
    assert len(server.sent) == 2
