"""`cellblock scan --report/--badge`: the summary per dimension and the badge drawn from it."""

from __future__ import annotations

import hashlib
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from cellblock.gateway.config.model import LocalServer
from cellblock.gateway.scan.findings import Finding, Severity, noise
from cellblock.gateway.scan.report import _identity, _stable, badge_svg, summary
from cellblock.gateway.scan.scratch import Scratch
from cellblock.gateway.state import atomic_write_json
from cellblock.sandbox.trace import Event, Kind

SVG = "{http://www.w3.org/2000/svg}"


def texts(svg: str) -> list[str]:
    root = ET.fromstring(svg)
    assert root.tag == f"{SVG}svg"
    # self-contained: nothing it draws is fetched from elsewhere
    assert "href" not in svg and "@import" not in svg and "url(" not in svg
    return [t.text or "" for t in root.iter(f"{SVG}text")]


def test_a_confined_summary_makes_a_green_badge_with_every_dimension_ticked() -> None:
    found = [
        Finding(Severity.LOW, "fetch", "network", "fetch: looked up a name"),
        Finding(Severity.INFO, "t", "confined-path", "x"),
    ]
    result = summary(found, "medium")
    assert result["confined"] and all(result[d]["confined"] for d in ("fs", "net", "exec"))
    assert texts(badge_svg(result)) == ["cellblock", "confined · fs ✓ net ✓ exec ✓"]


def test_a_failing_summary_names_what_failed() -> None:
    found = [
        Finding(Severity.HIGH, "start", "secret-read", "at start: opened ~/.ssh/id_rsa unasked"),
        Finding(Severity.HIGH, "version", "exec-shell", "version: executes /bin/sh"),
        Finding(Severity.LOW, "fetch", "network", "fetch: looked up a name"),
    ]
    result = summary(found, "medium")
    assert not result["confined"]
    assert result["fs"] == {"confined": False, "failed": ["secret-read"], "worst": "high"}
    assert result["net"]["confined"] and not result["exec"]["confined"]
    svg = badge_svg(result)
    assert texts(svg) == ["cellblock", "not confined · fs ✗ net ✓ exec ✗"]
    assert 'fill="#c62828"' in svg
    # the threshold is --fail-on's: at low, the lookup fails net too; at never, nothing fails
    assert not summary(found, "low")["net"]["confined"]
    assert summary(found, "never")["confined"]


def test_the_scans_own_world_gets_names_that_are_the_same_every_run(tmp_path: Path) -> None:
    class Port:
        port = 40123

    scratch = Scratch(tmp_path / "s", tmp_path / "s" / "home", tmp_path / "s" / "outside" / "x")
    scratch.copies["/data/notes"] = str(tmp_path / "s" / "grants" / "0-notes")
    value = {
        "a": [f"{tmp_path}/s/grants/0-notes/a.txt", f"{tmp_path}/s/home/.ssh/id_rsa"],
        "b": f"read {tmp_path}/s/outside/x from http://127.0.0.1:40123/cellblock-scan",
    }
    assert _stable(value, scratch, Port()) == {  # type: ignore[arg-type]
        "a": ["/data/notes/a.txt", "~/.ssh/id_rsa"],
        "b": "read <scan>/outside/x from http://127.0.0.1:<denied-port>/cellblock-scan",
    }


def test_the_server_is_named_as_configured_with_its_package_or_its_programs_digest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CELLBLOCK_DATA_DIR", str(tmp_path / "data"))
    record = {
        "ecosystem": "npm",
        "name": "pkg",
        "version": "1.2.3",
        "tree": str(tmp_path / "tree"),
        "digest": "sha256:" + "ab" * 32,
        "installed_at": 0.0,
        "files": {},
    }
    atomic_write_json(tmp_path / "data" / "installs" / "srv.json", record)
    source = tmp_path / "cellblock.yaml"
    source.write_text("version: 1\nservers:\n  srv:\n    install: {npm: pkg}\n  py:\n    command: ${PY}\n")
    identity = _identity("srv", LocalServer.model_validate({"install": {"npm": "pkg"}}), source)
    assert identity["package"] == {
        "ecosystem": "npm",
        "name": "pkg",
        "version": "1.2.3",
        "tree_digest": "sha256:" + "ab" * 32,
    }
    script = tmp_path / "server.py"
    script.write_text("print('hi')\n")
    plain = LocalServer.model_validate({"command": sys.executable, "args": [str(script), "--flag"]})
    identity = _identity("py", plain, source)
    assert identity["command"] == "${PY}" and identity["args"] == [str(script), "--flag"]  # as the config spells it
    assert identity["program_sha256"] == "sha256:" + hashlib.sha256(Path(sys.executable).read_bytes()).hexdigest()
    assert identity["files_sha256"] == {str(script): "sha256:" + hashlib.sha256(script.read_bytes()).hexdigest()}


def test_an_editable_installs_import_hook_tried_as_a_path_is_no_finding_and_a_file_so_named_is() -> None:
    """Python tries each sys.path name as a directory where it runs: the hook of an editable install
    (as `./dev` installs Cellblock, whose Python runs the demo's servers) is one, not a file read."""
    hook = "/home/u/__editable__.cellblock-0.1.0.finder.__path_hook__"
    assert noise(Event(0.0, 1, Kind.READ, hook, "openat", errno="ENOENT"))
    assert not noise(Event(0.0, 1, Kind.READ, hook, "openat"))  # one that opened is a file: reported
    assert not noise(Event(0.0, 1, Kind.READ, "/home/u/__editable__.notes", "openat", errno="ENOENT"))
