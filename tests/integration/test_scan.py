"""`cellblock scan`: real servers in their jails under the tracer, their claims against their deeds.

Each scan runs once per module (a fixture) and the tests read its report.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests import peers
from tests.integration.conftest import gateway, hidden_service, write_config

pytestmark = [
    pytest.mark.jail,
    pytest.mark.skipif(shutil.which("bwrap") is None or shutil.which("strace") is None, reason="needs bwrap, strace"),
]

SERVERS = Path(__file__).resolve().parents[1] / "servers"


def cellblock(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CELLBLOCK_STATE_DIR": str(config.parent / "state")}
    return subprocess.run(
        [sys.executable, "-m", "cellblock.gateway.cli.main", *args, "--config", str(config)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )


def tree(root: Path) -> dict[str, str]:
    """Every file under `root` and a digest of its bytes (symlinks by their target)."""
    found = {}
    for path in sorted(root.rglob("*")):
        if path.is_symlink():
            found[str(path)] = "-> " + os.readlink(path)
        elif path.is_file():
            found[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            found[str(path)] = "dir"
    return found


def notes_server(root: Path, *flags: str, extra: str = "") -> str:
    return (
        f"  notes:\n    command: {sys.executable}\n"
        f"    args: [{str(SERVERS / 'scanned.py')!r}, '--root', {str(root)!r}{''.join(f', {f!r}' for f in flags)}]\n"
        f"    jail:\n      read_only: [{str(SERVERS)!r}{extra}]\n      read_write: [{str(root)!r}]\n"
    )


def codes(report: dict[str, Any], where: str) -> set[str]:
    return {f["code"] for f in report["findings"] if f["where"] == where}


@pytest.fixture(scope="module")
def filesystem(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path, dict[str, str], Path]:
    """server-filesystem, told of `shared`, granted also a directory it never uses, scanned with --destructive."""
    tmp = tmp_path_factory.mktemp("fs")
    shared, unused = tmp / "shared", tmp / "unused"
    (shared / "sub").mkdir(parents=True)
    unused.mkdir()
    (shared / "a.txt").write_text("the user's own file\n")
    (shared / "sub" / "b.txt").write_text("another\n")
    before = tree(shared)
    node, script, *_ = peers.filesystem(shared)
    modules = str(peers.NODE_MODULES)
    config = tmp / "cellblock.yaml"
    config.write_text(
        "version: 1\nservers:\n  files:\n"
        f"    command: {node}\n    args: [{script!r}, {str(shared)!r}]\n"
        f"    jail:\n      read_only: [{modules!r}, {str(unused)!r}]\n      read_write: [{str(shared)!r}]\n"
    )
    done = cellblock(config, "scan", "files", "--json", "--destructive")
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout), shared, before, unused


@pytest.mark.slow
def test_server_filesystem_refuses_traversal_and_outside_paths_itself(filesystem: tuple[Any, ...]) -> None:
    report = filesystem[0]
    read = next(t for t in report["tools"] if t["name"] == "read_text_file")
    assert read["declared"]["readOnlyHint"] is True
    confined = [f for f in read["findings"] if f["code"] == "confined-path"]
    assert any("'..' traversal" in f["text"] for f in confined)
    assert any("absolute path elsewhere" in f["text"] for f in confined)
    assert any("~/.ssh/id_rsa" in f["text"] and "refused the path itself" in f["text"] for f in confined)
    assert not [f for f in report["findings"] if f["severity"] in ("medium", "high")], report["findings"]


@pytest.mark.slow
def test_server_filesystem_learned_jail_is_exactly_its_directories(filesystem: tuple[Any, ...]) -> None:
    report, shared, _, _ = filesystem
    proposed = report["proposal"]["proposed"]
    assert proposed["read_write"] == [str(shared)]
    assert proposed["read_only"] == [str(peers.NODE_MODULES)]  # the unused grant is dropped
    assert proposed["network"] == "none" and "exec" not in proposed


@pytest.mark.slow
def test_destructive_tools_touch_only_the_scratch_copies(filesystem: tuple[Any, ...]) -> None:
    report, shared, before, _ = filesystem
    called = {t["name"] for t in report["tools"] if t["calls"]}
    assert {"write_file", "edit_file", "move_file"} <= called
    assert tree(shared) == before


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("hostile")
    root = tmp / "notes"
    root.mkdir()
    (root / "a.txt").write_text("a note\n")
    config = tmp / "cellblock.yaml"
    servers = notes_server(root, "--ssh", "--phone-home", "--writes", "--shell")
    config.write_text(f"version: 1\nservers:\n{servers}")
    done = cellblock(config, "scan", "notes", "--json")
    return done, json.loads(done.stdout)


def test_hostile_fixtures_are_each_flagged_and_the_scan_fails(hostile: tuple[Any, dict[str, Any]]) -> None:
    done, report = hostile
    assert done.returncode == 1, done.stderr
    assert "secret-read" in codes(report, "read_note")  # reads ~/.ssh whatever it is asked
    assert "network-at-start" in codes(report, "start")  # connects out at start
    assert "read-only-wrote" in codes(report, "list_notes")  # a readOnlyHint tool that writes
    assert "exec-shell" in codes(report, "version")  # execs a shell
    texts = " ".join(f["text"] for f in report["findings"])
    assert "at start: connected to 192.0.2.1:443 (refused by the jail: ENETUNREACH)" in texts
    assert "opened ~/.ssh/id_rsa unasked (refused by the jail: ENOENT)" in texts
    assert "readOnlyHint tool list_notes wrote" in texts
    # a URL of the loopback host the scan started, which the jail does not reach
    (denied,) = [f for f in report["findings"] if f["code"] == "denied-host"]
    assert denied["where"] == "fetch" and "refused by the jail" in denied["text"]


def test_destructive_tools_wait_for_the_flag(hostile: tuple[Any, dict[str, Any]]) -> None:
    deleting = next(t for t in hostile[1]["tools"] if t["name"] == "delete_note")
    assert deleting["skipped"] and not deleting["calls"]


def test_apply_writes_a_jail_check_accepts_and_the_server_still_works(tmp_path: Path) -> None:
    root, unused = tmp_path / "notes", tmp_path / "unused"
    root.mkdir()
    unused.mkdir()
    (root / "a.txt").write_text("a note\n")
    before = tree(root)
    config = tmp_path / "cellblock.yaml"
    head = "# my servers\nversion: 1\nservers:\n"
    config.write_text(head + notes_server(root, extra=f", {str(unused)!r}") + "    tools: {default: allow}  # mine\n")
    done = cellblock(config, "scan", "notes", "--destructive", "--apply")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "smallest seen" in done.stdout and "wrote the proposed jail" in done.stderr
    assert tree(root) == before  # delete_note and add_note ran on a copy
    text = config.read_text()
    assert text.startswith(head) and "tools: {default: allow}  # mine" in text and str(unused) not in text
    assert cellblock(config, "check").returncode == 0
    again = cellblock(config, "scan", "notes", "--json")
    assert again.returncode == 0, again.stdout + again.stderr
    assert {t["name"] for t in json.loads(again.stdout)["tools"]} >= {"read_note", "list_notes"}


def test_a_jail_that_cannot_be_built_is_refused_and_nothing_runs(tmp_path: Path) -> None:
    ran = tmp_path / "ran"
    config = tmp_path / "cellblock.yaml"
    config.write_text(
        f"version: 1\nservers:\n  broken:\n    command: {sys.executable}\n"
        f"    args: {json.dumps(['-c', f'open({str(ran)!r}, chr(119))'])}\n"
        f"    jail: {{read_only: [{str(tmp_path / 'missing')!r}]}}\n"
    )
    kept = tmp_path / "state" / "scans" / "broken.json"  # the report of an earlier scan
    kept.parent.mkdir(parents=True, mode=0o700)
    kept.write_text('{"the": "previous report"}')
    done = cellblock(config, "scan", "broken")
    assert done.returncode == 1
    assert "was not scanned" in done.stderr and "does not exist" in done.stderr
    assert not ran.exists()
    assert kept.read_text() == '{"the": "previous report"}'  # a scan that did not run replaces nothing


def test_unjailed_and_remote_servers_are_refused(tmp_path: Path) -> None:
    config = tmp_path / "cellblock.yaml"
    config.write_text(
        f"version: 1\nservers:\n  loose:\n    command: {sys.executable}\n    jail: false\n"
        "  far:\n    url: https://example.com/mcp\n"
    )
    loose = cellblock(config, "scan", "loose")
    assert loose.returncode == 1 and "never runs a server unjailed" in loose.stderr
    far = cellblock(config, "scan", "far")
    assert far.returncode == 2 and "remote server" in far.stderr


def test_a_server_with_no_work_grant_is_still_probed_and_not_blamed_for_what_it_was_asked(tmp_path: Path) -> None:
    """The demo's snoop opens any path it is given and has no directory of the user's: the hostile
    probes still go (a path outside every grant, refused by the jail), and opening the plain value
    it was given, from its working directory, is what it was asked, not a secret read."""
    demo = Path(__file__).resolve().parents[2] / "cellblock" / "demo"
    config = tmp_path / "cellblock.yaml"
    config.write_text(
        f"version: 1\nservers:\n  snoop:\n    command: {sys.executable}\n"
        f"    args: [{str(demo / 'snoop.py')!r}]\n    jail:\n      read_only: [{str(demo)!r}]\n"
    )
    done = cellblock(config, "scan", "snoop", "--json")
    report = json.loads(done.stdout)
    assert "secret-read" not in codes(report, "read_file"), report["findings"]
    assert "unconfined-path" in codes(report, "read_file")
    assert done.returncode == 1


def test_report_and_badge_are_the_same_for_two_scans_but_for_the_time(tmp_path: Path) -> None:
    root = tmp_path / "notes"
    root.mkdir()
    (root / "a.txt").write_text("a note\n")
    config = tmp_path / "cellblock.yaml"
    # a key written in its arguments, a secret in its env: neither is in a report
    servers = notes_server(root, "--ssh", "--shell", "--api-key", "hunter2-is-long")
    config.write_text(f"version: 1\nservers:\n{servers}    env: {{NOTES_PASSWORD: correct horse}}\n")
    reports = []
    for run in ("1", "2"):
        done = cellblock(
            config,
            "scan",
            "notes",
            "--report",
            str(tmp_path / f"r{run}.json"),
            "--badge",
            str(tmp_path / f"b{run}.svg"),
        )
        assert done.returncode == 1, done.stderr
        reports.append(json.loads((tmp_path / f"r{run}.json").read_text()))
    first, second = reports
    # the latest report is kept for the dashboard, 0600 in the state directory: the second's
    kept = tmp_path / "state" / "scans" / "notes.json"
    assert json.loads(kept.read_text()) == second and kept.stat().st_mode & 0o777 == 0o600
    assert "hunter2-is-long" in config.read_text()  # the control: the config has the key
    for text in (kept.read_text(), (tmp_path / "r1.json").read_text()):
        assert "hunter2-is-long" not in text and "correct horse" not in text
    assert first["server"]["args"][-2:] == ["--api-key", "[redacted]"]
    assert first.pop("scanned_at") and second.pop("scanned_at")
    assert first == second
    assert "cellblock-scan-notes-" not in json.dumps(first)  # no scratch path that differs run to run
    assert first["server"]["command"] == sys.executable
    assert first["server"]["files_sha256"][str(SERVERS / "scanned.py")].startswith("sha256:")
    summary = first["summary"]
    assert not summary["fs"]["confined"] and "secret-read" in summary["fs"]["failed"]
    assert not summary["exec"]["confined"] and summary["exec"]["failed"] == ["exec-shell"]
    assert first["jail"]["configured"]["read_write"] == [str(root)]
    badge = (tmp_path / "b1.svg").read_text()
    assert badge == (tmp_path / "b2.svg").read_text() and "fs ✗" in badge and "exec ✗" in badge


def test_a_secret_the_server_shows_in_a_finding_is_not_printed(tmp_path: Path) -> None:
    root = tmp_path / "notes"
    root.mkdir()
    # the server reads a path that holds its own API key: the finding names that path
    leak = os.path.expanduser("~/.ssh/hunter2-is-long")
    printed = {}
    for keyed in (True, False):
        config = tmp_path / f"{keyed}.yaml"
        flags = ("--read", leak, *(("--api-key", "hunter2-is-long") if keyed else ()))
        config.write_text(f"version: 1\nservers:\n{notes_server(root, *flags)}")
        for form in ((), ("--json",)):
            done = cellblock(config, "scan", "notes", *form)
            assert done.returncode in (0, 1), done.stderr
            printed[(keyed, form)] = done.stdout
    # the control: where the value is no secret of the server's, the path is printed as it is
    assert all(leak in printed[(False, form)] for form in ((), ("--json",))), printed
    for form in ((), ("--json",)):
        assert "hunter2-is-long" not in printed[(True, form)] and "[redacted]" in printed[(True, form)]


def server_in_its_own_grant(tmp_path: Path) -> tuple[Path, Path, dict[str, Any]]:
    """A server whose code is in the directory it is granted read_write (so a scan does not copy
    it), and which writes over a file of the user's there at start."""
    project = tmp_path / "project"
    project.mkdir()
    for script in ("steering.py", "raw.py"):
        shutil.copy(SERVERS / script, project / script)
    notes = project / "notes.txt"
    notes.write_bytes(b"the user's own notes\n")
    server = {
        "command": sys.executable,
        "args": [str(project / "steering.py"), "--clobber", str(notes)],
        "jail": {"read_write": [str(project)]},
    }
    return project, notes, server


def test_a_scan_never_writes_a_grant_it_does_not_copy(tmp_path: Path) -> None:
    project, notes, server = server_in_its_own_grant(tmp_path)
    before = tree(project)
    config = tmp_path / "cellblock.yaml"
    config.write_text(json.dumps({"version": 1, "servers": {"steer": server}}))
    done = cellblock(config, "scan", "steer", "--json", "--destructive")
    assert done.returncode in (0, 1) and "was not scanned" not in done.stderr, done.stderr
    assert notes.read_bytes() == b"the user's own notes\n"
    assert tree(project) == before
    report = json.loads(done.stdout)
    assert f"wrote {notes}, which the jail shows read-only (refused)" in report["proposal"]["notes"]
    # what it tried to write stays read_write in the proposal: the scan, not the user, made it read-only
    assert report["proposal"]["proposed"]["read_write"] == [str(project)]


@pytest.mark.anyio
async def test_control_served_with_the_same_grant_the_server_writes_the_users_file(tmp_path: Path) -> None:
    _, notes, server = server_in_its_own_grant(tmp_path)
    config = write_config(tmp_path, {"steer": server})
    async with gateway(config, tmp_path / "state") as client:
        await client.call_tool("steer__read", {"path": str(notes)})
    assert notes.read_bytes() == b"clobbered\n"


def test_a_scan_never_proposes_a_program_of_its_own_world(tmp_path: Path) -> None:
    """The server runs a script it wrote into its copy of the user's directory: that file is the
    scan's, gone when the scan ends, and a path under /tmp that anyone could make again; --apply
    never writes it into exec.allow (nor any other path of the scan's world)."""
    work = tmp_path / "work"
    work.mkdir()
    server = {
        "command": sys.executable,
        "args": [str(SERVERS / "steering.py")],
        "jail": {"read_only": [str(SERVERS)], "read_write": [str(work)]},
    }
    config = write_config(tmp_path, {"steer": server})
    done = cellblock(config, "scan", "steer", "--json", "--apply", "--fail-on", "never")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    run = next(t for t in report["tools"] if t["name"] == "run")
    assert run["calls"][0]["observed"], run  # the control: it did run its script, in the copy
    assert "cellblock-scan-" not in config.read_text()
    assert any("is no program on this machine" in n for n in report["proposal"]["notes"]), report["proposal"]


@pytest.mark.anyio
async def test_control_a_program_named_in_exec_allow_is_whatever_is_there_at_the_next_start(tmp_path: Path) -> None:
    """What writing a scan's path into exec.allow would give: whoever makes that path again
    decides what the jail runs (here, a script that writes into the server's grant)."""
    work = tmp_path / "work"
    work.mkdir()
    planted = tmp_path / "cellblock-scan-steer-x" / "grants" / "0-work" / "cellblock-scan.txt"
    planted.parent.mkdir(parents=True)
    planted.write_text(f"#!/bin/sh\necho planted > {work}/marker\n")
    planted.chmod(0o755)
    server = {
        "command": sys.executable,
        "args": [str(SERVERS / "steering.py")],
        "jail": {"read_only": [str(SERVERS)], "read_write": [str(work)], "exec": {"allow": [str(planted)]}},
    }
    config = write_config(tmp_path, {"steer": server})
    async with gateway(config, tmp_path / "state") as client:
        ran = await client.call_tool("steer__run", {"path": str(planted)})
    assert (work / "marker").read_text() == "planted\n", ran


def a_service(tmp_path: Path, grant: str) -> tuple[socket.socket, dict[str, Any]]:
    """A service of the user's behind a Unix socket the jail's socket finder does not know
    (`hidden_service`: not accepting yet, what dials it waits in its backlog), and a server that
    dials it at start, granted `grant`: "socket", the socket; "directory", a directory holding it."""
    (tmp_path / "run").mkdir()
    sock = tmp_path / "run" / "db.sock"
    listening = hidden_service(sock)
    server = {
        "command": sys.executable,
        "args": [str(SERVERS / "steering.py"), "--dial", str(sock)],
        "jail": {"read_only": [str(SERVERS)], "read_write": [str(sock if grant == "socket" else sock.parent)]},
    }
    return listening, server


@pytest.mark.parametrize("grant", ["socket", "directory"])
def test_a_scan_never_lets_a_server_reach_a_service_through_its_grant(tmp_path: Path, grant: str) -> None:
    """A socket shown read-only is still connected to: a scan of a server granted one, or a
    directory holding one, is refused, and nothing dialed the service."""
    listening, server = a_service(tmp_path, grant)
    with listening:
        config = write_config(tmp_path, {"steer": server})
        done = cellblock(config, "scan", "steer", "--destructive")
        with pytest.raises(BlockingIOError):
            listening.accept()
    said = "is a socket" if grant == "socket" else "which cannot be copied for a scan"
    assert done.returncode == 1 and said in done.stderr, done.stderr


@pytest.mark.anyio
async def test_control_served_with_the_same_grant_the_server_reaches_the_service(tmp_path: Path) -> None:
    """The directory holding the service's socket, served: the jail shows the socket, which it does
    not know (a grant of the socket itself, any socket, the jail refuses at every start)."""
    listening, server = a_service(tmp_path, "directory")
    with listening:
        config = write_config(tmp_path, {"steer": server})
        async with gateway(config, tmp_path / "state") as client:
            await client.call_tool("steer__read", {"path": "/"})
        dialed, _ = listening.accept()  # it dialed at start, before it answered
        with dialed:
            dialed.setblocking(True)
            assert dialed.recv(16) == b"dialed"
