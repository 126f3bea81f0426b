"""Hostile: a `network: ask` server's connections between calls fill the gateway's pending approvals."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import anyio
import pytest

from cellblock.gateway.audit.log import Audit
from cellblock.gateway.config.loading import parse_config
from cellblock.gateway.config.model import LocalServer
from cellblock.gateway.downstream.egressask import ServerEgress
from cellblock.gateway.serve.approvals import MAX_PENDING, Approvals
from cellblock.policy.types import Decision, Verdict

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
    reason="MAX_PENDING is one gateway-wide table: an ask server's connections made outside a call "
    "(no question cap) fill it, and the user's own call's approval is then refused unasked",
)
async def test_a_servers_connections_between_calls_do_not_crowd_out_the_users_own_approvals(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = tmp_path / "state"
    monkeypatch.setenv("CELLBLOCK_STATE_DIR", str(state))
    approvals = Approvals(state, Audit(state / "audit.jsonl"), 30)
    server = parse_config(CONFIG, "c.yaml").servers["r"]
    assert isinstance(server, LocalServer)
    # no call in flight (owner() is None): the hostile server connects on its own, as a timer would
    egress = ServerEgress("r", server, tmp_path, lambda *a, **k: None, lambda: None, approvals.egress)
    verdicts: list[Verdict] = []
    async with anyio.create_task_group() as tg:
        for i in range(MAX_PENDING):  # the proxy lets 64 connections wait at once; distinct names
            tg.start_soon(egress.ask, f"x{i}.attacker.example", 443)
        with anyio.fail_after(10):
            while len(approvals.pending) < MAX_PENDING:
                await anyio.wait_all_tasks_blocked()

        # the user's own call to another server, whose policy says ask, from a client that cannot elicit
        call = SimpleNamespace(arguments={"q": 1}, kind="tool", human=None, ctx=None)

        async def users_call() -> None:
            verdicts.append(
                await approvals.decide("other", "write", "other__write", Verdict(Decision.ASK, "r", ""), call)
            )

        tg.start_soon(users_call)
        with anyio.fail_after(10):
            while not verdicts and not any(p.server == "other" for p in approvals.pending.values()):
                await anyio.wait_all_tasks_blocked()
        asked = any(p.server == "other" for p in approvals.pending.values())
        tg.cancel_scope.cancel()
    # the user's call must have been put to the user, not refused because the table is full
    assert asked, verdicts[0].reason if verdicts else "not asked"


async def test_without_the_flood_the_users_own_call_is_put_to_the_user(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = tmp_path / "state"
    monkeypatch.setenv("CELLBLOCK_STATE_DIR", str(state))
    approvals = Approvals(state, Audit(state / "audit.jsonl"), 30)
    call = SimpleNamespace(arguments={"q": 1}, kind="tool", human=None, ctx=None)
    async with anyio.create_task_group() as tg:
        tg.start_soon(approvals.decide, "other", "write", "other__write", Verdict(Decision.ASK, "r", ""), call)
        with anyio.fail_after(10):
            while not approvals.pending:
                await anyio.wait_all_tasks_blocked()
        tg.cancel_scope.cancel()
    assert [p.server for p in approvals.pending.values()] == ["other"]
