"""The `share` stage (`serve/shares.py`): what is asked about a path a call names, and what an answer shares."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import mcp.types as types
import pytest

from cellblock.gateway.audit.log import Audit
from cellblock.gateway.config.loading import parse_config
from cellblock.gateway.downstream.supervisor import State
from cellblock.gateway.serve.approvals import Approvals, NeedsInput
from cellblock.gateway.serve.pipeline import Asking, Call, Refused
from cellblock.gateway.serve.shares import Shares

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
        assert approvals.carried(call, state, reply) is None
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
    ds = SimpleNamespace(name="notes", config=server, listing=None, audit=None, state=State.STOPPED)
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
