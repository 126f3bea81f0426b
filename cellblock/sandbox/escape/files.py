"""Attempts on the host's files: read, list and write them, and look for its processes in /proc."""

from __future__ import annotations

import os
from collections.abc import Sequence

from .attempt import Attempt, error_label, never_raises

__all__ = ["FOREIGN_SESSION_HANDFUL", "WRITE_TEXT", "host_processes", "list_dir", "read_file", "write_file"]

WRITE_TEXT = "cellblock escape probe: this file should not exist\n"
FOREIGN_SESSION_HANDFUL = 5  # more processes than this outside our session means the host's /proc


@never_raises("read")
def read_file(path: str) -> Attempt:
    """Try to read one byte of `path`. Through if a byte came back."""
    try:
        # O_NONBLOCK: a FIFO planted at the path must not hang the probe
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError as exc:
        return Attempt("read", path, False, f"open: {error_label(exc)}")
    try:
        data = os.read(fd, 1)
    except OSError as exc:
        return Attempt("read", path, False, f"opened, read: {error_label(exc)}")
    finally:
        os.close(fd)
    if not data:
        return Attempt("read", path, False, "opened but read 0 bytes")
    return Attempt("read", path, True, "read 1 byte")


@never_raises("list")
def list_dir(path: str, expect: Sequence[str] = ()) -> Attempt:
    """List `path`. Through if an entry in `expect` is listed; with no `expect`, if any entry is."""
    try:
        entries = set(os.listdir(path))
    except OSError as exc:
        return Attempt("list", path, False, f"listdir: {error_label(exc)}")
    if expect:
        seen = sorted(set(expect) & entries)
        detail = f"{len(entries)} entries; expected names seen: {seen or 'none'} of {len(set(expect))}"
        return Attempt("list", path, bool(seen), detail)
    return Attempt("list", path, bool(entries), f"{len(entries)} entries (no names given: any entry counts)")


@never_raises("write")
def write_file(path: str, text: str = WRITE_TEXT, keep: bool = False) -> Attempt:
    """Try to write at `path`. Through if a new file was created or an existing one opened for writing.

    A file this creates is removed again, unless `keep` (so a caller outside can look for it on
    the host). An existing file is never changed: opening it for writing is the proof (a read-only
    mount, Landlock and permissions all refuse at open).
    """
    if os.path.lexists(path):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK | os.O_NOCTTY)
        except OSError as exc:
            return Attempt("write", path, False, f"exists; open for writing: {error_label(exc)}")
        os.close(fd)
        return Attempt("write", path, True, "exists; opened for writing (left unchanged)")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        return Attempt("write", path, False, f"create: {error_label(exc)}")
    try:
        written = os.write(fd, text.encode())
        detail = f"created and wrote {written} bytes"
    except OSError as exc:
        detail = f"created, write: {error_label(exc)}"
    finally:
        os.close(fd)
    if keep:
        return Attempt("write", path, True, detail + "; kept")
    try:
        os.unlink(path)
        detail += "; removed"
    except OSError as exc:
        detail += f"; NOT removed: {error_label(exc)}"
    return Attempt("write", path, True, detail)


def _session_of(pid: str) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # comm (field 2) may hold spaces and parentheses: split after the last ')'
    fields = stat[stat.rfind(b")") + 2 :].split()
    try:
        return int(fields[3])  # state ppid pgrp session
    except (IndexError, ValueError):
        return None


@never_raises("processes")
def host_processes(pid: int | None = None, handful: int = FOREIGN_SESSION_HANDFUL) -> Attempt:
    """Look for the host's processes in /proc. Through if `pid` is listed, or if more than `handful`
    processes belong to other sessions.

    PIDs are per namespace: pass a PID that the jail's own few processes (1, 2, ...) cannot have.
    """
    target = str(pid) if pid is not None else "/proc"
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError as exc:
        return Attempt("processes", target, False, f"listdir /proc: {error_label(exc)}")
    own = os.getsid(0)
    foreign = sum(1 for p in pids if _session_of(p) not in (own, None))
    seen = pid is not None and str(pid) in pids and int(pid) != os.getpid()
    through = seen or foreign > handful
    pid_note = "" if pid is None else f"pid {pid} {'listed' if seen else 'not listed'}; "
    detail = f"{pid_note}{len(pids)} processes, {foreign} outside our session (limit {handful})"
    return Attempt("processes", target, through, detail)
