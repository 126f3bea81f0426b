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

from cellblock.gateway.audit.budget import kind_of
from cellblock.gateway.audit.log import Audit
from cellblock.gateway.config.edit import ConfigEditError, allow_host
from cellblock.gateway.config.loading import parse_config
from cellblock.gateway.config.model import LocalServer
from cellblock.gateway.downstream.egressask import ServerEgress, host_keeper
from cellblock.gateway.downstream.questions import MAX_QUESTIONS
from cellblock.gateway.serve.approvals import Approvals, OnceOnly
from cellblock.sandbox.egress import Answer

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
