"""The escape attempts, run unjailed: the honest control that each attempt can succeed, and can fail.

Inside a jail every attempt must come back blocked; that only means something if the same attempt
gets through here, where nothing stops it, and is reported blocked when its target does not exist.
"""

from __future__ import annotations

import ast
import ctypes
import json
import os
import shutil
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from cellblock.sandbox import escape
from cellblock.sandbox.escape import Attempt
from tests.kernel_keys import keyrings_usable, planted_key

ESCAPE = Path(escape.__file__).parent  # a folder python runs as a script
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
root_only = pytest.mark.skipif(not IS_ROOT, reason="needs root: CapEff is zero for other users")


@pytest.fixture
def listener() -> Iterator[tuple[str, int]]:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(4)
        yield sock.getsockname()


def closed_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_cli(spec: object, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ESCAPE), "--json", json.dumps(spec)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


# --- read ------------------------------------------------------------------------------------


def test_reading_a_readable_file_gets_through_without_reporting_its_bytes(tmp_path: Path) -> None:
    secret = tmp_path / "id_ed25519"
    secret.write_text("SECRET-KEY-MATERIAL")
    result = escape.read_file(str(secret))
    assert result == Attempt("read", str(secret), True, "read 1 byte")
    assert "SECRET" not in json.dumps(result.to_dict())


def test_reading_a_missing_file_is_blocked(tmp_path: Path) -> None:
    result = escape.read_file(str(tmp_path / "nope"))
    assert not result.got_through
    assert "ENOENT" in result.detail


def test_reading_an_empty_file_reads_no_byte_so_is_not_through(tmp_path: Path) -> None:
    (tmp_path / "empty").touch()
    assert not escape.read_file(str(tmp_path / "empty")).got_through


def test_reading_a_fifo_does_not_hang(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert not escape.read_file(str(fifo)).got_through


def test_an_attempt_that_errors_reports_instead_of_raising() -> None:
    result = escape.read_file("/tmp/nul\0byte")
    assert not result.got_through
    assert result.detail == "attempt failed unexpectedly: ValueError"


# --- list ------------------------------------------------------------------------------------


def test_listing_shows_an_expected_entry(tmp_path: Path) -> None:
    (tmp_path / ".ssh").mkdir()
    result = escape.list_dir(str(tmp_path), [".ssh", ".gnupg"])
    assert result.got_through
    assert "['.ssh']" in result.detail


def test_listing_without_the_expected_entries_is_not_through(tmp_path: Path) -> None:
    (tmp_path / "other").touch()
    assert not escape.list_dir(str(tmp_path), [".ssh"]).got_through


def test_listing_with_no_expected_names_counts_any_entry(tmp_path: Path) -> None:
    assert not escape.list_dir(str(tmp_path), []).got_through
    (tmp_path / "x").touch()
    assert escape.list_dir(str(tmp_path), []).got_through


def test_listing_a_missing_directory_is_blocked(tmp_path: Path) -> None:
    assert not escape.list_dir(str(tmp_path / "nope"), ["x"]).got_through


# --- write -----------------------------------------------------------------------------------


def test_creating_a_file_gets_through_and_removes_it(tmp_path: Path) -> None:
    target = tmp_path / ".bashrc"
    result = escape.write_file(str(target))
    assert result.got_through
    assert result.detail.endswith("; removed")
    assert not target.exists()


def test_writing_an_existing_file_gets_through_and_leaves_it_unchanged(tmp_path: Path) -> None:
    target = tmp_path / ".bashrc"
    target.write_text("original\n")
    result = escape.write_file(str(target), "evil\n")
    assert result.got_through
    assert target.read_text() == "original\n"


def test_a_kept_write_leaves_the_file_for_the_caller_to_find(tmp_path: Path) -> None:
    target = tmp_path / "canary"
    result = escape.run_spec([{"kind": "write", "target": str(target), "keep": True}])[0]
    assert result.got_through and target.exists()


def test_writing_into_a_missing_directory_is_blocked(tmp_path: Path) -> None:
    assert not escape.write_file(str(tmp_path / "nope" / "x")).got_through


@pytest.mark.skipif(IS_ROOT, reason="root ignores file modes")
def test_writing_a_read_only_file_is_blocked(tmp_path: Path) -> None:
    target = tmp_path / "ro"
    target.write_text("x")
    target.chmod(0o444)
    assert not escape.write_file(str(target)).got_through


# --- network ---------------------------------------------------------------------------------


def test_connecting_to_a_listener_gets_through(listener: tuple[str, int]) -> None:
    result = escape.connect(*listener)
    assert result == Attempt("connect", f"127.0.0.1:{listener[1]}", True, "connected to 127.0.0.1")


def test_connecting_to_a_closed_port_is_blocked() -> None:
    result = escape.connect("127.0.0.1", closed_port())
    assert not result.got_through
    assert "ECONNREFUSED" in result.detail


def test_resolving_localhost_gets_through() -> None:
    assert escape.resolve("localhost").got_through


def test_resolving_a_reserved_invalid_name_is_blocked() -> None:
    # RFC 6761: .invalid never resolves
    assert not escape.resolve("cellblock-escape.invalid").got_through


# --- exec ------------------------------------------------------------------------------------


def test_running_true_gets_through() -> None:
    assert escape.exec_binary(["/bin/true"]).got_through


def test_a_binary_that_prints_gets_through_even_when_it_fails() -> None:
    result = escape.exec_binary(["/bin/sh", "-c", "echo hi; exit 3"])
    assert result.got_through
    assert result.detail == "exit status 3, 3 bytes on stdout, 0 on stderr"


def test_a_program_that_only_complains_on_stderr_did_not_run() -> None:
    # what a loader or an interpreter says when it refuses its target
    assert not escape.exec_binary(["/bin/sh", "-c", "echo refused >&2; exit 127"]).got_through


def test_a_silent_failing_binary_is_not_through() -> None:
    assert not escape.exec_binary(["/bin/false"]).got_through


def test_running_a_missing_binary_is_blocked(tmp_path: Path) -> None:
    assert not escape.exec_binary([str(tmp_path / "nope")]).got_through
    assert not escape.exec_binary([]).got_through


# --- D-Bus -----------------------------------------------------------------------------------


@pytest.fixture
def unix_listener(tmp_path: Path) -> Iterator[str]:
    path = str(tmp_path / "bus")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.bind(path)
        sock.listen(4)
        yield path


@pytest.fixture
def abstract_listener() -> Iterator[str]:
    name = f"/tmp/dbus-cellblock-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.bind("\0" + name)
        sock.listen(4)
        yield name


def test_a_bus_socket_given_by_address_gets_through(unix_listener: str) -> None:
    result = escape.dbus(f"unix:path={unix_listener},guid=0123")
    assert result.got_through
    assert f"{unix_listener}: CONNECTED" in result.detail


def test_an_abstract_bus_name_gets_through(abstract_listener: str) -> None:
    assert escape.dbus("", [abstract_listener]).got_through
    assert escape.dbus(f"unix:abstract={abstract_listener}").got_through
    assert escape.dbus(f"@{abstract_listener}").got_through


def test_missing_bus_sockets_are_blocked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DBUS_SESSION_BUS_ADDRESS", raising=False)
    default_buses = [f"/run/user/{os.getuid()}/bus", "/run/dbus/system_bus_socket"]
    if any(os.path.exists(p) for p in default_buses):
        pytest.skip("this machine runs a D-Bus daemon")
    result = escape.dbus(f"unix:path={tmp_path / 'nope'}", [f"/tmp/dbus-{uuid.uuid4().hex}"])
    assert not result.got_through
    assert "ECONNREFUSED" in result.detail  # the abstract name: nothing listens


# --- processes -------------------------------------------------------------------------------


def test_a_named_process_in_another_session_is_seen() -> None:
    child = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        result = escape.host_processes(child.pid, handful=10**6)
        assert result.got_through
        assert f"pid {child.pid} listed" in result.detail
    finally:
        child.kill()
        child.wait()


def test_a_pid_that_does_not_exist_is_not_seen() -> None:
    child = subprocess.Popen(["true"])
    child.wait()  # reaped: its PID is free, and reuse within the test is vanishingly unlikely
    assert not escape.host_processes(child.pid, handful=10**6).got_through


def test_many_processes_outside_our_session_count_as_the_hosts() -> None:
    children = [subprocess.Popen(["sleep", "30"], start_new_session=True) for _ in range(3)]
    try:
        assert escape.host_processes(None, handful=2).got_through
    finally:
        for child in children:
            child.kill()
            child.wait()


# --- privileges ------------------------------------------------------------------------------


@root_only
def test_root_unjailed_has_capabilities() -> None:
    result = escape.capabilities()
    assert result.got_through
    assert result.detail.startswith("CapEff=")


@root_only
def test_root_unjailed_can_make_a_user_namespace_without_leaving_its_own() -> None:
    before = os.readlink("/proc/self/ns/user")
    assert escape.new_user_namespace().got_through
    assert os.readlink("/proc/self/ns/user") == before


def test_remounting_a_missing_path_is_blocked(tmp_path: Path) -> None:
    result = escape.remount_rw(str(tmp_path / "nope"))
    assert not result.got_through


@root_only
@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs util-linux unshare")
def test_root_remounts_a_read_only_bind_without_changing_it_for_anyone_else(tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    spec = json.dumps([{"kind": "remount", "target": str(ro)}, {"kind": "write", "target": str(ro / "x")}])
    script = (
        f"mount --bind {ro} {ro} && mount -o remount,ro,bind {ro} && "
        f"{sys.executable} {ESCAPE} --json '{spec}'; "
        # the fields, not the line: under a tmpfs /tmp a bind's root is relative to it, not the full path
        f"awk -v p={ro} '$5 == p && $6 ~ /^ro(,|$)/ {{ok=1}} END {{exit !ok}}' /proc/self/mountinfo && echo STILL-RO"
    )
    proc = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if "Operation not permitted" in proc.stderr:
        pytest.skip("cannot make a mount namespace here")
    lines = proc.stdout.splitlines()
    remount, write = json.loads(lines[0])
    assert remount["got_through"], remount
    assert not write["got_through"], "the read-only bind was writable before any remount"
    assert lines[1] == "STILL-RO", "the attempt changed the caller's mount"


def test_privileges_reports_each_part(tmp_path: Path) -> None:
    result = escape.privileges(str(tmp_path / "nope"))
    assert result.detail.count("(") >= 3
    assert "remount blocked" in result.detail


# --- kernel keyring --------------------------------------------------------------------------

needs_keyrings = pytest.mark.skipif(not keyrings_usable(), reason="this kernel has no keyrings")
KEY_SPEC_SESSION_KEYRING = -3


def session_keyring() -> int:
    """The serial of this process's session keyring (KEYCTL_GET_KEYRING_ID, without creating one)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    number = escape.KEYCTL_SYSCALL[os.uname().machine]
    return int(libc.syscall(ctypes.c_long(number), ctypes.c_long(0), ctypes.c_long(KEY_SPEC_SESSION_KEYRING), 0))


@needs_keyrings
def test_a_key_in_the_user_keyring_is_read_without_reporting_its_bytes() -> None:
    with planted_key() as key:
        result = escape.keyring(key.description)
    assert result.got_through, result.detail
    assert f"read {len(key.payload)} bytes" in result.detail
    assert key.payload.decode() not in json.dumps(result.to_dict())


@needs_keyrings
def test_a_key_that_is_not_there_is_not_read() -> None:
    result = escape.keyring(f"cellblock-test:absent-{uuid.uuid4().hex}")
    assert not result.got_through
    assert "the target not among them" in result.detail and "search: ENOKEY" in result.detail


@needs_keyrings
def test_the_keyring_attempt_leaves_the_callers_session_keyring_alone() -> None:
    before = session_keyring()
    with planted_key() as key:
        escape.keyring(key.description)
    assert session_keyring() == before


# --- CLI -------------------------------------------------------------------------------------


def test_cli_prints_results_and_exits_1_when_something_got_through(tmp_path: Path, listener: tuple[str, int]) -> None:
    (tmp_path / "f").write_text("x")
    spec = [
        {"kind": "read", "target": str(tmp_path / "f")},
        {"kind": "list", "target": str(tmp_path), "expect": ["f"]},
        {"kind": "write", "target": str(tmp_path / "new")},
        {"kind": "connect", "target": f"127.0.0.1:{listener[1]}"},
        {"kind": "resolve", "target": "localhost"},
        {"kind": "exec", "argv": ["/bin/true"]},
        {"kind": "read", "target": str(tmp_path / "missing")},
    ]
    # cwd is the sandbox directory: its types.py must not shadow the standard library's
    proc = run_cli(spec, ESCAPE.parent)
    assert proc.returncode == 1, proc.stderr
    results = json.loads(proc.stdout)
    assert [r["got_through"] for r in results] == [True] * 6 + [False]
    assert [r["name"] for r in results] == ["read", "list", "write", "connect", "resolve", "exec", "read"]
    assert results[5]["target"] == "/bin/true"
    assert "escape: GOT THROUGH read" in proc.stderr


def test_cli_exits_0_when_nothing_got_through(tmp_path: Path) -> None:
    spec = [
        {"kind": "read", "target": str(tmp_path / "missing")},
        {"kind": "connect", "target": f"127.0.0.1:{closed_port()}"},
        {"kind": "exec", "argv": [str(tmp_path / "missing")]},
    ]
    proc = run_cli(spec, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert [r["got_through"] for r in json.loads(proc.stdout)] == [False, False, False]


def test_cli_reads_the_spec_from_stdin(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(ESCAPE), "--json", "-"],
        input=json.dumps([{"kind": "read", "target": str(tmp_path / "missing")}]),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)[0]["name"] == "read"


@pytest.mark.parametrize(
    "spec",
    [
        {"kind": "read", "target": "/x"},
        [{"kind": "teleport", "target": "/x"}],
        [{"kind": "read"}],
        [{"kind": "connect", "target": "no-port"}],
        [{"kind": "exec", "argv": "/bin/true"}],
        [{"kind": "list", "target": "/", "expect": [1]}],
        [{"kind": "processes", "pid": "1"}],
        [{"kind": "fork", "ceiling": "many"}],
        [{"kind": "memory", "mib": -1}],
    ],
)
def test_cli_rejects_a_bad_spec_before_running_anything(spec: object, tmp_path: Path) -> None:
    proc = run_cli(
        [{"kind": "write", "target": str(tmp_path / "x")}, *spec] if isinstance(spec, list) else spec, tmp_path
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.startswith("escape: bad spec:")
    assert not (tmp_path / "x").exists()


def test_cli_rejects_text_that_is_not_json(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(ESCAPE), "--json", "[not json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith("escape: bad spec:")


# --- resources -------------------------------------------------------------------------------


def test_a_fork_bomb_unjailed_makes_every_process_it_asks_for_and_ends_them(tmp_path: Path) -> None:
    proc = run_cli([{"kind": "fork", "ceiling": 50}], tmp_path)
    (result,) = json.loads(proc.stdout)
    assert result["got_through"] and result["amount"] == 50, result
    assert result["detail"] == "made 50 of 50 (none refused)"


def test_a_memory_hog_unjailed_has_all_it_asks_for(tmp_path: Path) -> None:
    (result,) = json.loads(run_cli([{"kind": "memory", "mib": 128, "step": 32}], tmp_path).stdout)
    assert result["got_through"] and result["amount"] == 128, result


def test_a_memory_hog_refused_memory_says_how_much_it_had(tmp_path: Path) -> None:
    spec = json.dumps([{"kind": "memory", "mib": 512}])
    # RLIMIT_DATA binds root too; set in the child alone, before it runs
    bounded = [sys.executable, "-c", LIMITED_DATA, str(ESCAPE), spec]
    proc = subprocess.run(bounded, cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False)
    (result,) = json.loads(proc.stdout)
    assert not result["got_through"] and result["amount"] < 256 and "MemoryError" in result["detail"], result


LIMITED_DATA = """
import resource, runpy, sys
resource.setrlimit(resource.RLIMIT_DATA, (256 << 20, 256 << 20))
sys.argv = [sys.argv[1], "--json", sys.argv[2]]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


# --- standalone ------------------------------------------------------------------------------


def test_escape_imports_only_the_standard_library_and_itself() -> None:
    imported: set[str] = set()
    for module in sorted(ESCAPE.glob("*.py")):
        for node in ast.walk(ast.parse(module.read_text())):
            if isinstance(node, ast.Import):
                imported.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                imported.add((node.module or "").split(".")[0])
            elif isinstance(node, ast.ImportFrom):
                # its own modules only: the folder is loaded as a package by its path in a jail
                assert node.level == 1 and (ESCAPE / f"{node.module}.py").is_file(), f"{module.name}: {ast.dump(node)}"
    outside = imported - set(sys.stdlib_module_names) - {"__future__"}
    assert not outside, f"the escape attempts import {outside}; they run in a jail with a bare python3"


def test_a_copied_program_runs_through_the_loader_unjailed(tmp_path: Path) -> None:
    outcome = escape.load_copy(str(tmp_path / "copy"), "/bin/true")
    assert outcome.got_through, outcome.detail
    assert not (tmp_path / "copy").exists()  # the copy is removed again


def test_a_program_runs_from_a_memfd_unjailed() -> None:
    outcome = escape.memfd_exec("/bin/true")
    assert outcome.got_through, outcome.detail


@pytest.mark.skipif(os.getuid() != 0, reason="only uid 0 may write sysctls")
def test_root_writes_a_sysctl_unjailed_without_any_capability_needed() -> None:
    outcome = escape.sysctl("/proc/sys/vm/stat_interval")
    assert outcome.got_through, outcome.detail
