"""The dashboard's audit view (`GET /api/audit`): filtered on the dashboard's side, bounded, newest
first, the chain's verdict as `cellblock audit --verify` gives it with its first broken line, and
every string of the log (hostile: servers and models wrote parts of it) escaped as data."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
from starlette.testclient import TestClient

from cellblock.gateway.audit.chain import KEY_NAME
from cellblock.gateway.audit.log import Audit
from cellblock.gateway.cli.audit import verify_log
from cellblock.gateway.dashboard.app import create_app
from cellblock.gateway.dashboard.timeline import MAX_DETAILS, MAX_EVENTS, AuditLog
from tests.gateway.dashboard.test_dashboard import (
    ORIGIN,
    PORT,
    SECRET,
    FakeGateways,
    assert_strict_headers,
    send,
    session,
)

HOSTILE = "<script>window.__pwned=1</script><img src=x onerror=alert(1)>\x1b[31m\u202egnp.exe"


class CountingLog(AuditLog):
    def __init__(self, path: Path, key: Path) -> None:
        super().__init__(path, key)
        self.reads = 0

    def read(self, filters: dict[str, str]) -> dict[str, Any]:
        self.reads += 1
        return super().read(filters)


@pytest.fixture
def state(tmp_path: Path) -> Path:
    """A real audit log: calls of two servers with every decision, a lock event, hostile text."""
    audit = Audit(tmp_path / "audit.jsonl")
    audit.write("call", "fs", tool="read", decision="allow", rule="read")
    audit.write("call", "fs", tool="write", decision="deny", rule="default", reason="denied by default")
    audit.write("call", "db", tool="read", decision="deny", rule="lock")
    audit.write("call", "db", tool="query", decision="ask", rule="query")
    audit.write("lock_approved", "db", items=["tool:query"], removed=[], via="dashboard")
    audit.write("call", HOSTILE, tool=HOSTILE, decision="allow", reason=HOSTILE, arguments={"text": HOSTILE})
    audit.close()
    return tmp_path


@pytest.fixture
def log(state: Path) -> CountingLog:
    return CountingLog(state / "audit.jsonl", state / KEY_NAME)


@pytest.fixture
def client(log: CountingLog) -> Iterator[TestClient]:
    with TestClient(create_app(PORT, SECRET, FakeGateways(), log), base_url=ORIGIN) as test_client:
        yield test_client


def audit(client: TestClient, query: str = "") -> dict[str, Any]:
    cookie, csrf = session(client)
    response = send(client, "GET", f"/api/audit{query}", cookie=cookie, csrf=csrf)
    assert response.status_code == 200, response.text
    assert_strict_headers(response)
    assert response.headers["content-type"] == "application/json"
    shown: dict[str, Any] = response.json()
    return shown


def picked(shown: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    return [(e["kind"], e["server"], e["tool"], e["decision"]) for e in shown["events"]]


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("?server=fs", [("call", "fs", "write", "deny"), ("call", "fs", "read", "allow")]),
        ("?tool=read", [("call", "db", "read", "deny"), ("call", "fs", "read", "allow")]),
        ("?decision=deny", [("call", "db", "read", "deny"), ("call", "fs", "write", "deny")]),
        ("?server=db&decision=deny", [("call", "db", "read", "deny")]),
        ("?kind=lock_approved", [("lock_approved", "db", "", "")]),
        ("?server=db&tool=write", []),
        ("?server=f", []),  # exact, not a prefix
        ("?server=&tool=", None),  # empty: no filter
    ],
)
def test_the_filters_return_only_matching_events_newest_first(
    client: TestClient, query: str, expected: list[tuple[str, str, str, str]] | None
) -> None:
    shown = audit(client, query)
    if expected is None:  # the control: unfiltered, every event, the newest first
        assert len(shown["events"]) == shown["matched"] == 6 and shown["events"][-1]["server"] == "fs"
        return
    assert picked(shown) == expected and shown["matched"] == len(expected)
    # the choices offered are the log's, whatever the filter
    assert {"db", "fs"} <= set(shown["choices"]["server"]) and "lock_approved" in shown["choices"]["kind"]


@pytest.mark.parametrize("query", ["?who=fs", "?server=fs&server=db", f"?tool={'x' * 501}"])
def test_an_unknown_or_repeated_filter_is_refused(client: TestClient, log: CountingLog, query: str) -> None:
    cookie, csrf = session(client)
    refused = send(client, "GET", f"/api/audit{query}", cookie=cookie, csrf=csrf)
    assert refused.status_code == 400 and log.reads == 0
    assert_strict_headers(refused)


@pytest.mark.parametrize(
    "attack", [{"cookie": None}, {"csrf": None}, {"csrf": "forged"}, {"host": "evil.example"}], ids=str
)
def test_the_audit_is_not_read_without_the_session(
    client: TestClient, log: CountingLog, attack: dict[str, Any]
) -> None:
    cookie, csrf = session(client)
    refused = send(client, "GET", "/api/audit", **{"cookie": cookie, "csrf": csrf, **attack})
    assert refused.status_code == 403 and log.reads == 0 and "fs" not in refused.text
    assert audit(client)["matched"] == 6 and log.reads == 1  # the control


def test_hostile_text_in_the_log_is_given_as_escaped_data(client: TestClient) -> None:
    escaped = "<script>window.__pwned=1</script><img src=x onerror=alert(1)>\\u001b[31m\\u202egnp.exe"
    # filtered on what the page shows: the escaped name picks the event
    [event] = audit(client, "?" + urlencode({"server": escaped}))["events"]
    # whole, the escape and the override made visible; `<` stays a character the page sets as text
    assert event["server"] == event["tool"] == escaped
    assert event["details"] == f'reason="{escaped}" arguments={{"text": "{escaped}"}}'  # the chain's MAC left out
    assert "\x1b" not in json.dumps(event, ensure_ascii=False) and "\u202e" not in json.dumps(event, ensure_ascii=False)


def test_the_page_is_bounded_to_the_newest_events_and_long_details_are_cut(tmp_path: Path) -> None:
    audit_log = Audit(tmp_path / "audit.jsonl")
    for n in range(MAX_EVENTS + 100):
        audit_log.write("call", "fs", tool="read", decision="allow", n=n)
    # one event of many long fields (the audit cuts each value, not how many there are)
    audit_log.write("call", "fs", tool="read", decision="allow", **{f"field{i}": "x" * 250 for i in range(40)})
    audit_log.close()
    shown = AuditLog(tmp_path / "audit.jsonl", tmp_path / KEY_NAME).read({})
    assert shown["matched"] == MAX_EVENTS + 101 and len(shown["events"]) == MAX_EVENTS
    newest, *rest = shown["events"]
    assert len(newest["details"]) == MAX_DETAILS and newest["details"].endswith("…")
    assert rest[0]["details"] == "n=599" and rest[-1]["details"] == "n=101"  # newest first, the oldest left out


def test_a_tampered_log_shows_the_first_broken_line_as_audit_verify_does(
    client: TestClient, state: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    whole = audit(client)["chain"]
    assert whole["state"] == "whole" and whole["text"].startswith("audit chain whole: 6 line(s) in 1 file(s)")
    # someone edits the third line: a deny made an allow
    path = state / "audit.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    assert b'"decision":"deny"' in lines[2]
    lines[2] = lines[2].replace(b'"decision":"deny"', b'"decision":"allow"')
    path.write_bytes(b"".join(lines))
    chain = audit(client)["chain"]
    assert chain["state"] == "broken" and chain["broken"]["line"] == 3 and chain["broken"]["file"] == str(path)
    assert verify_log(path, state / KEY_NAME) == 1  # `cellblock audit --verify` says the same
    said = capsys.readouterr().err.splitlines()[0].removeprefix("cellblock: ")
    assert chain["text"].startswith(said) and "its MAC does not match" in chain["broken"]["why"]


def test_no_log_yet_is_said_and_not_an_error(tmp_path: Path) -> None:
    shown = AuditLog(tmp_path / "audit.jsonl", tmp_path / KEY_NAME).read({})
    assert shown["events"] == [] and shown["chain"]["state"] == "empty" and shown["error"] is None
