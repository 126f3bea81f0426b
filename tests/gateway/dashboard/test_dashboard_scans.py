"""The dashboard's scans view (`GET /api/scans`): the latest report `cellblock scan` kept of each
server, every string of it (hostile: a scanned server named its tools and wrote its errors) given
escaped as data; the directory read bounded, a broken or foreign file an error line that leaves
the others shown; read only with the session. And what a kept report must not hold: a secret."""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from cellblock.gateway.config.model import LocalServer
from cellblock.gateway.dashboard.app import create_app
from cellblock.gateway.dashboard.scans import MAX_FILE, MAX_REPORTS, ScanReports
from cellblock.gateway.scan.saved import save_report, saved_path, secrets_pattern
from cellblock.gateway.scrub import REDACTED, scrub
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
ESCAPED = "<script>window.__pwned=1</script><img src=x onerror=alert(1)>\\u001b[31m\\u202egnp.exe"
SUMMARY = {
    "confined": False,
    "fail_on": "medium",
    "fs": {"confined": False, "failed": ["secret-read"], "worst": "high"},
    "net": {"confined": True, "failed": [], "worst": "none"},
    "exec": {"confined": True, "failed": [], "worst": "none"},
}


def report(name: str, tool: str = "read_note") -> dict[str, Any]:
    """A report as `scan/report.py: confinement_report` makes it."""
    return {
        "format": "cellblock-scan-report/1",
        "cellblock": "0.1.0",
        "scanned_at": "2026-01-02T03:04:05Z",
        "scan": {"command": f"cellblock scan {name} --fail-on medium", "destructive": False, "fail_on": "medium"},
        "server": {"name": name, "command": "/usr/bin/python3", "args": ["notes.py", "--root", "/home/me/notes"]},
        "protocol": "2025-06-18",
        "tools": 2,
        "calls": 7,
        "skipped": [],
        "jail": {
            "configured": {"read_write": ["/home/me/notes"], "network": "none"},
            "proposed": {"read_write": ["/home/me/notes"], "network": "none"},
            "notes": [f"{tool}: wrote ~/.seen"],
        },
        "summary": SUMMARY,
        "findings": [
            {"severity": "high", "code": "secret-read", "where": tool, "text": f"{tool}: opened ~/.ssh/id_rsa unasked"},
            {"severity": "info", "code": "confined-path", "where": tool, "text": f"{tool}(path=..): refused"},
        ],
    }


@pytest.fixture
def state(tmp_path: Path) -> Path:
    save_report(tmp_path, "notes", report("notes"))
    save_report(tmp_path, "evil", report("evil", tool=HOSTILE))
    return tmp_path


@pytest.fixture
def client(state: Path) -> Iterator[TestClient]:
    app = create_app(PORT, SECRET, FakeGateways(), None, ScanReports(state))
    with TestClient(app, base_url=ORIGIN) as test_client:
        yield test_client


def scans(client: TestClient) -> dict[str, Any]:
    cookie, csrf = session(client)
    response = send(client, "GET", "/api/scans", cookie=cookie, csrf=csrf)
    assert response.status_code == 200, response.text
    assert_strict_headers(response)
    shown: dict[str, Any] = response.json()
    return shown


def test_a_kept_report_is_given_with_its_summary_findings_and_proposed_jail(client: TestClient, state: Path) -> None:
    assert (saved_path(state, "notes").stat().st_mode & 0o777) == 0o600
    shown = scans(client)
    assert shown["errors"] == [] and [r["server"] for r in shown["reports"]] == ["evil", "notes"]
    notes = shown["reports"][1]
    assert notes["when"] == "2026-01-02T03:04:05Z" and notes["scan"] == "cellblock scan notes --fail-on medium"
    assert notes["config"] == "/usr/bin/python3 notes.py --root /home/me/notes"
    assert notes["counts"] == {"high": 1, "medium": 0, "low": 0, "info": 1}
    assert notes["badge"] == "not confined · fs ✗ net ✓ exec ✓" and notes["confined"] is False
    assert notes["findings"][0] == {
        "severity": "high",
        "tool": "read_note",
        "code": "secret-read",
        "text": "read_note: opened ~/.ssh/id_rsa unasked",
    }
    assert notes["proposed"] == ['read_write: ["/home/me/notes"]', 'network: "none"']


def test_hostile_text_in_a_report_is_given_as_escaped_data(client: TestClient) -> None:
    evil = scans(client)["reports"][0]
    assert evil["findings"][0]["tool"] == ESCAPED  # whole, the escape and the override made visible
    assert evil["findings"][0]["text"] == f"{ESCAPED}: opened ~/.ssh/id_rsa unasked"
    assert evil["notes"] == [f"{ESCAPED}: wrote ~/.seen"]
    raw = json.dumps(evil, ensure_ascii=False)
    assert "\x1b" not in raw and "\u202e" not in raw


@pytest.mark.parametrize(
    ("name", "content", "said"),
    [
        ("big", b'{"format": "cellblock-scan-report/1", "pad": "' + b"x" * MAX_FILE + b'"}', "is over"),
        ("broken", b'{"format": "cellblock-scan-', "is not JSON"),
        ("foreign", b'{"hello": "world"}', "is not a scan report"),
        ("half", json.dumps({"format": "cellblock-scan-report/1", "server": {}}).encode(), "is not a scan report"),
        ("deep", b"[" * 100_000 + b"]" * 100_000, "is not JSON"),
    ],
)
def test_an_oversized_or_broken_file_is_an_error_line_and_the_others_still_show(
    client: TestClient, state: Path, name: str, content: bytes, said: str
) -> None:
    saved_path(state, name).write_bytes(content)
    shown = scans(client)
    [error] = shown["errors"]
    assert f"{name}.json" in error and said in error, error
    assert [r["server"] for r in shown["reports"]] == ["evil", "notes"]  # the control: the others


def test_a_link_or_a_flood_of_files_is_bounded(state: Path) -> None:
    os.symlink(state / "scans" / "notes.json", state / "scans" / "link.json")
    [error] = ScanReports(state).read()["errors"]
    assert "link.json cannot be read" in error  # never through a link
    for n in range(MAX_REPORTS):
        save_report(state, f"s{n:03}", report(f"s{n:03}"))
    shown = ScanReports(state).read()
    assert len(shown["reports"]) + len(shown["errors"]) - 1 == MAX_REPORTS
    assert shown["errors"][-1].startswith("3 more report(s)")


def test_no_report_yet_is_no_error(tmp_path: Path) -> None:
    assert ScanReports(tmp_path).read()["reports"] == [] and ScanReports(tmp_path).read()["errors"] == []


@pytest.mark.parametrize(
    "attack", [{"cookie": None}, {"csrf": None}, {"csrf": "forged"}, {"host": "evil.example"}], ids=str
)
def test_the_scans_are_not_read_without_the_session(client: TestClient, attack: dict[str, Any]) -> None:
    cookie, csrf = session(client)
    refused = send(client, "GET", "/api/scans", **{"cookie": cookie, "csrf": csrf, **attack})
    assert refused.status_code == 403 and "notes" not in refused.text
    assert_strict_headers(refused)
    assert [r["server"] for r in scans(client)["reports"]] == ["evil", "notes"]  # the control


TOKEN = "ghp_" + "aB3dE5gH7jK9mN1pQ3sT5vW7yZ9bC1dF3hJ5"


def test_a_kept_report_holds_no_secret_of_the_server(monkeypatch: pytest.MonkeyPatch) -> None:
    """A token written in the arguments (alone, after an option, as a URL's password, after
    `Bearer`), an `env:` secret and a host variable the arguments name (which the server is given,
    and may echo into a path or an error) are each redacted; the control: plain values (a path,
    `DEBUG: 1`) are left as they are."""
    monkeypatch.setenv("NOTES_KEY", "s3cr3t-from-the-host-environment")
    args = [
        "notes.py",
        "--api-key",
        "hunter2-is-long",
        f"--token={TOKEN}",
        "--key",
        "${NOTES_KEY}",
        "--db=postgres://me:pa55word-in-url@db.example/notes",
        "--header=Authorization: Bearer bearer-value-1234",
    ]
    server = LocalServer(
        command="/usr/bin/python3",
        args=args,
        env={"NOTES_PASSWORD": "correct horse", "DEBUG": "1", "NOTES_DIR": "/home/me/notes"},
    )
    shown = report("notes")
    shown["server"]["args"] = list(args)
    secrets = (TOKEN, "correct horse", "s3cr3t-from-the-host-environment", "hunter2-is-long")
    secrets += ("pa55word-in-url", "bearer-value-1234")
    echoed = "read_note: opened /tmp/" + "/".join(secrets)
    shown["findings"].append({"severity": "low", "code": "network", "where": "read_note", "text": echoed})
    before = copy.deepcopy(shown)
    clean = json.dumps(scrub(shown, secrets_pattern(shown, server))[0])
    for secret in secrets:
        assert secret in json.dumps(before) and secret not in clean, secret
    assert "opened /tmp/" + "/".join([REDACTED] * len(secrets)) in clean
    assert '"${NOTES_KEY}"' in clean and "/home/me/notes" in clean and '"calls": 7' in clean
