"""A database granted alone in a Landlock jail: its journal made beside it by the gateway, and
nothing else (sandbox/sidecars.py), attacked.

The database is a file in a directory the jail may not write (the user's home, here a directory
of the test's). The positive case: SQLite in the jail writes it in its rollback-journal and WAL
modes, and leaves no journal behind. The control: the same jail without the gateway's help finds
the database read-only. The attacks name other files beside it (a name that is no journal's, the
journal of a file that is not granted), remove a file there, plant a link, a second name or a FIFO
at a journal's name, ask for a directory or a path descriptor, and swap the path between a
journal's name and another while the call waits, truncate a second name planted at a journal's
name, reach the directory by ways the kernel refuses (a chain of thousands of links, a deleted
directory's descriptor beside a link named like it) and run out of descriptors; each is judged by
what is in the directory afterwards and what the calls got, against the same attempts unjailed.
The same calls are made by a 32-bit x86 program too.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import sqlite3
from pathlib import Path
from typing import Any

import pytest

import cellblock.sandbox.landlock as landlock
from cellblock.sandbox.connects import gate_missing
from cellblock.sandbox.landlock import landlock_abi
from cellblock.sandbox.types import Network
from tests.sandbox.test_landlock import jail, run, script, unjailed

pytestmark = [
    pytest.mark.jail,
    pytest.mark.skipif(landlock_abi() < 4 or gate_missing() is not None, reason="needs a Landlock jail with a gate"),
]

WRITE = """
import sqlite3
def write(mode):
    with sqlite3.connect(db) as conn:
        conn.execute(f"PRAGMA journal_mode={mode}")
        conn.execute("CREATE TABLE IF NOT EXISTS kept (note TEXT)")
        conn.execute("INSERT INTO kept VALUES (?)", (mode,))
    conn.close()
attempt("delete", lambda: write("DELETE"))
attempt("wal", lambda: write("WAL"))
"""


def place(tmp_path: Path) -> tuple[Path, Path]:
    """The user's directory with the empty database wrap makes, and a file of the user's beside it."""
    home = tmp_path / "home"
    home.mkdir()
    database = home / "test.db"
    database.touch()
    secret = home / "secret"
    secret.write_text("the user's")
    return database, secret


def rows(database: Path) -> list[str]:
    with sqlite3.connect(database) as conn:
        found = [row[0] for row in conn.execute("SELECT note FROM kept")]
    conn.close()
    return found


def attempt(tmp_path: Path, database: Path, code: str) -> dict[str, Any]:
    return run(jail(tmp_path, code, read_write=(str(database),), network=Network.NONE))


def test_sqlite_writes_a_database_granted_alone_and_leaves_no_journal(tmp_path: Path) -> None:
    database, secret = place(tmp_path)
    code = script(WRITE, db=str(database))
    said = attempt(tmp_path, database, code)
    assert said["delete"] == said["wal"] == "ok", said
    assert rows(database) == ["DELETE", "WAL"]
    assert sorted(p.name for p in database.parent.iterdir()) == ["secret", "test.db"]  # no journal left
    assert secret.read_text() == "the user's"


def test_the_control_without_the_gateways_help_finds_the_database_read_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(landlock, "gate_missing", lambda: "turned off for the control")
    database, _ = place(tmp_path)
    code = script(WRITE.replace("except OSError", "except Exception"), db=str(database))
    done = landlock.run_plan(jail(tmp_path, code, read_write=(str(database),), network=Network.NONE), 30)
    assert "attempt to write a readonly database" in done.stderr


ATTACKS = """
import ctypes, threading
libc = ctypes.CDLL(None, use_errno=True)
def create(path, dir_fd=None):
    os.close(os.open(path, os.O_CREAT | os.O_RDWR, 0o644, dir_fd=dir_fd))
attempt("journal_by_dirfd", lambda: create("test.db-journal", dir_fd=os.open(home, os.O_PATH)))
attempt("unlink_journal", lambda: os.unlink(home + "/test.db-journal"))
attempt("other_name", lambda: create(home + "/evil"))
attempt("longer_name", lambda: create(home + "/test.db-journal.sh"))
attempt("ungranted_journal", lambda: create(home + "/other.db-journal"))
attempt("unlink_secret", lambda: os.unlink(home + "/secret"))
attempt("through_link", lambda: open(home + "/test.db-wal", "a").write("x"))
attempt("second_name", lambda: open(home + "/test.db-shm", "a").write("x"))
attempt("truncate_second_name", lambda: os.close(os.open(home + "/test.db-shm", os.O_RDWR | os.O_TRUNC)))
attempt("directory", lambda: os.close(os.open(home + "/test.db-journal", os.O_RDONLY | os.O_DIRECTORY)))
attempt("as_path", lambda: os.close(os.open(home + "/test.db-journal", os.O_PATH)))
def swap():
    journal, evil = (home + "/test.db-journal").encode(), (home + "/evil-swapped-in").encode()
    evil += b"\\0" * (len(journal) - len(evil))
    buf = ctypes.create_string_buffer(journal, 200)
    done = []
    def flip():
        while not done:
            ctypes.memmove(buf, evil, len(evil))
            ctypes.memmove(buf, journal, len(journal))
    thread = threading.Thread(target=flip)
    thread.start()
    try:
        for _ in range(20000):  # till the other name is made (unjailed, in a few thousand)
            fd = libc.open(buf, os.O_CREAT | os.O_RDWR, 0o644)
            if fd >= 0:
                os.close(fd)
            if os.path.exists(evil.rstrip(b"\\0")):
                break
    finally:
        done.append(1)
        thread.join()
attempt("swap", swap)
"""


def test_nothing_but_a_journal_is_made_or_removed_beside_a_database_granted_alone(tmp_path: Path) -> None:
    def planted(home: Path, secret: Path) -> None:
        (home / "test.db-wal").symlink_to(secret)
        os.link(secret, home / "test.db-shm")

    database, secret = place(tmp_path)
    home = database.parent
    planted(home, secret)
    code = script(ATTACKS, home=str(home))
    said = attempt(tmp_path, database, code)
    assert said["journal_by_dirfd"] == said["unlink_journal"] == said["swap"] == "ok", said
    refused = ["other_name", "longer_name", "ungranted_journal", "unlink_secret", "through_link", "second_name"]
    refused.append("truncate_second_name")  # emptied only once known to be a file of its own: it is not
    assert {key: said[key] for key in refused} == {
        **dict.fromkeys(refused[:4], "PermissionError"),
        "through_link": "OSError",  # ELOOP: the link is not followed
        "second_name": "PermissionError",
        "truncate_second_name": "PermissionError",
    }
    assert said["directory"] != "ok" and said["as_path"] != "ok", said
    # nothing but the journal the swap made (the gateway's copy of the path) is new, and the secret is whole
    left = sorted(p.name for p in home.iterdir())
    assert left == ["secret", "test.db", "test.db-journal", "test.db-shm", "test.db-wal"]
    assert secret.read_text() == "the user's"

    # the control: unjailed, every one of them lands
    for each in home.iterdir():
        each.unlink()
    database.touch()
    secret.write_text("the user's")
    planted(home, secret)
    said = unjailed(code)
    assert {key: said[key] for key in refused} == dict.fromkeys(refused, "ok"), said
    made = {p.name for p in home.iterdir()}
    assert {"evil", "test.db-journal.sh", "other.db-journal", "evil-swapped-in"} <= made


def test_a_fifo_at_a_journals_name_does_not_hold_the_gate(tmp_path: Path) -> None:
    database, _ = place(tmp_path)
    os.mkfifo(database.parent / "test.db-journal")
    code = script(
        'attempt("fifo", lambda: os.close(os.open(home + "/test.db-journal", os.O_WRONLY)))\n'
        'attempt("fifo_rw", lambda: os.close(os.open(home + "/test.db-journal", os.O_RDWR)))\n'
        'attempt("after", lambda: os.close(os.open(home + "/test.db-wal", os.O_CREAT | os.O_RDWR, 0o600)))',
        home=str(database.parent),
    )
    said = attempt(tmp_path, database, code)
    # opened without waiting for a reader: none there (ENXIO), or a FIFO is no plain file (EACCES)
    assert said == {"fifo": "OSError", "fifo_rw": "PermissionError", "after": "ok"}


FOUND = """
def errno_of(act):
    try:
        act()
    except OSError as exc:
        return exc.errno
    return 0
def create(path, dir_fd=None):
    os.close(os.open(path, os.O_CREAT | os.O_RDWR, 0o600, dir_fd=dir_fd))
base = scratch or os.environ["TMPDIR"]
# a chain of links the kernel gives up on (past 40), and one it follows, each ending at the directory
for chain, length in (("deep", 3000), ("short", 8)):
    os.mkdir(f"{base}/{chain}")
    for i in range(length):
        os.symlink(f"{base}/{chain}/{i + 1}", f"{base}/{chain}/{i}")
    os.symlink(home, f"{base}/{chain}/{length}")
    said[chain] = errno_of(lambda: create(f"{base}/{chain}/0/test.db-journal"))
# a directory's descriptor, the directory removed, a link beside it named as /proc shows it now
os.mkdir(base + "/gone")
gone = os.open(base + "/gone", os.O_RDONLY | os.O_DIRECTORY)
os.rmdir(base + "/gone")
os.symlink(home, base + "/gone (deleted)")
said["deleted"] = errno_of(lambda: create("test.db-wal", dir_fd=gone))
said["after"] = errno_of(lambda: create(home + "/test.db-shm"))
"""


def test_a_journals_directory_is_found_as_the_kernel_finds_it_and_a_chain_of_links_does_not_stop_the_gate(
    tmp_path: Path,
) -> None:
    # the gateway once walked the path itself: 3000 links stopped its gate (RecursionError), every
    # call after that failed; a deleted directory's descriptor reached the directory by /proc's name
    database, _ = place(tmp_path)
    home = database.parent
    said = attempt(tmp_path, database, script(FOUND, home=str(home), scratch=""))
    expected = {"deep": errno.ELOOP, "short": 0, "deleted": errno.ENOENT, "after": 0}
    assert said == expected
    assert sorted(p.name for p in home.iterdir()) == ["secret", "test.db", "test.db-journal", "test.db-shm"]

    # the control: unjailed, the kernel answers each the same
    for each in home.iterdir():
        if each.name.startswith("test.db-"):
            each.unlink()
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    assert unjailed(script(FOUND, home=str(home), scratch=str(scratch))) == expected


HANDED = """
import ctypes, fcntl, resource
libc = ctypes.CDLL(None, use_errno=True)
journal = home + "/test.db-journal"
def opened(flags):
    fd = libc.open(journal.encode(), flags, 0o600)
    if fd < 0:
        return -ctypes.get_errno()
    try:
        return [fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE, fcntl.fcntl(fd, fcntl.F_GETFD)]
    finally:
        os.close(fd)
said["created"] = opened(os.O_CREAT | os.O_RDWR)
said["read_only"] = opened(os.O_RDONLY)
said["close_on_exec"] = opened(os.O_RDWR | os.O_CLOEXEC)
def write_read_only():
    fd = os.open(journal, os.O_RDONLY)
    try:
        os.write(fd, b"x")
    finally:
        os.close(fd)
attempt("write_read_only", write_read_only)
# a descriptor table left full: the call fails (EMFILE), it does not wait, and the next one is answered
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (32, hard))
held = []
while True:
    try:
        held.append(os.dup(0))
    except OSError:
        break
said["table_full"] = opened(os.O_RDWR)
os.close(held.pop())
said["one_free"] = opened(os.O_RDWR)
os.unlink(journal)
"""


def test_a_journals_descriptor_is_handed_over_as_asked_and_a_full_descriptor_table_is_an_error(tmp_path: Path) -> None:
    database, _ = place(tmp_path)
    code = script(HANDED, home=str(database.parent))
    said = attempt(tmp_path, database, code)
    expected = {
        "created": [os.O_RDWR, 0],
        "read_only": [os.O_RDONLY, 0],  # read-only: nothing more than asked
        "close_on_exec": [os.O_RDWR, fcntl.FD_CLOEXEC],
        "write_read_only": "OSError",  # EBADF
        "table_full": -errno.EMFILE,
        "one_free": [os.O_RDWR, 0],
    }
    assert said == expected
    assert sorted(p.name for p in database.parent.iterdir()) == ["secret", "test.db"]
    assert unjailed(code) == expected  # the control: the kernel hands the same


# `int 0x80` from this 64-bit process: a 32-bit x86 system call, eax, ebx, ecx, edx from the C arguments
# (push rbx; mov eax, edi; mov ebx, esi; mov r8d, ecx; mov ecx, edx; mov edx, r8d; int 0x80; pop rbx; ret)
COMPAT = """
import ctypes, mmap
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
MAP_32BIT = 0x40  # its arguments are 32 bits: the code and the paths below 4 GiB
page = libc.mmap(None, 4096, 7, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | MAP_32BIT, -1, 0)
code = bytes.fromhex("5389f889f34189c889d14489c2cd805bc3")
ctypes.memmove(page, code, len(code))
call = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint)(page)
def at(path):
    ctypes.memmove(page + 1024, path.encode() + b"\\0", len(path) + 1)
    return page + 1024
OPEN, CREAT, UNLINK, OPENAT, UNLINKAT, FDCWD = 5, 8, 10, 295, 301, 0xFFFFFF9C
said["open_other"] = call(OPEN, at(home + "/evil"), os.O_CREAT | os.O_RDWR | 0o100000, 0o644)
said["creat_other"] = call(CREAT, at(home + "/evil"), 0o644, 0)
said["unlink_secret"] = call(UNLINK, at(home + "/secret"), 0, 0)
said["open_journal"] = call(OPEN, at(home + "/test.db-journal"), os.O_CREAT | os.O_RDWR | 0o100000, 0o644) >= 0
said["creat_wal"] = call(CREAT, at(home + "/test.db-wal"), 0o644, 0) >= 0
said["openat_shm"] = call(OPENAT, FDCWD, at(home + "/test.db-shm"), os.O_CREAT | os.O_RDWR) >= 0
said["unlink_journal"] = call(UNLINK, at(home + "/test.db-journal"), 0, 0)
said["unlinkat_wal"] = call(UNLINKAT, FDCWD, at(home + "/test.db-wal"), 0)
"""


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="a 32-bit x86 call from an x86_64 process")
def test_a_32_bit_x86_call_makes_a_journal_and_nothing_else(tmp_path: Path) -> None:
    database, secret = place(tmp_path)
    home = database.parent
    code = script(COMPAT, home=str(home))
    said = attempt(tmp_path, database, code)
    made = {"open_journal": True, "creat_wal": True, "openat_shm": True, "unlink_journal": 0, "unlinkat_wal": 0}
    assert said == {"open_other": -errno.EACCES, "creat_other": -errno.EACCES, "unlink_secret": -errno.EACCES, **made}
    assert sorted(p.name for p in home.iterdir()) == ["secret", "test.db", "test.db-shm"]
    assert secret.read_text() == "the user's"

    # the control: unjailed, every call lands
    (home / "test.db-shm").unlink()
    said = unjailed(code)
    assert said == {"open_other": said["open_other"], "creat_other": said["creat_other"], "unlink_secret": 0, **made}
    assert said["open_other"] >= 0 and said["creat_other"] >= 0
    assert sorted(p.name for p in home.iterdir()) == ["evil", "test.db", "test.db-shm"]


SIGNALLED = """
import ctypes, signal, threading, time
libc = ctypes.CDLL(None, use_errno=True)
signal.signal(signal.SIGUSR1, lambda *_: None)  # a handler without SA_RESTART: a wait it breaks fails (EINTR)
journal = (home + "/test.db-journal").encode()
main, done = threading.get_ident(), []
def pester():
    while not done:
        signal.pthread_kill(main, signal.SIGUSR1)
thread = threading.Thread(target=pester)
thread.start()
said["made_but_failed"] = said["removed_but_failed"] = said["interrupted"] = 0
# bounded in time too: the pestering thread holds the GIL between its signals, so a slow machine
# takes seconds per few hundred calls
deadline = time.monotonic() + 8
try:
    for _ in range(1500):
        if time.monotonic() > deadline:
            break
        there = os.path.exists(journal)
        fd = libc.open(journal, os.O_CREAT | os.O_RDWR, 0o600)
        if fd >= 0:
            os.close(fd)
        elif ctypes.get_errno() == 4:
            said["interrupted"] += 1
            said["made_but_failed"] += not there and os.path.exists(journal)
        if os.path.exists(journal) and libc.unlink(journal) != 0 and ctypes.get_errno() == 4:
            said["interrupted"] += 1
            said["removed_but_failed"] += not os.path.exists(journal)
finally:
    done.append(1)
    thread.join()
"""


def test_a_call_a_signal_fails_was_not_made(tmp_path: Path) -> None:
    """Once the gateway has read a call it is not failed by a signal (the filter's
    WAIT_KILLABLE_RECV, Linux 5.19): a caller told EINTR after its journal was made or removed would
    think it was not; a signal before the gateway reads it fails a call that was not made."""
    if tuple(int(part) for part in re.findall(r"\d+", os.uname().release)[:2]) < (5, 19):
        pytest.skip("a kernel before 5.19 waits interruptibly")
    database, _ = place(tmp_path)
    said = attempt(tmp_path, database, script(SIGNALLED, home=str(database.parent)))
    assert said["made_but_failed"] == said["removed_but_failed"] == 0, said
    # the control: the signals did land, and failed the calls the gateway had not read yet
    assert said["interrupted"] > 0, said
