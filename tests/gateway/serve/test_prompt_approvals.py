"""Remembered approvals are keyed by kind: a prompt's or resource's covers the item, never a
look-alike tool named `prompt:greet` or `resource:h://index`, and the other way round."""

from __future__ import annotations

import json
from pathlib import Path

import mcp.types as types
import pytest

from cellblock.gateway.audit.log import Audit
from cellblock.gateway.serve.approvals import Approvals
from cellblock.gateway.serve.pipeline import Call
from cellblock.policy.types import Decision, Verdict

pytestmark = pytest.mark.anyio

ASK = Verdict(Decision.ASK, "default", "needs approval")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def approvals(tmp_path: Path) -> Approvals:
    # no client to ask and a short wait: whatever is not remembered is refused at once
    approvals = Approvals(tmp_path, Audit(tmp_path / "audit.jsonl"), timeout=0.05)
    await approvals.remember("p", "prompt:greet", "prompt")
    return approvals


async def test_an_always_approved_prompt_is_allowed_without_asking(tmp_path: Path) -> None:
    call = Call("prompt:p__greet", None, "p", "prompt:greet", kind="prompt")
    verdict = await (await approvals(tmp_path)).decide("p", "prompt:greet", call.name, ASK, call)
    assert verdict.decision is Decision.ALLOW and verdict.rule == "approval:always"


async def test_a_tool_named_like_the_approved_prompt_is_asked_not_let_through(tmp_path: Path) -> None:
    call = Call("p__prompt_greet", None, "p", "prompt:greet")  # a server's tool whose own name is "prompt:greet"
    verdict = await (await approvals(tmp_path)).decide("p", "prompt:greet", call.name, ASK, call)
    assert verdict.decision is Decision.DENY and "needs the user's approval" in verdict.reason
    asked = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert [e["event"] for e in asked] == ["approval_asked", "approval_timeout"]


PROMPT = Call("prompt:p__greet", {"name": "x"}, "p", "prompt:greet", kind="prompt")
RESOURCE = Call("resource:cellblock://p/h://index", None, "p", "resource:h://index", kind="resource")
TOOL_LIKE_PROMPT = Call("p__prompt_greet", {"name": "x"}, "p", "prompt:greet")  # the server's own tool name
TOOL_LIKE_RESOURCE = Call("p__resource_h___index", None, "p", "resource:h://index")


async def decide(approvals: Approvals, call: Call, human: types.ElicitResult | None = None) -> Verdict:
    # the answer, as a retry carries it, to the form of this very question
    answered = f"{call.kind}:{call.tool}"
    asked = Call(call.name, call.arguments, call.server, call.tool, kind=call.kind, human=human, answered=answered)
    return await approvals.decide(call.server, call.tool, call.name, ASK, asked)


def answer(decision: str) -> types.ElicitResult:
    return types.ElicitResult(action="accept", content={"decision": decision})


async def test_a_late_cli_approval_of_a_prompt_lets_that_prompt_through_once_and_not_the_lookalike_tool(
    tmp_path: Path,
) -> None:
    approvals = Approvals(tmp_path, Audit(tmp_path / "audit.jsonl"), timeout=0.05)
    assert (await decide(approvals, PROMPT)).decision is Decision.DENY  # timed out, pending
    [ident] = [e["id"] for e in map(json.loads, (tmp_path / "audit.jsonl").read_text().splitlines()) if "id" in e][:1]
    assert await approvals.answer(ident, "once")
    # the same server, the same spelled name, the same arguments: only the kind differs
    assert (await decide(approvals, TOOL_LIKE_PROMPT)).decision is Decision.DENY
    # control: the prompt itself, retried, is let through once
    retried = await decide(approvals, PROMPT)
    assert retried.decision is Decision.ALLOW and retried.rule == "approval:once"


@pytest.mark.parametrize("scope", ["allow_session", "allow_always"])
@pytest.mark.parametrize(("tool", "item"), [(TOOL_LIKE_PROMPT, PROMPT), (TOOL_LIKE_RESOURCE, RESOURCE)])
async def test_approving_a_lookalike_tool_does_not_approve_the_prompt_or_resource(
    tmp_path: Path, scope: str, tool: Call, item: Call
) -> None:
    approvals = Approvals(tmp_path, Audit(tmp_path / "audit.jsonl"), timeout=0.05)
    assert (await decide(approvals, tool, answer(scope))).decision is Decision.ALLOW
    refused = await decide(approvals, item)
    assert refused.decision is Decision.DENY and f"{item.kind} " in refused.reason
    # control: the approved tool itself is remembered
    remembered = await decide(approvals, tool)
    assert remembered.decision is Decision.ALLOW and remembered.rule == f"approval:{scope.removeprefix('allow_')}"
    # and the other way round: the item's approval does not cover the tool
    other = Approvals(tmp_path / "other", Audit(tmp_path / "other.jsonl"), timeout=0.05)
    (tmp_path / "other").mkdir()
    assert (await decide(other, item, answer(scope))).decision is Decision.ALLOW
    assert (await decide(other, tool)).decision is Decision.DENY
    assert (await decide(other, item)).decision is Decision.ALLOW


async def test_an_approvals_file_of_version_1_keeps_its_tool_and_prompt_grants(tmp_path: Path) -> None:
    (tmp_path / "approvals.json").write_text(json.dumps({"version": 1, "always": {"p": ["echo", "prompt:greet"]}}))
    approvals = Approvals(tmp_path, Audit(tmp_path / "audit.jsonl"), timeout=0.05)
    echo = Call("p__echo", None, "p", "echo")
    assert (await decide(approvals, echo)).rule == "approval:always"
    assert (await decide(approvals, PROMPT)).rule == "approval:always"  # what "prompt:greet" granted then
    assert (await decide(approvals, TOOL_LIKE_PROMPT)).decision is Decision.DENY
    await approvals.remember("p", "resource:h://index", "resource")  # the next write is version 2
    stored = json.loads((tmp_path / "approvals.json").read_text())
    assert stored == {
        "version": 2,
        "always": {"p": ["echo"]},
        "items": {"p": {"prompt": ["greet"], "resource": ["h://index"]}},
    }
    again = Approvals(tmp_path, Audit(tmp_path / "audit.jsonl"), timeout=0.05)
    assert (await decide(again, echo)).rule == "approval:always"
    assert (await decide(again, PROMPT)).rule == "approval:always"
    assert (await decide(again, RESOURCE)).rule == "approval:always"


async def test_a_version_2_tool_named_like_a_prompt_stays_a_tool_and_revoke_tells_them_apart(tmp_path: Path) -> None:
    approvals = Approvals(tmp_path, Audit(tmp_path / "audit.jsonl"), timeout=0.05)
    await approvals.remember("p", "prompt:greet")  # the look-alike tool
    await approvals.remember("p", "prompt:greet", "prompt")
    reread = Approvals(tmp_path, Audit(tmp_path / "audit.jsonl"), timeout=0.05)
    assert (await decide(reread, TOOL_LIKE_PROMPT)).rule == "approval:always"
    assert reread.revoke("p", "greet", "prompt") == [("prompt", "prompt:greet")]
    assert (await decide(reread, PROMPT)).decision is Decision.DENY
    assert (await decide(reread, TOOL_LIKE_PROMPT)).rule == "approval:always"  # the tool's grant is its own
    assert reread.revoke("p", "prompt:greet") == [("tool", "prompt:greet")]
    revoked = [e for e in map(json.loads, (tmp_path / "audit.jsonl").read_text().splitlines())]
    revoked = [e for e in revoked if e["event"] == "approval_revoked"]
    assert [(e["tool"], e.get("kind")) for e in revoked] == [("prompt:greet", "prompt"), ("prompt:greet", None)]
