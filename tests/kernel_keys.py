"""A key planted in a user's kernel keyring for the keyring escape tests, and taken out again.

The key is made by the system's python3 (as another user through `runuser`), from source passed
on the command line, so nothing inside the checkout has to be readable by that user. Its payload
is random, reaches the planting process on stdin, and is never printed.
"""

from __future__ import annotations

import os
import secrets
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

__all__ = ["PlantedKey", "keyrings_usable", "planted_key"]

SYSTEM_PYTHON = "/usr/bin/python3"
KEY_SECONDS = 30  # a python3 start and one system call; more means something is wrong

# argv: plant DESCRIPTION (payload on stdin; prints the serial) | remove SERIAL
_KEYS = r"""
import ctypes, os, sys
NUMBERS = {"x86_64": (248, 250), "aarch64": (217, 219)}  # add_key, keyctl
add_key, keyctl = NUMBERS[os.uname().machine]
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
USER_KEYRING, GET_KEYRING_ID, REVOKE, UNLINK = -4, 0, 3, 9
if sys.argv[1] == "plant":
    payload = sys.stdin.buffer.read()
    serial = libc.syscall(ctypes.c_long(add_key), b"user", sys.argv[2].encode(), payload,
                          ctypes.c_size_t(len(payload)), ctypes.c_long(USER_KEYRING))
    if serial < 0:
        sys.exit("add_key: " + os.strerror(ctypes.get_errno()))
    ring = libc.syscall(ctypes.c_long(keyctl), ctypes.c_long(GET_KEYRING_ID), ctypes.c_long(USER_KEYRING), 0)
    print(serial, ring)
else:
    serial = int(sys.argv[2])
    libc.syscall(ctypes.c_long(keyctl), ctypes.c_long(REVOKE), ctypes.c_long(serial))
    if libc.syscall(ctypes.c_long(keyctl), ctypes.c_long(UNLINK), ctypes.c_long(serial),
                    ctypes.c_long(USER_KEYRING)) < 0:
        sys.exit("unlink: " + os.strerror(ctypes.get_errno()))
"""


@dataclass(frozen=True)
class PlantedKey:
    description: str
    serial: int
    ring: int  # the serial of the user keyring it is in, which an attacker may learn otherwise
    payload: bytes = field(repr=False)


def _keys(prefix: Sequence[str], *args: str, payload: bytes = b"") -> str:
    done = subprocess.run(
        [*prefix, SYSTEM_PYTHON, "-I", "-S", "-c", _KEYS, *args],
        input=payload,
        capture_output=True,
        timeout=KEY_SECONDS,
        check=False,
        cwd="/",  # the checkout may be in a home the other user cannot enter
    )
    if done.returncode != 0:
        raise RuntimeError(f"{args[0]} a test key: {done.stderr.decode(errors='replace').strip()}")
    return done.stdout.decode().strip()


@contextmanager
def planted_key(prefix: Sequence[str] = ()) -> Iterator[PlantedKey]:
    """A "user" key with a random payload in the user keyring of whoever `prefix` runs as (`runuser -u
    USER --`; empty: this process's user); revoked and unlinked afterwards.

    Raises:
        RuntimeError: the key cannot be planted (or removed).
    """
    description = f"cellblock-test:{secrets.token_hex(8)}"
    payload = secrets.token_hex(24).encode()
    serial, ring = map(int, _keys(prefix, "plant", description, payload=payload).split())
    try:
        yield PlantedKey(description, serial, ring, payload)
    finally:
        _keys(prefix, "remove", str(serial))


def keyrings_usable() -> bool:
    """Whether this kernel has keyrings at all (CONFIG_KEYS)."""
    return os.path.exists("/proc/keys")
