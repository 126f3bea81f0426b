"""`Approvals.decide` turns an `ask` into allow or deny: from what is remembered, through the
client's form (handshake era), a sealed InputRequiredResult (2026-07-28), or the CLI.

The client's session is a stand-in that says whether it can elicit and answers in turn."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anyio
import mcp.types as types
import pytest

from cellblock.gateway.ask.forms import MAX_VALUE, SHOW_FULL
from cellblock.gateway.audit.log import Audit
from cellblock.gateway.serve.approvals import APPROVAL_KEY, Approvals, NeedsInput
from cellblock.gateway.serve.pending import MAX_PENDING, OnceOnly
from cellblock.gateway.serve.pipeline import Asking, Call
from cellblock.policy.types import Decision, Verdict

pytestmark = pytest.mark.anyio

ASK = Verdict(Decision.ASK, "rules.echo", "needs approval")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def answer(decision: str, action: str = "accept") -> types.ElicitResult:
    return types.ElicitResult(action=action, content={"decision": decision} if action == "accept" else None)


class Session:
    """The client's session as `Approvals` uses it. Each form gets the next answer: a result, an
    exception the client's request failed with, or None for a human who never answers."""

    def __init__(self, *answers: types.ElicitResult | Exception | None, elicits: bool = True) -> None:
        self.answers = list(answers)
        self.elicits = elicits
        self.forms: list[str] = []

    @property
    def client_capabilities(self) -> types.ClientCapabilities | None:
        return types.ClientCapabilities(elicitation=types.ElicitationCapability()) if self.elicits else None

    async def elicit_form(self, message: str, requested_schema: Any, related_request_id: Any = None) -> Any:
        self.forms.append(message)
        reply = self.answers.pop(0)
        if reply is None:
            await anyio.sleep_forever()
        if isinstance(reply, Exception):
            raise reply
        return reply


def approvals(state: Path, timeout: float = 5) -> Approvals:
    return Approvals(state, Audit(state / "audit.jsonl"), timeout)


def events(state: Path) -> list[str]:
    return [json.loads(line)["event"] for line in (state / "audit.jsonl").read_text().splitlines()]


async def decide(
    approvals: Approvals, ctx: Asking | None = None, arguments: dict[str, Any] | None = None, **extra: Any
) -> Verdict:
    call = Call("p__echo", arguments or {"message": "hi"}, "p", "echo", ctx=ctx, **extra)
    return await approvals.decide("p", "echo", call.name, ASK, call)


def asking(session: Session, modern: bool = False, tell: Any = None) -> Asking:
    return Asking(session, request_id=7, modern=modern, tell=tell)


# -- the client's form (handshake era) --------------------------------------------------------


@pytest.mark.parametrize(
    ("reply", "allowed", "why"),
    [
        (answer("allow_once"), True, "approved by the user"),
        (answer("deny"), False, "the user denied it"),
        (answer("allow_once", action="decline"), False, "the user answered 'decline'"),
        (RuntimeError("no UI"), False, "the client could not ask (no UI)"),
    ],
)
async def test_the_humans_answer_on_the_form_decides(
    tmp_path: Path, reply: types.ElicitResult | Exception, allowed: bool, why: str
) -> None:
    session = Session(reply)
    verdict = await decide(approvals(tmp_path), asking(session))
    assert (verdict.decision is Decision.ALLOW) is allowed and why in verdict.reason
    assert len(session.forms) == 1 and "server 'p'" in session.forms[0]
    assert events(tmp_path)[0] == "approval_asked"
    assert events(tmp_path)[-1] == ("approval_granted" if allowed else "approval_denied")


async def test_a_share_answered_with_a_calls_choice_is_refused_saying_what_was_asked_and_what_answers_it(
    tmp_path: Path,
) -> None:
    session = Session(answer("allow_once"))  # a client that answers every form as a call's
    call = Call("p__echo", {"path": "/h/x"}, "p", "echo", ctx=asking(session), kind="share")
    verdict = await approvals(tmp_path).decide("p", "read_write:/h/x", call.name, ASK, call)
    assert verdict.decision is Decision.DENY
    assert verdict.reason.startswith("sharing /h/x (read-write) of server 'p' needs the user's approval")
    assert "the answer 'allow_once' is none of this question's (share_once, share_always)" in verdict.reason


async def test_a_human_who_does_not_answer_in_time_is_a_refusal(tmp_path: Path) -> None:
    verdict = await decide(approvals(tmp_path, timeout=0.05), asking(Session(None)))
    assert verdict.decision is Decision.DENY and "no answer within 0.05s" in verdict.reason
    assert events(tmp_path) == ["approval_asked", "approval_timeout"]


async def test_a_long_argument_is_shown_cut_and_in_full_when_the_human_asks(tmp_path: Path) -> None:
    long = "x" * (MAX_VALUE * 40)
    session = Session(answer(SHOW_FULL), answer("allow_once"))
    verdict = await decide(approvals(tmp_path), asking(session), {"message": long})
    assert verdict.decision is Decision.ALLOW
    cut, full = session.forms
    assert long not in cut and long in full


async def test_a_session_approval_is_remembered_for_that_tool_only(tmp_path: Path) -> None:
    remembered = approvals(tmp_path, timeout=0.05)
    assert (await decide(remembered, asking(Session(answer("allow_session"))))).rule == "approval:session"
    again = await decide(remembered, asking(Session()))  # no answer left: it must not be asked
    assert again.decision is Decision.ALLOW and again.rule == "approval:session"
    other = Call("p__slow", None, "p", "slow", ctx=asking(Session(None)))
    assert (await remembered.decide("p", "slow", other.name, ASK, other)).decision is Decision.DENY
    assert not (tmp_path / "approvals.json").exists()


async def test_an_always_approval_outlives_the_gateway_until_it_is_revoked(tmp_path: Path) -> None:
    assert (await decide(approvals(tmp_path), asking(Session(answer("allow_always"))))).rule == "approval:always"
    later = approvals(tmp_path, timeout=0.05)  # the next start reads approvals.json
    assert (await decide(later, asking(Session()))).rule == "approval:always"
    assert later.revoke("p", "echo") == [("tool", "echo")]
    assert (await decide(later, asking(Session(None)))).decision is Decision.DENY


def test_forget_drops_the_session_and_retry_grants_of_what_is_revoked_and_nothing_else(tmp_path: Path) -> None:
    approvals_ = approvals(tmp_path)
    approvals_.session |= {("p", "tool", "echo"), ("p", "tool", "slow"), ("q", "tool", "echo")}
    approvals_.session.add(("p", "prompt", "prompt:echo"))  # the prompt is not the tool
    approvals_.queue.once[("p", "tool", "echo", "digest")] = time.time() + 60
    assert approvals_.forget("p", "echo") == [("tool", "echo", "session"), ("tool", "echo", "once")]
    assert approvals_.session == {("p", "tool", "slow"), ("q", "tool", "echo"), ("p", "prompt", "prompt:echo")}
    assert approvals_.queue.once == {}
    assert approvals_.forget("p", "echo", "prompt") == [("prompt", "prompt:echo", "session")]
    assert approvals_.forget("p", None) == [("tool", "slow", "session")] and approvals_.forget("p", None) == []
    revoked = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert [(e["tool"], e["scope"]) for e in revoked if e["event"] == "approval_revoked"] == [
        ("echo", "session"),
        ("echo", "once"),
        ("prompt:echo", "session"),
        ("slow", "session"),
    ]


# -- a sealed question (2026-07-28) -----------------------------------------------------------


async def test_a_2026_client_gets_a_sealed_question_whose_state_redeems_once_for_that_call_only(tmp_path: Path) -> None:
    approvals_ = approvals(tmp_path)
    with pytest.raises(NeedsInput) as asked:
        await decide(approvals_, asking(Session(), modern=True))
    result = asked.value.result
    assert list(result.input_requests) == [APPROVAL_KEY] and result.request_state
    state = result.request_state
    assert (
        approvals_.sealed.redeem(state, "p__echo", {"message": "other"})
        == "the approval state belongs to a different call"
    )
    assert (
        approvals_.sealed.redeem(state[:-4] + "0000", "p__echo", {"message": "hi"})
        == "the approval state does not verify"
    )
    assert approvals_.sealed.redeem(state, "p__echo", {"message": "hi"}) is None
    assert approvals_.sealed.redeem(state, "p__echo", {"message": "hi"}) == "the approval state was already used"
    # the retry carries the human's answer, the way the gateway takes it: bound to the question its form asked
    with pytest.raises(NeedsInput) as again:
        await decide(approvals_, asking(Session(), modern=True))
    retry = Call("p__echo", {"message": "hi"}, "p", "echo", ctx=asking(Session(), modern=True))
    reply = {APPROVAL_KEY: answer("allow_once").model_dump(by_alias=True)}
    assert approvals_.sealed.carried(retry, again.value.result.request_state, reply) is None
    assert retry.answered == "tool:echo"
    verdict = await approvals_.decide("p", "echo", retry.name, ASK, retry)
    assert verdict.decision is Decision.ALLOW and verdict.rule == "approval:once"


def test_a_state_lives_as_long_as_the_approval_timeout(tmp_path: Path) -> None:
    lapsed = approvals(tmp_path, timeout=-1)  # sealed already past its lifetime: no clock to wait for
    state = lapsed.sealed.seal("p__echo", {"message": "hi"})
    assert lapsed.sealed.redeem(state, "p__echo", {"message": "hi"}) == "the approval state has expired"


async def test_a_state_sealed_by_another_gateway_does_not_verify(tmp_path: Path) -> None:
    state = approvals(tmp_path).sealed.seal("p__echo", {"message": "hi"})
    assert (
        approvals(tmp_path).sealed.redeem(state, "p__echo", {"message": "hi"}) == "the approval state does not verify"
    )


# -- the CLI (a client that cannot ask) -------------------------------------------------------


class Told:
    """What the waiting call tells the client; the pending approval's id is in it."""

    def __init__(self) -> None:
        self.ids: list[str] = []
        self.arrived = anyio.Event()

    async def __call__(self, message: str) -> None:
        self.ids += re.findall(r"cellblock approve (\w+)", message)
        self.arrived.set()

    async def id(self) -> str:
        with anyio.fail_after(5):
            await self.arrived.wait()
        return self.ids[-1]


@pytest.mark.parametrize(
    ("scope", "allowed", "via"),
    [("once", True, "cli"), ("session", True, "dashboard"), (None, False, "cli"), (None, False, "dashboard")],
)
async def test_a_call_waits_for_the_answer_from_the_cli(
    tmp_path: Path, scope: str | None, allowed: bool, via: str
) -> None:
    approvals_, told = approvals(tmp_path, timeout=30), Told()
    verdicts: list[Verdict] = []

    async def call() -> None:
        verdicts.append(await decide(approvals_, asking(Session(elicits=False), tell=told)))

    async with anyio.create_task_group() as tg:
        tg.start_soon(call)
        ident = await told.id()
        assert [item["id"] for item in approvals_.listing()] == [ident]
        assert await approvals_.answer(ident, scope, via)
    [verdict] = verdicts
    assert (verdict.decision is Decision.ALLOW) is allowed
    # the reason and the answer's audit event say where it was given (the CLI, or the dashboard)
    said = {"cli": "the CLI", "dashboard": "the dashboard"}[via]
    assert f"{'approved' if allowed else 'denied'} from {said} (" in verdict.reason
    written = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    answered = [e for e in written if e["event"] in ("approval_granted", "approval_denied") and e.get("id") == ident]
    assert [e["via"] for e in answered] == [via]
    assert approvals_.pending == {} and not await approvals_.answer(ident, scope)  # answered once


async def test_a_request_for_the_clients_model_is_allowed_from_the_cli_once_never_for_good(tmp_path: Path) -> None:
    approvals_ = approvals(tmp_path, timeout=30)
    text = types.TextContent(type="text", text="summarize")
    params = types.CreateMessageRequestParams(messages=[types.SamplingMessage(role="user", content=text)], max_tokens=9)
    refusals: list[str | None] = []

    async def sample() -> None:
        refusals.append(await approvals_.sampling("p", params, SimpleNamespace(can_elicit=False, asker=None)))

    async with anyio.create_task_group() as tg:
        tg.start_soon(sample)
        await anyio.wait_all_tasks_blocked()
        [ident] = approvals_.pending
        for scope in ("session", "always"):
            with pytest.raises(
                OnceOnly, match=f"it can be allowed once, not --{scope}; run 'cellblock approve {ident}'"
            ):
                await approvals_.answer(ident, scope)
        assert list(approvals_.pending) == [ident]  # still asked
        assert await approvals_.answer(ident, "once")
    assert refusals == [None]
    assert approvals_.session == set() and approvals_.always() == {}  # nothing said to be kept is kept
    granted = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert [e["scope"] for e in granted if e["event"] == "approval_granted"] == ["once"]


async def test_an_approval_from_the_cli_after_the_call_gave_up_lets_its_retry_through_once(tmp_path: Path) -> None:
    approvals_ = approvals(tmp_path, timeout=0.05)
    refused = await decide(approvals_, asking(Session(elicits=False)))
    [ident] = re.findall(r"cellblock approve (\w+)", refused.reason)[:1]
    assert refused.decision is Decision.DENY
    assert await approvals_.answer(ident, "once")
    assert (await decide(approvals_, asking(Session(elicits=False)), {"message": "other"})).decision is Decision.DENY
    assert (await decide(approvals_)).rule == "approval:once"
    assert (await decide(approvals_)).decision is Decision.DENY  # once


async def test_pending_approvals_are_bounded(tmp_path: Path) -> None:
    approvals_ = approvals(tmp_path, timeout=30)
    told = Told()
    async with anyio.create_task_group() as tg:
        for n in range(MAX_PENDING):
            tg.start_soon(decide, approvals_, asking(Session(elicits=False), tell=told), {"n": n})
        with anyio.fail_after(10):
            while len(told.ids) < MAX_PENDING:
                told.arrived = anyio.Event()
                await told.arrived.wait()
        one_more = await decide(approvals_, asking(Session(elicits=False)), {"n": MAX_PENDING})
        assert one_more.decision is Decision.DENY and "too many approvals are pending" in one_more.reason
        tg.cancel_scope.cancel()


# -- a share of a path (serve/shares.py) ------------------------------------------------------


async def share(approvals: Approvals, ctx: Asking, human: types.ElicitResult | None = None) -> Verdict:
    call = Call("p__save", {"path": "~/notes/x"}, "p", "save", ctx=ctx, kind="share", human=human)
    return await approvals.decide("p", "read_write:/home/u/notes", call.name, Verdict(Decision.ASK, "save", ""), call)


@pytest.mark.parametrize(("reply", "allowed"), [("share_once", True), ("allow_once", False), ("allow_always", False)])
async def test_a_share_is_granted_only_by_an_answer_to_a_share(tmp_path: Path, reply: str, allowed: bool) -> None:
    session = Session(answer(reply))
    verdict = await share(approvals(tmp_path), asking(session))
    assert (verdict.decision is Decision.ALLOW) is allowed, verdict
    assert 'share read-write "/home/u/notes"' in session.forms[0] and "save" in session.forms[0]


async def test_an_answer_to_a_share_never_approves_a_call(tmp_path: Path) -> None:
    verdict = await decide(approvals(tmp_path), asking(Session(answer("share_always"))))
    assert verdict.decision is Decision.DENY


async def test_a_shares_always_goes_to_its_keeper_never_to_the_approvals_file(tmp_path: Path) -> None:
    kept: list[tuple[str, str]] = []
    gate = approvals(tmp_path)

    async def keeper(server: str, key: str) -> None:
        kept.append((server, key))

    gate.keepers["share"] = keeper
    verdict = await share(gate, asking(Session(answer("share_always"))))
    assert verdict.decision is Decision.ALLOW and verdict.rule == "approval:always"
    assert kept == [("p", "read_write:/home/u/notes")]
    assert not (tmp_path / "approvals.json").exists()


async def test_a_share_pending_in_the_cli_is_never_granted_for_the_session(tmp_path: Path) -> None:
    gate = approvals(tmp_path, timeout=30)
    async with anyio.create_task_group() as tg:
        tg.start_soon(share, gate, asking(Session(elicits=False)))
        await anyio.wait_all_tasks_blocked()
        [ident] = list(gate.pending)
        with pytest.raises(OnceOnly, match="not --session"):
            await gate.answer(ident, "session")
        assert await gate.answer(ident, "once")
