"""Make system calls by number and report how each ended: the errno, or 0 for success.

Run by a jail's python3 from source (``python3 -I -S -c "$(cat syscall_probe.py)" SPEC``), so it
imports the standard library only and keeps to Python 3.8 syntax. SPEC is a JSON object:

- ``calls``: a list of ``{"nr": N, "args": [...]}``; an argument is an integer (masked to 64 bits,
  so a negative one is its two's complement), ``{"str": "..."}`` (a NUL-terminated string),
  ``{"zeros": N}`` (a buffer of N zero bytes), ``{"hex": "..."}`` (a buffer holding those bytes)
  or ``"pty"`` (a pseudo-terminal the call's process has just made its controlling terminal);
- ``filter``: optional, the hex of a seccomp BPF program to install (with no_new_privs) before
  any call, for running the same calls with and without it outside a jail.

Each call runs in a forked child, so what it changes (a persona, a namespace, a terminal) dies
with it. Prints one JSON list: per call the errno it failed with, 0 if it succeeded, or a string
if its child died otherwise.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
from typing import Any

CALL_SECONDS = 5  # each call is immediate; a child still running after this is killed by SIGALRM
PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
TIOCSCTTY = 0x540E

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def install(program: bytes) -> None:
    buffer = ctypes.create_string_buffer(program, len(program))
    fprog = SockFprog(len(program) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        sys.exit("prctl(PR_SET_NO_NEW_PRIVS): " + os.strerror(ctypes.get_errno()))
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        sys.exit("prctl(PR_SET_SECCOMP): " + os.strerror(ctypes.get_errno()))


def controlling_pty() -> int:
    os.setsid()
    _, slave = os.openpty()
    if libc.ioctl(slave, TIOCSCTTY, 0) != 0:
        os._exit(254)  # no errno is 254: the call was never made
    return slave


def argument(value: Any) -> Any:
    if value == "pty":
        return ctypes.c_ulong(controlling_pty())
    if isinstance(value, int):
        return ctypes.c_ulong(value & 0xFFFFFFFFFFFFFFFF)
    if "str" in value:
        return ctypes.c_char_p(value["str"].encode())
    if "zeros" in value:
        return ctypes.create_string_buffer(value["zeros"])
    data = bytes.fromhex(value["hex"])
    return ctypes.create_string_buffer(data, len(data))


def run(call: dict[str, Any]) -> int | str:
    pid = os.fork()
    if pid == 0:
        code = 255
        try:
            signal.alarm(CALL_SECONDS)
            args = [argument(a) for a in call["args"]]
            code = 0 if libc.syscall(ctypes.c_long(call["nr"]), *args) != -1 else ctypes.get_errno()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    if os.WIFEXITED(status):
        return os.WEXITSTATUS(status)
    return f"killed by signal {os.WTERMSIG(status)}"


def main() -> None:
    spec = json.loads(sys.argv[1])
    if spec.get("filter"):
        install(bytes.fromhex(spec["filter"]))
    print(json.dumps([run(call) for call in spec["calls"]]))


if __name__ == "__main__":
    main()
