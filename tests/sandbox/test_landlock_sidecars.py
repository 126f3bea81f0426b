"""A database granted alone in a Landlock jail: its journal made beside it by the gateway, and
nothing else (sandbox/sidecars.py), attacked.

The database is a file in a directory the jail may not write (the user's home, here a directory
of the test's). The positive case: SQLite in the jail writes it in its rollback-journal and WAL
modes, and leaves no journal behind. The control: the same jail without the gateway's help finds
the database read-only. The attacks name other files beside it (a name that is no journal's, the
journal of a file that is not granted), remove a file there, plant a link, a second name or a FIFO
at a journal's name, ask for a directory or a path descriptor, and swap the path between a
journal's name and another while the call waits; each is judged by what is in the directory
afterwards, against the same attempts unjailed.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest

import cellblock.sandbox.landlock as landlock
from cellblock.sandbox.connects import gate_missing
from cellblock.sandbox.pins import landlock_abi
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
        for _ in range(3000):
            fd = libc.open(buf, os.O_CREAT | os.O_RDWR, 0o644)
            if fd >= 0:
                os.close(fd)
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
    assert {key: said[key] for key in refused} == {
        **dict.fromkeys(refused[:4], "PermissionError"),
        "through_link": "OSError",  # ELOOP: the link is not followed
        "second_name": "PermissionError",
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
