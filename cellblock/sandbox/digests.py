"""Executable digests (`jail.exec.sha256`): check a file's sha256 before a server starts, and
keep the bytes that matched.

The digest is computed over bytes read once into memory; those same bytes are written to a
private, content-addressed copy, and that copy is what the jail mounts at the pinned path. A file
changed on disk after the check is therefore never what runs.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from pathlib import Path

from cellblock.policy.files import atomic_write_bytes, make_dirs
from cellblock.sandbox.types import JailError

__all__ = ["verify_pins"]

# Pinned files are programs; refuse absurd sizes rather than read them into memory.
MAX_PINNED_BYTES = 512 * 1024 * 1024


def verify_pins(server: str, pins: Mapping[str, str], store: Path) -> dict[str, str]:
    """For each `path: digest`, the path of a verified copy under `store` (made 0500 in a 0700 dir).

    Raises:
        JailError: a file is missing, too large, or its digest does not match (both digests shown).
    """
    verified: dict[str, str] = {}
    make_dirs(store)
    for path, expected in sorted(pins.items()):
        try:
            real = os.path.realpath(path)
            if os.path.getsize(real) > MAX_PINNED_BYTES:
                raise JailError(f"server '{server}': pinned file {path} is larger than {MAX_PINNED_BYTES} bytes")
            data = Path(real).read_bytes()
        except OSError as exc:
            raise JailError(f"server '{server}': pinned file {path} cannot be read: {exc.strerror}") from exc
        got = hashlib.sha256(data).hexdigest()
        if got != expected.lower():
            raise JailError(
                f"server '{server}': {path} does not match its pin (got sha256 {got}, expected {expected.lower()}); "
                "the file changed since it was pinned: check it, then update jail.exec.sha256"
            )
        copy = store / got
        if not copy.exists():
            atomic_write_bytes(copy, data, 0o500)  # never a half copy, even after a crash
        verified[path] = str(copy)
    return verified
