"""The tracer: strace around a real jail (seccomp filter, limits held at --block-fd) sees what the
server does and how the jail answers, and nothing of bwrap's own setup."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest

from cellblock.gateway.config.model import LocalServer
from cellblock.gateway.downstream.launch import launch_plan
from cellblock.sandbox.spawn import run_plan
from cellblock.sandbox.trace import LAUNCHERS, Event, Kind, jail_refused, parse_trace, traced
from cellblock.sandbox.types import Limits

pytestmark = [
    pytest.mark.jail,
    pytest.mark.skipif(shutil.which("bwrap") is None or shutil.which("strace") is None, reason="needs bwrap, strace"),
]

SCRIPT = """
import os, socket
print(open({shared!r}).read())
for path, mode in (({hidden!r}, "r"), ({shared!r} + ".new", "w")):
    try:
        open(path, mode)
    except OSError as exc:
        print(exc)
try:
    socket.create_connection(("192.0.2.7", 443), timeout=1)
except OSError as exc:
    print(exc)
os.system("true")
"""


def scripted(tmp_path: Path, script: str = SCRIPT) -> tuple[Path, Path, str]:
    """A file the jail is granted (its directory, read-only), one it is not, and `script` naming both."""
    shared, hidden = tmp_path / "d" / "f", tmp_path / "hidden"
    shared.parent.mkdir()
    shared.write_text("hi\n")
    hidden.write_text("secret\n")
    return shared, hidden, script.format(shared=str(shared), hidden=str(hidden))


def test_a_traced_jail_shows_reads_refusals_connections_and_execs(tmp_path: Path) -> None:
    shared, hidden, script = scripted(tmp_path)
    server = LocalServer.model_validate(
        {"command": sys.executable, "args": ["-c", script], "jail": {"read_only": [str(shared.parent)]}}
    )
    plan = launch_plan("t", server, limits=Limits(processes=64, memory=1 << 30))
    output = tmp_path / "trace"
    done = run_plan(replace(plan, argv=traced(plan.argv, str(output))), 60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("hi")
    trace = parse_trace(output.read_text())
    assert trace.started is not None
    events = trace.events
    # nothing of bwrap's setup (its mounts of /oldroot and /newroot) is counted as the server's, nor
    # what the launchers the jail runs before it do: the server starts at its own command
    assert not [e for e in events if e.target.startswith(("/oldroot", "/newroot"))]
    assert trace.command == sys.executable and not [e for e in events if e.target in LAUNCHERS]
    read = [e for e in events if e.target == str(shared) and e.kind is Kind.READ]
    assert read and read[0].ok
    (refused,) = [e for e in events if e.target == str(hidden)]
    assert refused.errno == "ENOENT" and jail_refused(refused)
    (written,) = [e for e in events if e.target == f"{shared}.new"]
    assert written.kind is Kind.WRITE and written.errno == "EROFS" and jail_refused(written)
    (connect,) = [e for e in events if e.kind is Kind.CONNECT and e.target.startswith("192.0.2.7")]
    assert connect.target == "192.0.2.7:443" and connect.errno == "ENETUNREACH" and jail_refused(connect)
    execs = [e.target for e in events if e.kind is Kind.EXEC]
    assert "/bin/sh" in execs or "/usr/bin/sh" in execs


def test_split_lines_are_joined_and_relative_paths_made_absolute() -> None:
    text = "\n".join(
        [
            '10 1.0 execve("/usr/bin/bwrap", ["bwrap"], 0x1 /* 3 vars */) = 0',
            '11 1.1 mount("/oldroot/x", "/newroot/x", NULL, MS_BIND, NULL) = 0',
            '12 1.2 execve("/usr/bin/python3", ["python3"], 0x1 /* 3 vars */) = 0',
            '12 1.3 openat(AT_FDCWD</work>, "notes/a.txt", O_WRONLY|O_CREAT, 0666 <unfinished ...>',
            "11 1.35 wait4(-1,  <unfinished ...>",
            "12 1.4 <... openat resumed>) = -1 EROFS (Read-only file system)",
            '12 1.5 sendto(3<socket:[1]>, "\\1\\2\\1\\0\\0\\1\\0\\0\\0\\0\\0\\0\\7example\\3com\\0\\0\\1\\0\\1", 29, '
            'MSG_NOSIGNAL, {sa_family=AF_INET, sin_port=htons(53), sin_addr=inet_addr("10.0.0.1")}, 16) = -1 '
            "ENETUNREACH (Network is unreachable)",
            "12 1.6 +++ exited with 0 +++",
        ]
    )
    trace = parse_trace(text)
    assert trace.started == 1.2 and trace.command == "/usr/bin/python3"
    assert trace.events == (
        Event(1.3, 12, Kind.WRITE, "/work/notes/a.txt", "openat", "EROFS"),
        Event(1.5, 12, Kind.LOOKUP, "example.com", "sendto", "ENETUNREACH"),
    )


@pytest.mark.skipif(os.getuid() != 0 or shutil.which("runuser") is None, reason="needs root to become another user")
def test_an_unprivileged_user_traces_its_own_jail() -> None:
    """No privilege is needed: a user traces the bwrap it starts, and the jail's refusals show."""
    with tempfile.TemporaryDirectory() as place:  # pytest's tmp_path is root's alone
        os.chmod(place, 0o777)
        output = Path(place) / "trace"
        _trace_as_nobody(output)


def _trace_as_nobody(output: Path) -> None:
    jail = ["bwrap", "--unshare-all", "--unshare-user", "--disable-userns", "--cap-drop", "ALL", "--die-with-parent"]
    jail += ["--ro-bind", "/usr", "/usr", "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64"]
    jail += ["--symlink", "usr/bin", "/bin", "--proc", "/proc", "--dev", "/dev", "--"]
    argv = traced([*jail, "/bin/sh", "-c", "echo > /usr/cellblock-x"], str(output))
    done = subprocess.run(["runuser", "-u", "nobody", "--", *argv], capture_output=True, text=True, check=False)
    assert "Read-only file system" in done.stderr
    trace = parse_trace(output.read_text())
    (written,) = [e for e in trace.events if e.target == "/usr/cellblock-x"]
    assert written.kind is Kind.WRITE and written.errno == "EROFS"


# bwrap, then the server's first program: what comes after is the server's
START = (
    '10 0.9 execve("/usr/bin/bwrap", ["bwrap"], 0x1 /* 3 vars */) = 0',
    '12 1.0 execve("/usr/bin/python3", ["python3"], 0x1 /* 3 vars */) = 0',
)


def test_a_path_keeps_the_spelling_the_kernel_was_given_and_is_judged_by_it(tmp_path: Path) -> None:
    """`missing/..` collapsed as text is the directory above; the kernel found no `missing`, so the
    jail refused nothing the host has. `dir/..` the host resolves is a refusal, spelled as named."""
    (tmp_path / "dir").mkdir()
    text = "\n".join(
        [
            *START,
            f'12 1.1 openat(AT_FDCWD</>, "{tmp_path}/missing/..", O_RDONLY) = -1 ENOENT (No such file or directory)',
            f'12 1.2 openat(AT_FDCWD<{tmp_path}>, "dir/../", O_RDONLY) = -1 ENOENT (No such file or directory)',
            f'12 1.3 openat(AT_FDCWD</>, "{tmp_path}/x"..., O_RDONLY) = -1 ENOENT (No such file or directory)',
            f'12 1.4 openat(AT_FDCWD</>, "{tmp_path}/dir", O_RDONLY) = 3',
        ]
    )
    missing, through, plain = parse_trace(text).events  # the cut string is no path
    assert (missing.target, missing.named) == (str(tmp_path), f"{tmp_path}/missing/..")
    assert not jail_refused(missing)
    assert (through.target, through.named) == (str(tmp_path), f"{tmp_path}/dir/../")
    assert jail_refused(through) and through.as_named == f"{tmp_path}/dir/../"
    assert plain.named == "" and plain.as_named == f"{tmp_path}/dir"


def test_a_lookups_labels_are_read_as_sent_never_joined_into_another_name() -> None:
    def query(*labels: bytes) -> str:
        name = b"".join(bytes([len(label)]) + label for label in labels) + b"\0"
        data = b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00" + name + b"\x00\x01\x00\x01"
        escaped = "".join(f"\\{b:o}" for b in data)
        return (
            f'12 1.1 sendto(3<socket:[1]>, "{escaped}", {len(data)}, 0, {{sa_family=AF_INET, '
            'sin_port=htons(53), sin_addr=inet_addr("192.0.2.53")}, 16) = -1 ENETUNREACH (Network is unreachable)'
        )

    sent = [(b"0", b"0", b"0", b"0/0"), (b"0.0.0.0/0",), (b"b\xc3\xbccher", b"example"), (b"a\\b", b"com")]
    names = [parse_trace([*START, query(*labels)]).events[0].target for labels in sent]
    assert names == ["0.0.0.0/0", r"0\.0\.0\.0/0", r"b\195\188cher.example", r"a\\b.com"]
