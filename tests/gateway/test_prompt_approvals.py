"""Remembered approvals of prompts and resources: they cover the item, never a look-alike tool."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cellblock.gateway.approvals import Approvals
from cellblock.gateway.audit import Audit
from cellblock.gateway.pipeline import Call
from cellblock.policy.types import Decision, Verdict

pytestmark = pytest.mark.anyio

ASK = Verdict(Decision.ASK, "default", "needs approval")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def approvals(tmp_path: Path) -> Approvals:
    # no client to ask and a short wait: whatever is not remembered is refused at once
    approvals = Approvals(tmp_path, Audit(tmp_path / "audit.jsonl"), timeout=0.05)
    approvals.remember("p", "prompt:greet")
    return approvals


async def test_an_always_approved_prompt_is_allowed_without_asking(tmp_path: Path) -> None:
    call = Call("prompt:p__greet", None, "p", "prompt:greet", kind="prompt")
    verdict = await approvals(tmp_path).decide("p", "prompt:greet", call.name, ASK, call)
    assert verdict.decision is Decision.ALLOW and verdict.rule == "approval:always"


async def test_a_tool_named_like_the_approved_prompt_is_asked_not_let_through(tmp_path: Path) -> None:
    call = Call("p__prompt_greet", None, "p", "prompt:greet")  # a server's tool whose own name is "prompt:greet"
    verdict = await approvals(tmp_path).decide("p", "prompt:greet", call.name, ASK, call)
    assert verdict.decision is Decision.DENY and "needs the user's approval" in verdict.reason
    asked = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert [e["event"] for e in asked] == ["approval_asked", "approval_timeout"]
