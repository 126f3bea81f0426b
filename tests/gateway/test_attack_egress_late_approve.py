"""A connection's question answered from the terminal after the connection gave up: the approve is
reported done, and the retry is still refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from cellblock.gateway.audit.log import Audit
from cellblock.gateway.config.loading import parse_config
from cellblock.gateway.config.model import LocalServer
from cellblock.gateway.downstream.egressask import ServerEgress
from cellblock.gateway.serve.approvals import Approvals
from cellblock.sandbox.egress import Answer

pytestmark = pytest.mark.anyio

CONFIG = """\
version: 1
servers:
  r:
    command: x
    jail: {network: ask}
"""


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.xfail(
    strict=True,
    reason="ServerEgress.ask keeps a timeout as a denial and answers the retry from it before Approvals.egress "
    "could find the late 'cellblock approve ID' (its _once): the approve says OK and changes nothing",
)
async def test_a_connection_approved_from_the_terminal_after_it_gave_up_is_allowed_on_retry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = tmp_path / "state"
    monkeypatch.setenv("CELLBLOCK_STATE_DIR", str(state))
    approvals = Approvals(state, Audit(state / "audit.jsonl"), 0.05)
    server = parse_config(CONFIG, "c.yaml").servers["r"]
    assert isinstance(server, LocalServer)
    egress = ServerEgress("r", server, tmp_path, lambda *a, **k: None, lambda: None, approvals.egress)
    first = await egress.ask("api.example.com", 443)
    assert first.answer is Answer.DENY and "no answer" in first.how
    (item,) = approvals.listing()  # still pending: `cellblock pending` shows it, and approve takes it
    assert await approvals.answer(item["id"], "once")
    retry = await egress.ask("api.example.com", 443)
    assert retry.answer is Answer.ONCE, retry.how
