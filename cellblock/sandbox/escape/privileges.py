"""Attempts at privileges: capabilities, a user namespace, a read-only mount made writable, a sysctl
written back, the user's kernel keys read. What would change the process is tried in a forked child."""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from .attempt import Attempt, errno_name, error_label, never_raises

__all__ = [
    "CHILD_TIMEOUT",
    "KEYCTL_SYSCALL",
    "capabilities",
    "keyring",
    "listed_keys",
    "new_user_namespace",
    "privileges",
    "remount_rw",
    "sysctl",
]

CHILD_TIMEOUT = 5.0  # seconds for a forked privilege-test child to report

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
MS_RDONLY = 0x1
MS_REMOUNT = 0x20
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 1 << 18

KEYCTL_JOIN_SESSION_KEYRING = 1
KEYCTL_LINK = 8
KEYCTL_SEARCH = 10
KEYCTL_READ = 11
KEY_SPEC_SESSION_KEYRING = -3
KEY_SPEC_USER_KEYRING = -4
# glibc has no keyctl() wrapper, so the system call is made by number
KEYCTL_SYSCALL = {"x86_64": 250, "aarch64": 219}
KEY_READ_MAX = 4096  # bytes of a payload read at most (only the size is reported)
CHILD_REPORT_MAX = 4096  # bytes a child reports through its pipe: less than a pipe holds, so it never blocks


def _status_fields() -> dict[str, str]:
    with open("/proc/self/status", encoding="ascii", errors="replace") as f:
        return {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in f)}


@never_raises("capabilities")
def capabilities() -> Attempt:
    """Read CapEff from /proc/self/status. Through if it is non-zero."""
    try:
        status = _status_fields()
    except OSError as exc:
        return Attempt("capabilities", "/proc/self/status", False, f"read: {error_label(exc)}")
    cap_eff = status.get("CapEff", "")
    if not cap_eff:
        return Attempt("capabilities", "/proc/self/status", False, "no CapEff line")
    shown = ", ".join(f"{k}={status.get(k, '?')}" for k in ("CapEff", "CapPrm", "CapBnd", "NoNewPrivs", "Seccomp"))
    return Attempt("capabilities", "/proc/self/status", int(cap_eff, 16) != 0, shown)


def libc_handle() -> Any:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def in_child(action: Callable[[], int], timeout: float = CHILD_TIMEOUT) -> int | str:
    """Run `action` in a forked child and return its result (0..255), or a string saying what went wrong.

    Namespace and mount changes must not touch the caller: unshare(CLONE_NEWUSER) also refuses a
    multithreaded process, which an MCP server is.
    """
    pid = os.fork()
    if pid == 0:
        code = 255
        try:
            code = action()
        finally:
            os._exit(code)
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() >= deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return f"child still running after {timeout:g}s (killed)"
        time.sleep(0.01)
    if os.WIFEXITED(status):
        return os.WEXITSTATUS(status)
    return f"child died by signal {os.WTERMSIG(status)}"


def text_in_child(action: Callable[[], str], timeout: float = CHILD_TIMEOUT) -> str:
    """Run `action` in a forked child and return the text it returned, or what went wrong."""
    read_end, write_end = os.pipe()

    def report() -> int:
        os.close(read_end)
        os.write(write_end, action().encode()[:CHILD_REPORT_MAX])
        return 0

    try:
        code = in_child(report, timeout)
    finally:
        os.close(write_end)
    with os.fdopen(read_end, "rb") as reader:
        text = reader.read().decode("utf-8", "replace")
    if code != 0 or not text:
        return code if isinstance(code, str) else f"child exited with status {code}"
    return text


def errno_code(rc: int) -> int:
    return 0 if rc == 0 else (ctypes.get_errno() or 255) & 0xFF


@never_raises("userns")
def new_user_namespace() -> Attempt:
    """Try unshare(CLONE_NEWUSER) in a forked child. Through if it succeeded."""
    if not sys.platform.startswith("linux"):
        return Attempt("userns", "unshare(CLONE_NEWUSER)", False, "not Linux")
    libc = libc_handle()
    code = in_child(lambda: errno_code(libc.unshare(CLONE_NEWUSER)))
    if code == 0:
        return Attempt("userns", "unshare(CLONE_NEWUSER)", True, "created a user namespace")
    return Attempt("userns", "unshare(CLONE_NEWUSER)", False, f"unshare: {errno_name(code)}")


@never_raises("remount")
def remount_rw(path: str) -> Attempt:
    """Try mount(path, MS_REMOUNT|MS_BIND) without MS_RDONLY in a forked child. Through if it succeeded.

    The child first tries to move into a private mount namespace so a success changes nothing
    outside it; with no right to do that it tries in the current one and, if that succeeds, puts
    MS_RDONLY back. Either success means the data under `path` is writable.
    """
    if not sys.platform.startswith("linux"):
        return Attempt("remount", path, False, "not Linux")
    libc = libc_handle()
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]
    target = os.fsencode(path)

    def attempt() -> int:
        private = libc.unshare(CLONE_NEWNS) == 0 and libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None) == 0
        code = errno_code(libc.mount(None, target, None, MS_REMOUNT | MS_BIND, None))
        if code == 0 and not private:
            libc.mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY, None)
        return code

    code = in_child(attempt)
    if code == 0:
        return Attempt("remount", path, True, "remounted read-write")
    return Attempt("remount", path, False, f"mount: {errno_name(code)}")


@never_raises("privileges")
def privileges(ro_path: str) -> Attempt:
    """Run `capabilities`, `new_user_namespace` and `remount_rw(ro_path)`. Through if any got through."""
    parts = [capabilities(), new_user_namespace(), remount_rw(ro_path)]
    detail = "; ".join(f"{p.name} {'THROUGH' if p.got_through else 'blocked'} ({p.detail})" for p in parts)
    return Attempt("privileges", ro_path, any(p.got_through for p in parts), detail)


@never_raises("sysctl")
def sysctl(path: str) -> Attempt:
    """Write a sysctl's own value back to it. Through if the write succeeded (nothing changes)."""
    with open(path) as handle:
        value = handle.read()
    try:
        with open(path, "w") as handle:
            handle.write(value)
    except OSError as exc:
        return Attempt("sysctl", path, False, f"write: {error_label(exc)}")
    return Attempt("sysctl", path, True, f"wrote {len(value)} bytes back")


def listed_keys() -> list[tuple[int, str, str]]:
    """(serial, type, description) of each key /proc/keys shows this process."""
    found: list[tuple[int, str, str]] = []
    with open("/proc/keys", encoding="utf-8", errors="replace") as f:
        for line in f:
            fields = line.split(None, 8)  # serial flags usage timeout perm uid gid type "description: summary"
            if len(fields) == 9:
                found.append((int(fields[0], 16), fields[7], fields[8].rsplit(": ", 1)[0]))
    return found


def _read_key(number: int, description: str, rings: Sequence[int]) -> str:
    """In a child: link the user keyrings into a new session keyring, then find and read the key.

    Returns a JSON object: ``read`` (bytes of the payload read) and ``detail``.
    """
    libc = libc_handle()
    libc.syscall.restype = ctypes.c_long

    def keyctl(*args: Any) -> int:
        return int(libc.syscall(ctypes.c_long(number), *(ctypes.c_long(a) if isinstance(a, int) else a for a in args)))

    def outcome(read: int, detail: str) -> str:
        return json.dumps({"read": read, "detail": detail})

    if keyctl(KEYCTL_JOIN_SESSION_KEYRING, None) < 0:
        return outcome(0, f"keyctl(JOIN_SESSION_KEYRING): {errno_name(ctypes.get_errno())}")
    linked = sum(
        1 for ring in (KEY_SPEC_USER_KEYRING, *rings) if keyctl(KEYCTL_LINK, ring, KEY_SPEC_SESSION_KEYRING) == 0
    )
    key = keyctl(KEYCTL_SEARCH, KEY_SPEC_SESSION_KEYRING, b"user", description.encode(), 0)
    if key < 0:
        return outcome(0, f"linked {linked} user keyring(s); search: {errno_name(ctypes.get_errno())}")
    buffer = ctypes.create_string_buffer(KEY_READ_MAX)
    size = keyctl(KEYCTL_READ, key, buffer, KEY_READ_MAX)
    if size < 0:
        return outcome(0, f"linked {linked} user keyring(s), found the key; read: {errno_name(ctypes.get_errno())}")
    return outcome(size, f"linked {linked} user keyring(s), found the key; read {size} bytes of it")


@never_raises("keyring")
def keyring(description: str, rings: Sequence[int] = ()) -> Attempt:
    """Try to read the "user" key `description` from the user's kernel keyrings. Through if a byte of it was read.

    Keyrings have no namespace of their own, and a jail runs as its user's kernel uid. The user
    keyrings /proc/keys lists (``_uid.N``, found by serial: inside a new user namespace
    KEY_SPEC_USER_KEYRING names another one) are linked into a new session keyring, which makes
    their keys the process's own and so readable; then the key is searched for and read. That runs
    in a forked child, so the caller's keyrings stay as they were. `rings` are serials the
    attacker learnt otherwise (a jail masks /proc/keys), tried as well.
    """
    machine = os.uname().machine
    number = KEYCTL_SYSCALL.get(machine)
    if number is None:
        return Attempt("keyring", description, False, f"no keyctl system call number known for {machine}")
    try:
        listed = listed_keys()
        named = any(kind == "user" and name == description for _, kind, name in listed)
        seen = f"/proc/keys shows {len(listed)} keys, the target {'among them' if named else 'not among them'}"
    except OSError as exc:
        listed, seen = [], f"/proc/keys: {error_label(exc)}"
    found = [serial for serial, kind, name in listed if kind == "keyring" and name.startswith("_uid.")]
    text = text_in_child(lambda: _read_key(number, description, [*found, *rings]))
    try:
        result = json.loads(text)
        read, detail = int(result["read"]), str(result["detail"])
    except (ValueError, KeyError, TypeError):
        read, detail = 0, text
    return Attempt("keyring", description, read > 0, f"{seen}; {detail}")
