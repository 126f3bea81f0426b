"""The dashboard's charts of calls and refusals per server over time (`charts.py`), counted from a
real audit log as the timeline reads it, and the vendored uPlot that draws them: the files are
the ones its README names, served with the strict headers, and shipped in the wheel."""

from __future__ import annotations

import hashlib
import re
import tomllib
from collections import Counter
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from cellblock.gateway.audit.chain import KEY_NAME
from cellblock.gateway.audit.log import Audit
from cellblock.gateway.dashboard.app import create_app
from cellblock.gateway.dashboard.charts import MAX_BUCKETS, SERIES
from cellblock.gateway.dashboard.timeline import AuditLog
from tests.gateway.conftest import Clock
from tests.gateway.dashboard.test_dashboard import (
    ORIGIN,
    PORT,
    SECRET,
    FakeGateways,
    assert_strict_headers,
    send,
    session,
)

ROOT = Path(__file__).resolve().parents[3]
STATIC = ROOT / "cellblock" / "gateway" / "dashboard" / "static"
T0 = 1_700_000_040  # a whole minute (and 10, 5 and 1 second)


def write(path: Path, clock: Clock, events: list[tuple[float, str, str, dict[str, Any]]]) -> None:
    """`events` (seconds after T0, event, server, fields) written by the gateway's audit code."""
    audit = Audit(path / "audit.jsonl")
    for after, event, server, fields in events:
        clock.now = T0 + after
        audit.write(event, server, **fields)
    audit.close()


def charts(path: Path, filters: dict[str, str] | None = None) -> dict[str, Any]:
    shown: dict[str, Any] = AuditLog(path / "audit.jsonl", path / KEY_NAME).read(filters or {})["charts"]
    return shown


def by_name(chart: dict[str, Any]) -> dict[str, list[int]]:
    return {item["name"]: item["counts"] for item in chart["series"]}


def call(server: str, decision: str = "allow", **fields: Any) -> tuple[str, str, dict[str, Any]]:
    return ("call", server, {"tool": "t", "decision": decision, **fields})


def test_calls_and_refusals_are_counted_per_server_in_minutes_over_an_hour(tmp_path: Path, clock: Clock) -> None:
    write(
        tmp_path,
        clock,
        [
            (0, *call("fs")),
            (0.5, "call_end", "fs", {"tool": "t", "duration_ms": 3, "is_error": False}),  # the same call's end
            (10, *call("fs", "deny", rule="default")),
            (59.9, *call("db", "deny", rule="lock")),
            (61, *call("fs")),
            (62, "egress", "fs", {"host": "x", "port": 443, "decision": "deny"}),  # a connection, not a call
            (63, "lock_changed", "db", {"items": ["tool:q"]}),
            (120, *call("db", "deny", rule="secret")),
            (125, *call("db", "ask", rule="q")),  # asked, then answered in a later record: not refused
            (59 * 60, *call("fs")),  # the last minute of the hour
        ],
    )
    shown = charts(tmp_path)
    # an hour of events: buckets of a minute, as many as fit (a span of 59 minutes, 60 buckets)
    assert shown["step"] == 60 and shown["per"] == "minute" and shown["unplaced"] == 0
    assert shown["times"] == [T0 + 60 * i for i in range(60)]
    zeros = [0] * 60
    assert by_name(shown["calls"]) == {
        "fs": [2, 1, *zeros[2:59], 1],
        "db": [1, 0, 2, *zeros[3:]],
    }
    assert [item["name"] for item in shown["calls"]["series"]] == ["fs", "db"]  # the busiest first
    assert shown["calls"]["total"] == 7
    # a refusal is a call denied, whatever denied it; fs's and db's, in their minutes
    assert by_name(shown["refusals"]) == {"db": [1, 0, 1, *zeros[3:]], "fs": [1, *zeros[1:]]}
    assert shown["refusals"]["total"] == 3


@pytest.mark.parametrize(
    ("span", "step", "per"),
    [(0, 1, "second"), (59, 1, "second"), (60, 5, "5 seconds"), (3 * 3600, 300, "5 minutes"),
     (3 * 86400, 7200, "2 hours"), (40 * 86400, 86400, "day"), (2 * 365 * 86400, 2 * 604800, "2 weeks")],
)  # fmt: skip
def test_the_buckets_are_chosen_from_the_span_and_each_call_lands_in_its_own(
    tmp_path: Path, clock: Clock, span: int, step: int, per: str
) -> None:
    # calls spread over the span, oldest first: the buckets grow as the span read so far grows
    afters = sorted({round(span * (i / 37) ** 2, 3) for i in range(38)})
    write(tmp_path, clock, [(after, *call("fs" if i % 3 else "db")) for i, after in enumerate(afters)])
    shown = charts(tmp_path)
    assert (shown["step"], shown["per"]) == (step, per)
    assert 1 <= len(shown["times"]) <= MAX_BUCKETS
    # the counts are those of each call's own bucket, computed here from the times written
    first = (T0 + afters[0]) // step
    expected: dict[str, Counter[int]] = {"fs": Counter(), "db": Counter()}
    for i, after in enumerate(afters):
        expected["fs" if i % 3 else "db"][int((T0 + after) // step - first)] += 1
    assert by_name(shown["calls"]) == {
        name: [buckets[i] for i in range(len(shown["times"]))] for name, buckets in expected.items() if buckets
    }
    assert shown["times"][0] == first * step and shown["times"][-1] == (T0 + afters[-1]) // step * step


def test_past_the_busiest_servers_the_rest_are_summed_as_one_series(tmp_path: Path, clock: Clock) -> None:
    # server sN makes N+1 calls, s0 one of them refused
    events = [
        (n * 0.1, *call(f"s{n}", "deny" if n == 0 and i == 0 else "allow")) for n in range(9) for i in range(n + 1)
    ]
    write(tmp_path, clock, events)
    shown = charts(tmp_path)
    series = shown["calls"]["series"]
    assert len(series) == SERIES
    assert [(s["name"], s["other"]) for s in series[:-1]] == [(f"s{n}", False) for n in (8, 7, 6, 5, 4)]
    assert series[-1]["name"] == "4 other servers" and series[-1]["other"] is True
    assert sum(series[-1]["counts"]) == 1 + 2 + 3 + 4  # s0 to s3
    assert sum(sum(s["counts"]) for s in series) == shown["calls"]["total"] == 45
    # the refusals chart ranks its own: s0, the one server refused, alone
    assert [(s["name"], s["counts"]) for s in shown["refusals"]["series"]] == [("s0", [1])]


def test_as_many_servers_as_lines_are_each_drawn_and_none_summed(tmp_path: Path, clock: Clock) -> None:
    # the control of the one above: SERIES servers, SERIES lines, no "other"
    write(tmp_path, clock, [(0, *call(f"s{n}")) for n in range(SERIES)])
    series = charts(tmp_path)["calls"]["series"]
    assert len(series) == SERIES and not any(s["other"] for s in series)


def test_an_empty_log_and_one_without_calls_draw_nothing(tmp_path: Path, clock: Clock) -> None:
    empty = {"total": 0, "series": []}
    nothing = charts(tmp_path)  # no log at all
    assert nothing["times"] == [] and nothing["calls"] == nothing["refusals"] == empty
    write(tmp_path, clock, [(0, "server_ready", "fs", {"tools": 2}), (5, "lock_held", "fs", {"items": []})])
    assert charts(tmp_path)["calls"] == empty and charts(tmp_path)["times"] == []
    write(tmp_path, clock, [(9, *call("fs"))])  # the control: one call is drawn
    assert by_name(charts(tmp_path)["calls"]) == {"fs": [1]}


def test_the_charts_count_only_the_events_the_filters_match(tmp_path: Path, clock: Clock) -> None:
    write(tmp_path, clock, [(0, *call("fs")), (1, *call("db", "deny")), (2, *call("fs", "deny"))])
    assert set(by_name(charts(tmp_path)["calls"])) == {"fs", "db"}  # the control: unfiltered
    assert by_name(charts(tmp_path, {"server": "fs"})["calls"]) == {"fs": [1, 0, 1]}
    assert by_name(charts(tmp_path, {"decision": "allow"})["refusals"]) == {}
    assert charts(tmp_path, {"kind": "lock_approved"})["times"] == []


def test_a_hostile_server_name_is_given_escaped_and_an_impossible_time_is_counted_apart(
    tmp_path: Path, clock: Clock
) -> None:
    hostile = "<img src=x onerror=window.__pwned=1>\x1b[31m\u202e"
    write(tmp_path, clock, [(0, *call(hostile)), (1, *call("fs")), (2, *call("fs"))])
    path = tmp_path / "audit.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    # lines edited to times no clock shows: counted apart, not drawn, and the buckets stay a second
    path.write_bytes(
        lines[0] + re.sub(rb'"ts":[0-9.]+', b'"ts":1e300', lines[1]) + lines[2].replace(b'"ts":', b'"ts":-')
    )
    shown = charts(tmp_path)
    assert shown["unplaced"] == 2 and shown["step"] == 1
    assert by_name(shown["calls"]) == {"<img src=x onerror=window.__pwned=1>\\u001b[31m\\u202e": [1]}


def test_the_charts_come_with_the_audit_behind_the_session(tmp_path: Path, clock: Clock) -> None:
    write(tmp_path, clock, [(0, *call("fs"))])
    app = create_app(PORT, SECRET, FakeGateways(), AuditLog(tmp_path / "audit.jsonl", tmp_path / KEY_NAME))
    with TestClient(app, base_url=ORIGIN) as client:
        cookie, csrf = session(client)
        refused = send(client, "GET", "/api/audit", cookie=cookie)  # no CSRF token
        assert refused.status_code == 403 and "charts" not in refused.text
        shown = send(client, "GET", "/api/audit?server=fs", cookie=cookie, csrf=csrf)
        assert shown.status_code == 200 and by_name(shown.json()["charts"]["calls"]) == {"fs": [1]}


VENDORED = re.compile(r"^\| `([^`]+)` \| `uplot@([0-9.]+)`, `[^`]+` \| `([0-9a-f]{64})` \|$", re.MULTILINE)


def test_the_vendored_files_are_the_ones_this_readme_names() -> None:
    vendor = STATIC / "vendor"
    named = VENDORED.findall((vendor / "README.md").read_text())
    assert {name for name, _, _ in named} == {p.name for p in vendor.iterdir()} - {"README.md"}
    assert {version for _, version, _ in named} == {"1.6.32"}
    for name, _, sha256 in named:
        assert hashlib.sha256((vendor / name).read_bytes()).hexdigest() == sha256, name
    # the script names its version in its first line, as the README does
    assert (vendor / "uPlot.iife.min.js").read_text().startswith("/*! https://github.com/leeoniya/uPlot (v1.6.32) */")


def test_every_static_file_ships_in_the_wheel() -> None:
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["cellblock"]
    package = ROOT / "cellblock"
    files = [p.relative_to(package).parts for p in STATIC.rglob("*") if p.is_file()]
    assert ("gateway", "dashboard", "static", "vendor", "uPlot.iife.min.js") in files
    for parts in files:
        # setuptools' `*` stops at a `/`
        assert any(len(g.split("/")) == len(parts) and all(map(fnmatch, parts, g.split("/"))) for g in globs), "/".join(
            parts
        )


@pytest.mark.parametrize("path", ["/charts.js", "/vendor/uPlot.iife.min.js", "/vendor/uPlot.min.css"])
def test_the_charts_script_and_uplot_are_served_whole_with_the_strict_headers(path: str) -> None:
    with TestClient(create_app(PORT, SECRET, FakeGateways()), base_url=ORIGIN) as client:
        served = send(client, "GET", path)
        assert served.status_code == 200 and served.content == (STATIC / path.lstrip("/")).read_bytes()
        assert served.headers["content-type"].startswith("text/css" if path.endswith(".css") else "text/javascript")
        assert_strict_headers(served)
        assert send(client, "GET", path + ".map").status_code == 404  # nothing else of the folder is served
