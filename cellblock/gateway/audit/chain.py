"""Tamper evidence for the audit log: each line ends with a MAC chained to the line before it.

A line is `{…event…,"mac":"<32 hex>"}`: the MAC is HMAC-SHA256 (cut to 128 bits) over the MAC of
the line before it (across files: the last line of the previous file) and the line's own bytes
without its MAC. The first line of a file also carries `"prev"`, the MAC it chains to, so the
oldest file left after rotation can be checked from its first line. The key lives in the state
dir (`audit.key`, 0600), which no jail mounts; without it a line cannot be forged, edited, moved
or dropped from the middle unnoticed. What it cannot show: lines cut from the end of the newest
file, or a whole log removed.
"""

from __future__ import annotations

import hmac
import os
import re
from dataclasses import dataclass
from hashlib import sha256
from pathlib import Path

from cellblock.gateway.state import create_once

__all__ = ["FIELDS", "KEY_NAME", "Break", "Chain", "last_mac", "load_key", "verify"]

KEY_NAME = "audit.key"
_KEY_BYTES = 32
_MAC_HEX = 32
# a chained line ends with exactly this; the MAC is the last field so a writer can find the last
# one by reading a few bytes from the end of the file
FIELDS = frozenset({"prev", "mac"})  # the chain's own fields of a line, never an event's
_TAIL = re.compile(rb',"mac":"([0-9a-f]{32})"\}\n?$')
TAIL_BYTES = 64


def load_key(path: Path) -> bytes:
    """The key at `path`, made (32 random bytes, 0600) the first time; two starts make only one.

    Raises:
        OSError: it cannot be read or made.
    """
    try:
        key = path.read_bytes()
    except FileNotFoundError:
        create_once(path, os.urandom(_KEY_BYTES))  # whole or absent; another gateway's, made first, wins
        key = path.read_bytes()
    if len(key) != _KEY_BYTES:
        raise OSError(f"the audit key {path} is {len(key)} bytes, not {_KEY_BYTES}: it is damaged")
    return key


class Chain:
    """Computes line MACs with one prepared HMAC object (copied per line: about a microsecond)."""

    def __init__(self, key: bytes) -> None:
        self._base = hmac.new(key, digestmod=sha256)

    def seal(self, prev: str, body: bytes) -> str:
        mac = self._base.copy()
        mac.update(prev.encode("ascii"))
        mac.update(body)
        return mac.hexdigest()[:_MAC_HEX]


def last_mac(tail: bytes) -> str | None:
    """The MAC of the last line in `tail` (the end of a file), or None when that line has none."""
    match = _TAIL.search(tail)
    return None if match is None else match.group(1).decode("ascii")


@dataclass(frozen=True)
class Break:
    """Where the chain breaks: the file, the line number (from 1) and what is wrong."""

    path: Path
    line: int
    why: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.why}"


def verify(paths: list[Path], key: bytes) -> tuple[int, Break | None]:
    """Check the chain through `paths` (oldest first): how many lines were checked, and the first break.

    Lines before the first chained one (a log begun before the chain existed) are not a break;
    the oldest file may chain to a file rotation removed; everything after must link up.

    Raises:
        OSError: a file cannot be read.
    """
    chain = Chain(key)
    prev: str | None = None  # the MAC of the last checked line; None until the first
    checked = 0
    for path in paths:
        with path.open("rb") as handle:
            for number, line in enumerate(handle, 1):
                if prev is None and _TAIL.search(line) is None:
                    continue  # written before the chain began
                mac, why = _check(chain, line, prev, first=number == 1)
                if why is not None:
                    return checked, Break(path, number, why)
                prev, checked = mac, checked + 1
    return checked, None


def _check(chain: Chain, line: bytes, prev: str | None, *, first: bool) -> tuple[str, str | None]:
    """The line's MAC, and what is wrong with it as the line after the one whose MAC is `prev`."""
    found = _TAIL.search(line)
    if found is None:
        return "", "not a chained record (cut short, edited or added by hand)"
    mac = found.group(1).decode("ascii")
    body = line[: found.start()] + b"}"
    named = _PREV.search(body)
    claimed = None if named is None else named.group(1).decode("ascii")
    if first and claimed is None:
        return mac, "a file's first line that names no line it follows (lines before it removed)"
    if not first and claimed is not None and prev is not None:
        return mac, "a file's first line inside a file (files joined, or lines before it removed)"
    if claimed is not None and prev is not None and claimed != prev:
        return mac, "does not follow the line before it: lines or a whole file between them are missing"
    link = claimed if claimed is not None else prev
    if link is None:
        return mac, "names no line it follows: the lines before it were removed"
    if not hmac.compare_digest(chain.seal(link, body), mac):
        return mac, "its MAC does not match: the line was edited or moved, or one before it removed"
    return mac, None


_PREV = re.compile(rb',"prev":"([0-9a-f]*)"\}$')
