"""`network: ask` through the approvals: `Approvals.egress` (form or pending), what "always" keeps
(`host_keeper` into the config), and `allow_host`, the config edit `cellblock allow-host` makes."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anyio
import mcp.types as types
import pytest
import yaml
from anyio.abc import TaskGroup

from cellblock.gateway.audit.budget import kind_of
from cellblock.gateway.audit.log import Audit
from cellblock.gateway.config.edit import ConfigEditError, allow_host
from cellblock.gateway.config.loading import parse_config
from cellblock.gateway.config.model import LocalServer
from cellblock.gateway.downstream.egressask import MAX_ASKING, ServerEgress, host_keeper
from cellblock.gateway.downstream.questions import MAX_QUESTIONS
from cellblock.gateway.serve import pending as pending_module
from cellblock.gateway.serve.approvals import Approvals
from cellblock.gateway.serve.pending import MAX_PENDING, MAX_PENDING_EGRESS, OnceOnly
from cellblock.policy.types import Decision, Verdict
from cellblock.sandbox.egress import Answer
from cellblock.sandbox.httphead import Refused

pytestmark = pytest.mark.anyio

CONFIG = """\
version: 1
# the user's own comment
servers:
  r:
    command: x   # another one
    jail:
      network: ask
      allow_hosts: [api.example.com]
  quiet:
    command: y
  wide:
    command: z
    jail: {network: open}
"""


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CELLBLOCK_STATE_DIR", str(tmp_path / "state"))
    return tmp_path / "state"


class Asker:
    def __init__(self, decision: str) -> None:
        self.decision = decision
        self.forms: list[str] = []

    async def ask(self, params: types.ElicitRequestFormParams) -> types.ElicitResult:
        self.forms.append(params.message)
        return types.ElicitResult(action="accept", content={"decision": self.decision})


def events(state: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (state / "audit.jsonl").read_text().splitlines()]


async def test_the_form_names_server_host_and_port_and_always_goes_to_the_keeper(state: Path) -> None:
    approvals = Approvals(state, Audit(state / "audit.jsonl"), 5)
    kept: list[tuple[str, str]] = []

    async def keep(server: str, target: str) -> None:
        kept.append((server, target))

    approvals.keepers["egress"] = keep
    asker = Asker("allow_always")
    scope, how = await approvals.egress(
        "r", "phone-home.example.com:443", SimpleNamespace(can_elicit=True, asker=asker)
    )
    assert (scope, how) == ("always", "always")
    assert kept == [("r", "phone-home.example.com:443")]
    assert "server 'r'" in asker.forms[0] and 'egress "phone-home.example.com:443"' in asker.forms[0]
    assert approvals.always() == {}  # a host is kept in the config, not approvals.json
    assert [e["kind"] for e in events(state) if e["event"].startswith("approval_")] == ["egress", "egress"]


async def test_a_pending_egress_question_is_answered_from_the_cli_and_refuses_session(state: Path) -> None:
    approvals = Approvals(state, Audit(state / "audit.jsonl"), 5)
    decided: list[tuple[str | None, str]] = []
    async with anyio.create_task_group() as tg:

        async def ask() -> None:
            decided.append(await approvals.egress("r", "a.example:8080", None))

        tg.start_soon(ask)
        with anyio.fail_after(5):
            while not approvals.pending:
                await anyio.wait_all_tasks_blocked()
        (item,) = approvals.listing()
        assert (item["server"], item["tool"], item["kind"]) == ("r", "a.example:8080", "egress")
        with pytest.raises(OnceOnly, match="--always"):
            await approvals.answer(item["id"], "session")
        assert await approvals.answer(item["id"], None)
    assert decided == [(None, f"denied from the CLI ({item['id']})")]


async def test_no_answer_in_time_is_a_deny(state: Path) -> None:
    approvals = Approvals(state, Audit(state / "audit.jsonl"), 0.05)
    assert await approvals.egress("r", "a.example:443", None) == (None, "no answer within 0.05s")


async def test_a_denial_is_kept_so_the_server_is_not_asked_again(state: Path, tmp_path: Path) -> None:
    asked: list[str] = []

    async def approve(server: str, target: str, caller: Any) -> tuple[str | None, str]:
        asked.append(target)
        return None, "denied from the CLI (x)"

    server = parse_config(CONFIG, "c.yaml").servers["r"]
    assert isinstance(server, LocalServer)
    egress = ServerEgress("r", server, tmp_path, lambda *a, **k: None, lambda: None, approve)
    first = await egress.ask("a.example", 443)
    second = await egress.ask("a.example", 443)
    assert first.answer is second.answer is Answer.DENY
    assert asked == ["a.example:443"] and "earlier" in second.how
    egress.allow("a.example:443")  # `cellblock allow-host` lifts it
    assert egress.denied == {} and egress.added == ["a.example:443"]


def test_allow_host_adds_the_host_and_keeps_the_rest_of_the_file(state: Path, tmp_path: Path) -> None:
    config = tmp_path / "cellblock.yaml"
    config.write_text(CONFIG)
    said = allow_host(config, "r", "phone-home.example.com:443")
    assert "added phone-home.example.com:443" in said
    text = config.read_text()
    assert "# the user's own comment" in text and "# another one" in text
    jail = yaml.safe_load(text)["servers"]["r"]["jail"]
    assert jail == {"network": "ask", "allow_hosts": ["api.example.com", "phone-home.example.com:443"]}
    assert "already allows" in allow_host(config, "r", "phone-home.example.com:443")


def test_allow_host_turns_none_into_an_allowlist_and_refuses_what_cannot_be_allowed(
    state: Path, tmp_path: Path
) -> None:
    config = tmp_path / "cellblock.yaml"
    config.write_text(CONFIG)
    assert "network: none became allowlist" in allow_host(config, "quiet", "api.example.com:443")
    jail = yaml.safe_load(config.read_text())["servers"]["quiet"]["jail"]
    assert jail == {"network": "allowlist", "allow_hosts": ["api.example.com:443"]}
    with pytest.raises(ConfigEditError, match="network: open"):
        allow_host(config, "wide", "a.example:443")
    with pytest.raises(ConfigEditError, match="not a local server"):
        allow_host(config, "nosuch", "a.example:443")
    with pytest.raises(ConfigEditError, match="not an allow_hosts entry"):
        allow_host(config, "r", "a b:443")


@pytest.mark.parametrize("entry", ["169.254.169.254", "169.254.169.254:80", "[fd00:ec2::254]:80", "169.0.0.0/8"])
def test_allow_host_never_adds_a_cloud_metadata_service(entry: str, state: Path, tmp_path: Path) -> None:
    config = tmp_path / "cellblock.yaml"
    config.write_text(CONFIG)
    with pytest.raises(ConfigEditError, match="metadata service"):
        allow_host(config, "r", entry)
    with pytest.raises(ConfigEditError, match="metadata service"):
        allow_host(config, "r", entry, loopback=True)
    assert config.read_text() == CONFIG


def test_allow_host_adds_loopback_only_when_told_it_is_meant(state: Path, tmp_path: Path) -> None:
    config = tmp_path / "cellblock.yaml"
    config.write_text(CONFIG)
    with pytest.raises(ConfigEditError, match=r"loopback.*--loopback"):
        allow_host(config, "r", "127.0.0.1:6379")
    assert config.read_text() == CONFIG
    assert "added 127.0.0.1:6379" in allow_host(config, "r", "127.0.0.1:6379", loopback=True)
    assert "added 10.0.0.5:443" in allow_host(config, "r", "10.0.0.5:443")  # the control: a private address


async def test_the_keeper_writes_the_config_and_allows_it_live(state: Path, tmp_path: Path) -> None:
    config = tmp_path / "cellblock.yaml"
    config.write_text(CONFIG)
    server = parse_config(CONFIG, "c.yaml").servers["r"]
    assert isinstance(server, LocalServer)
    egress = ServerEgress("r", server, tmp_path, lambda *a, **k: None, lambda: None)
    await host_keeper(config, lambda _: egress)("r", "b.example:443")
    assert "b.example:443" in yaml.safe_load(config.read_text())["servers"]["r"]["jail"]["allow_hosts"]
    assert egress.added == ["b.example:443"]
    with pytest.raises(OSError, match="not read from a file"):
        await host_keeper(None, lambda _: egress)("r", "c.example:443")


def test_a_servers_questions_about_its_connections_are_held_to_its_audit_budget() -> None:
    assert kind_of("approval_asked", {"kind": "egress"}) == "egress_asked"
    assert kind_of("approval_timeout", {"kind": "egress"}) == "egress_timeout"
    assert kind_of("approval_asked", {"kind": "sampling"}) == "sampling_asked"
    assert kind_of("approval_asked", {}) is None  # a call's question is a decision: always written


async def test_a_call_that_has_asked_its_questions_gets_no_more_forms_for_connections(tmp_path: Path) -> None:
    asked: list[str] = []

    async def approve(server: str, target: str, caller: Any) -> tuple[str | None, str]:
        asked.append(target)
        return "once", "once"

    server = parse_config(CONFIG, "c.yaml").servers["r"]
    assert isinstance(server, LocalServer)
    caller = SimpleNamespace(questions=MAX_QUESTIONS - 1)
    egress = ServerEgress("r", server, tmp_path, lambda *a, **k: None, lambda: caller, approve)
    assert (await egress.ask("a.example", 443)).answer is Answer.ONCE
    refused = await egress.ask("b.example", 443)
    assert refused.answer is Answer.DENY and "questions" in refused.how
    assert asked == ["a.example:443"]
    assert egress.denied == {}  # a cap is not the user's answer: not remembered


def ask_server(name: str, tmp_path: Path, approvals: Approvals, events: list[str]) -> ServerEgress:
    """An `ask` server whose connections are asked by `approvals` with no call in flight (as a timer's)."""
    server = parse_config(CONFIG, "c.yaml").servers["r"]
    assert isinstance(server, LocalServer)
    return ServerEgress(name, server, tmp_path, lambda e, **k: events.append(e), lambda: None, approvals.egress)


async def flood(tg: TaskGroup, approvals: Approvals, servers: list[ServerEgress], each: int) -> list[Any]:
    """Each server connects to `each` distinct names at once (tasks of `tg`), with no call in flight;
    once every connection is refused or waits: the refusals (the rest wait until `tg` ends)."""
    refused: list[Any] = []

    async def connect(egress: ServerEgress, host: str) -> None:
        refused.append(await egress.ask(host, 443))

    for s in servers:
        for i in range(each):
            tg.start_soon(connect, s, f"x{i}.{s.name}.attacker.example")
    with anyio.fail_after(10):
        while len(refused) + len(approvals.pending) < len(servers) * each:
            await anyio.wait_all_tasks_blocked()
    return refused


async def users_call_is_asked(approvals: Approvals) -> tuple[bool, str]:
    """The user's own call to a server whose policy says ask, from a client that cannot elicit: put
    to the user (pending), or refused and why."""
    call = SimpleNamespace(arguments={"q": 1}, kind="tool", human=None, ctx=None)
    verdicts: list[Any] = []
    async with anyio.create_task_group() as tg:

        async def decide() -> None:
            verdicts.append(
                await approvals.decide("other", "write", "other__write", Verdict(Decision.ASK, "r", ""), call)
            )

        tg.start_soon(decide)
        with anyio.fail_after(10):
            while not verdicts and not any(p.server == "other" for p in approvals.pending.values()):
                await anyio.wait_all_tasks_blocked()
        tg.cancel_scope.cancel()
    return not verdicts, verdicts[0].reason if verdicts else ""


async def test_servers_connections_between_calls_cannot_crowd_out_the_users_own_approvals(
    state: Path, tmp_path: Path
) -> None:
    approvals = Approvals(state, Audit(state / "audit.jsonl"), 30)
    # enough servers, each at its own cap, to fill the whole table without a share of their own
    servers = [ask_server(f"s{n}", tmp_path, approvals, []) for n in range(MAX_PENDING // MAX_ASKING + 4)]
    async with anyio.create_task_group() as tg:
        refused = await flood(tg, approvals, servers, MAX_ASKING)
        asked, why = await users_call_is_asked(approvals)
        held = sum(p.kind == "egress" for p in approvals.pending.values())
        tg.cancel_scope.cancel()
    assert asked, why
    assert held == MAX_PENDING_EGRESS and all("wait for approval already" in r.how for r in refused)


async def test_without_a_flood_the_users_own_call_is_put_to_the_user(state: Path) -> None:
    approvals = Approvals(state, Audit(state / "audit.jsonl"), 30)
    assert await users_call_is_asked(approvals) == (True, "")


async def test_a_servers_flood_of_connections_asks_four_at_once_and_refuses_the_rest_naming_allow_host(
    state: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    notified: list[str] = []

    async def notify(message: str) -> None:
        notified.append(message)

    monkeypatch.setattr(pending_module, "notify", notify)
    approvals = Approvals(state, Audit(state / "audit.jsonl"), 30)
    events: list[str] = []
    egress = ask_server("r", tmp_path, approvals, events)
    proxy = egress.for_run()
    assert proxy is not None
    refusals: list[str] = []
    async with anyio.create_task_group() as tg:

        async def connect(host: str) -> None:
            try:
                await proxy._asked(host, 443)  # the proxy's question, as a CONNECT makes it
            except Refused as exc:
                refusals.append(exc.reason)

        for i in range(MAX_PENDING):  # the proxy lets 64 connections wait at once
            tg.start_soon(connect, f"x{i}.attacker.example")
        with anyio.fail_after(10):
            while len(refusals) + len(approvals.pending) < MAX_PENDING:
                await anyio.wait_all_tasks_blocked()
        assert len(approvals.pending) == MAX_ASKING
        tg.cancel_scope.cancel()
    assert len(refusals) == MAX_PENDING - MAX_ASKING
    assert all(f"{MAX_ASKING} connections waiting" in r and "cellblock allow-host r x" in r for r in refusals)
    assert events.count("questions_capped") == 1  # audited once per burst, not per connection
    assert len(notified) == 1  # one desktop notification per server per burst
    assert egress.denied == {} and egress.asking == 0  # a cap is not the user's answer: asked again later
    assert approvals.pending == {}  # the connections stopped waiting: their questions left the table


async def test_a_connection_that_gave_up_leaves_the_pending_table_and_a_late_approve_names_allow_host(
    state: Path, tmp_path: Path
) -> None:
    approvals = Approvals(state, Audit(state / "audit.jsonl"), 0.05)
    egress = ask_server("r", tmp_path, approvals, [])
    first = await egress.ask("api.example.com", 443)
    assert first.answer is Answer.DENY and "no answer" in first.how
    assert approvals.listing() == []  # nothing can use a later answer: it is not shown as pending
    (ident,) = [e["id"] for e in events(state) if e["event"] == "approval_asked"]
    with pytest.raises(OnceOnly, match=r"gave up waiting.*'cellblock allow-host r api\.example\.com:443'"):
        await approvals.answer(ident, "once")
    egress.allow("api.example.com:443")  # what the message says to run: the retry is no longer refused
    assert egress.denied == {}
