"""The `share` stage (`serve/shares.py`): what is asked about a path a call names, and what an answer shares."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anyio
import mcp.types as types
import pytest

from cellblock.gateway.audit.log import Audit
from cellblock.gateway.config.loading import parse_config
from cellblock.gateway.downstream.supervisor import State
from cellblock.gateway.serve import pending as pending_module
from cellblock.gateway.serve.approvals import Approvals, NeedsInput
from cellblock.gateway.serve.pipeline import Asking, Call, Refused
from cellblock.gateway.serve.shares import Shares
from cellblock.policy.types import Decision, Verdict

pytestmark = pytest.mark.anyio

CONFIG = """\
version: 1
servers:
  notes:
    command: x
    jail: {network: none}
"""


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Gate:
    def check(self, path: str, write: bool, writable: list[str]) -> str | None:
        return None  # every path here is one the real gate lets be asked about

    def keep(self, server: str, path: str, write: bool) -> None:
        raise AssertionError("nothing is shared always here")


async def _attempt(shares: Shares, approvals: Approvals, arguments: dict[str, Any], answer: Any = None) -> Any:
    """One try of the call: the form it raises (its message and state), or None when it may run."""
    session = SimpleNamespace(client_capabilities=types.ClientCapabilities(elicitation=types.ElicitationCapability()))
    call = Call("notes__save", arguments, server="notes", tool="save", ctx=Asking(session, 1, True))
    if answer is not None:  # the retry carries the answer the way the gateway takes it
        state, decision = answer
        reply = {"cellblock_approval": {"action": "accept", "content": {"decision": decision}}}
        assert approvals.sealed.carried(call, state, reply) is None
    wait = shares.stage(call)
    if wait is None:
        return None
    try:
        await wait()
    except NeedsInput as needed:
        form = needed.result.input_requests["cellblock_approval"]
        return form.params.message, needed.result.request_state
    except Refused:
        return "refused"
    return None


async def test_a_retrys_answer_to_a_form_that_showed_one_path_never_shares_another(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CELLBLOCK_STATE_DIR", str(tmp_path / "state"))
    home = tmp_path / "home"
    (home / "x").mkdir(parents=True)
    (home / "Documents").mkdir()
    server = parse_config(CONFIG, "c.yaml").servers["notes"]
    ds = SimpleNamespace(
        name="notes", config=server, listing=None, audit=None, supervisor=SimpleNamespace(state=State.STOPPED)
    )
    approvals = Approvals(tmp_path / "state", Audit(tmp_path / "audit.jsonl"), 30)
    shares = Shares({"notes": ds}, approvals, Gate(), home=lambda: str(home))  # type: ignore[dict-item, arg-type]  # duck-typed Downstream and Gate
    arguments = {"path": "~/x/a.txt", "copy_to": "~/Documents/a.txt"}

    # the model sends the same call twice at once: two forms, both "share read-write .../x"
    first_form, first_state = await _attempt(shares, approvals, arguments)
    second_form, second_state = await _attempt(shares, approvals, arguments)
    assert f'"{home}/x"' in first_form and f'"{home}/x"' in second_form
    assert "Documents" not in first_form + second_form

    # the user shares x in the first form; the retry then asks about Documents, which the user denies
    documents_form, documents_state = await _attempt(shares, approvals, arguments, (first_state, "share_once"))
    assert "Documents" in documents_form
    assert await _attempt(shares, approvals, arguments, (documents_state, "deny")) == "refused"

    # the user shares x in the second form too (it showed x): that answer must not share Documents
    # (the 2026-07-28 attack: a steered model sends the same call twice, so it holds two forms for x)
    asked_again = await _attempt(shares, approvals, arguments, (second_state, "share_once"))
    assert str(home / "Documents") not in ds.config.jail.read_write, ds.config.jail.read_write
    assert "Documents" in asked_again[0]  # Documents is asked anew, in a form that shows it


async def _waiting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str, tool: str) -> tuple[str, str, Any]:
    """A question put to a client that cannot show a form: what the desktop, the client and
    `cellblock pending` are told while it waits for `cellblock approve ID`."""
    state = tmp_path / "state"
    monkeypatch.setenv("CELLBLOCK_STATE_DIR", str(state))
    shown: list[str] = []
    told: list[str] = []

    async def notify(message: str) -> None:
        shown.append(message)

    async def tell(message: str) -> None:
        told.append(message)

    monkeypatch.setattr(pending_module, "notify", notify)
    approvals = Approvals(state, Audit(state / "audit.jsonl"), 30)
    ctx = Asking(SimpleNamespace(client_capabilities=types.ClientCapabilities()), 1, False, tell)
    call = SimpleNamespace(arguments={"path": "~/Documents/x.txt"}, kind=kind, human=None, ctx=ctx)
    async with anyio.create_task_group() as tg:
        tg.start_soon(approvals.decide, "notes", tool, "notes__save", Verdict(Decision.ASK, "save", ""), call)
        with anyio.fail_after(10):
            while not (shown and told):
                await anyio.wait_all_tasks_blocked()
        (listed,) = approvals.listing()
        tg.cancel_scope.cancel()
    return shown[0], told[0], listed


async def test_a_share_waiting_for_the_terminal_is_announced_as_a_share_of_its_path_never_as_the_calls_approval(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    desktop, client, listed = await _waiting(tmp_path, monkeypatch, "share", "read_write:/home/u/Docu\x1bments")
    ident = listed["id"]
    asks = "server 'notes' asks to share /home/u/Docu\\u001bments read-write for tool 'notes__save'"
    answers = (
        f"cellblock approve {ident} shares it until the server stops, --always for good, cellblock deny {ident} refuses"
    )
    assert desktop == f"{asks}: {answers}"
    assert asks in client and answers in client and "waits for your approval" not in client
    assert listed["asks"] == asks


async def test_the_control_a_calls_own_question_is_announced_as_the_tool(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    desktop, client, listed = await _waiting(tmp_path, monkeypatch, "tool", "save")
    assert desktop.startswith("tool 'notes__save' waits for your approval") and "share" not in desktop
    assert "tool 'notes__save' waits" in client and listed["asks"] is None
