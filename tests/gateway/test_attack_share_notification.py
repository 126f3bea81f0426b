"""Hostile: a share's pending question is announced on the desktop as the call's own approval."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import anyio
import pytest

from cellblock.gateway.audit.log import Audit
from cellblock.gateway.serve import approvals as approvals_module
from cellblock.gateway.serve.approvals import Approvals
from cellblock.policy.types import Decision, Verdict

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def _notified(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str, tool: str) -> list[str]:
    state = tmp_path / "state"
    monkeypatch.setenv("CELLBLOCK_STATE_DIR", str(state))
    shown: list[str] = []

    async def notify(message: str) -> None:
        shown.append(message)

    monkeypatch.setattr(approvals_module, "notify", notify)
    approvals = Approvals(state, Audit(state / "audit.jsonl"), 30)
    # a client that cannot show a form: the question waits for `cellblock approve ID`
    call = SimpleNamespace(arguments={"path": "~/Documents/x.txt"}, kind=kind, human=None, ctx=None)
    async with anyio.create_task_group() as tg:
        tg.start_soon(approvals.decide, "notes", tool, "notes__save", Verdict(Decision.ASK, "save", ""), call)
        with anyio.fail_after(10):
            while not shown:
                await anyio.wait_all_tasks_blocked()
        tg.cancel_scope.cancel()
    return shown


@pytest.mark.xfail(
    strict=True,
    reason="Shares._share passes the call's exposed name to decide(), so the desktop says \"tool 'notes__save' "
    'waits for your approval: cellblock approve ID": an approve the user gives the call grants a read-write share',
)
async def test_a_share_question_is_announced_as_a_share_of_its_path_not_as_the_calls_approval(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (message,) = await _notified(tmp_path, monkeypatch, "share", "read_write:/home/u/Documents")
    assert "/home/u/Documents" in message and "share" in message, message


async def test_the_control_a_calls_own_question_is_announced_as_the_tool(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (message,) = await _notified(tmp_path, monkeypatch, "tool", "save")
    assert "tool 'notes__save' waits for your approval" in message
