"""The audit log: one JSON object per line, one `os.write` per event, file mode 0600, rotated by size.

Every value is redacted (secret-looking keys, registered secret values) and shortened (long strings,
long lists, deep nesting) before it is written, so an event line stays small and never carries a
secret. Each line ends with a MAC chained to the line before (`audit_chain`), and what a server
triggers by itself is held to a budget (`audit_budget`) and to half of each file, so a flood can
neither fill the log nor rotate decisions out. A write that fails is logged, flagged on
`Audit.failed`, and raised (`AuditUnwritten`): nothing is done unrecorded unless its caller says
so by writing with `note`, which a lost record does not stop (a server's exit, a question asked).
`docs/audit.md` is the schema.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import threading
import time
from collections.abc import Mapping
from enum import Enum
from itertools import islice
from pathlib import Path
from typing import Any, Protocol

from cellblock.gateway.audit.budget import BUDGETED, SAMPLING_APPROVALS, Budget, kind_of
from cellblock.gateway.audit.chain import FIELDS as CHAIN_FIELDS
from cellblock.gateway.audit.chain import KEY_NAME, TAIL_BYTES, Chain, last_mac, load_key
from cellblock.gateway.audit.secretnames import is_secret_name
from cellblock.gateway.scrub import REDACTED, HeldSecrets, number_holds
from cellblock.policy.errors import CellblockError
from cellblock.policy.files import make_dirs

try:  # POSIX: two gateway processes sharing one state dir take turns on a lock file
    import fcntl
except ImportError:  # pragma: no cover - Windows: rotation is guarded within the process only
    fcntl = None  # type: ignore[assignment]  # reason: the module is optional on Windows

__all__ = [
    "DEFAULT_KEEP",
    "DEFAULT_MAX_BYTES",
    "MAX_DEPTH",
    "MAX_ITEMS",
    "MAX_STRING",
    "REDACTED",
    "Audit",
    "AuditUnwritten",
    "Observer",
    "rotated_paths",
]

logger = logging.getLogger(__name__)

MAX_STRING = 256  # characters of a string value kept; the rest becomes "…(+N chars)"
MAX_ITEMS = 50  # items of a list (or keys of a mapping) kept
MAX_DEPTH = 6  # containers nested deeper than this become a one-line summary
DEFAULT_MAX_BYTES = 10 * 1024 * 1024
# one encoder for every event: json.dumps builds a new one per call when given any option
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)
DEFAULT_KEEP = 5
# a line of the log and its event's name (every line starts with ts, then event)
_LINE = re.compile(rb'^\{"ts":[^,]*,"event":"([a-z_]+)"[^\n]*', re.MULTILINE)
_SERVERS_OWN = BUDGETED | {"suppressed"}


def _clean(value: Any, secrets: re.Pattern[str] | None, depth: int = 0) -> Any:
    """A JSON-ready copy of `value`, in one bounded pass: secret-keyed values and strings holding any
    of `secrets` become `[redacted]` (checked before a string is cut), long strings, long lists and
    deep nesting are cut, each cut marked."""
    if isinstance(value, str):
        if secrets is not None and secrets.search(value):
            return REDACTED
        return _cut(value)
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        # str() of a huge integer is slow and, past 4300 digits, refused by Python
        if value.bit_length() > 256:
            return f"<integer of {value.bit_length()} bits>"
        return REDACTED if secrets is not None and number_holds(value, secrets) else value
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)  # NaN and Infinity are not JSON
        return REDACTED if secrets is not None and number_holds(value, secrets) else value
    if isinstance(value, bytes | bytearray | memoryview):
        return f"<{len(value)} bytes>"
    if isinstance(value, Mapping):
        if depth >= MAX_DEPTH:
            return f"…(nested object, {len(value)} keys)"
        out: dict[str, Any] = {}
        for index, (raw_key, item) in enumerate(islice(value.items(), MAX_ITEMS)):
            key = raw_key if isinstance(raw_key, str) else str(raw_key)
            if secrets is not None and secrets.search(key):
                out[f"{REDACTED}#{index}"] = REDACTED
            elif is_secret_name(key):
                out[_cut(key)] = REDACTED
            else:
                out[_cut(key)] = _clean(item, secrets, depth + 1)
        if len(value) > MAX_ITEMS:
            out["…"] = f"(+{len(value) - MAX_ITEMS} keys)"
        return out
    if isinstance(value, list | tuple | set | frozenset):
        if depth >= MAX_DEPTH:
            return f"…(nested list, {len(value)} items)"
        items = [_clean(item, secrets, depth + 1) for item in islice(value, MAX_ITEMS)]
        if len(value) > MAX_ITEMS:
            items.append(f"…(+{len(value) - MAX_ITEMS} items)")
        return items
    if isinstance(value, Enum):
        return _clean(value.value, secrets, depth)
    # anything else is recorded as its text, which gets the same checks as any string
    return _clean(str(value), secrets, depth)


def _cut(text: str) -> str:
    extra = len(text) - MAX_STRING
    return text if extra <= 0 else f"{text[:MAX_STRING]}…(+{extra} chars)"


def _servers_own(line: re.Match[bytes]) -> bool:
    """Whether a line of the log is an event a server triggered by itself (`audit_budget`)."""
    event = line[1].decode()
    if event in _SERVERS_OWN:
        return True
    if event not in SAMPLING_APPROVALS:  # only these are the server's own by a field: read that
        return False
    try:
        fields = json.loads(line[0])
    except ValueError:
        return False
    return isinstance(fields, dict) and kind_of(event, fields) is not None


def rotated_paths(path: Path) -> list[Path]:
    """The audit file and its rotated predecessors that exist, oldest first (`.N` … `.1`, then `path`)."""
    numbered: list[tuple[int, Path]] = []
    for candidate in path.parent.glob(f"{path.name}.*"):
        suffix = candidate.name[len(path.name) + 1 :]
        if suffix.isdigit():
            numbered.append((int(suffix), candidate))
    found = [p for _, p in sorted(numbered, reverse=True)]
    return [*found, path] if path.exists() else found


class AuditUnwritten(CellblockError):
    """An event could not be written to the audit log."""


class Observer(Protocol):
    """What else learns of each event the audit writes (`Audit.observe`): telemetry."""

    def record(self, record: Mapping[str, Any]) -> None:
        """One event as written (its fields as given: a held secret is not yet redacted in them)."""

    def close(self) -> None:
        """The audit is closed: send what is held, let go of what is open."""


class Audit:
    """Appends events to a JSONL file; a failed write is logged, sets `failed`, and is raised
    (`AuditUnwritten`) unless it was written with `note`.

    `failed` describes the most recent `write()`; `failures` counts every failed write. The file
    is opened with O_APPEND and each event is one `os.write` of the whole line, under an `flock`
    on `<name>.lock` beside the key, so lines from several writers (threads, or two gateway processes on one
    state dir) never interleave and each chains to the one before it (`audit_chain`). A write
    that fails part way is cut back off, so the next line starts whole. When the next line would
    take the file past `max_bytes`, it is renamed to `<name>.1` (older ones shift up to
    `<name>.<keep>`, the oldest is dropped) and a new 0600 file is started. What a server
    triggers by itself is held to `audit_budget` and to half of each file (a share, wherever it
    falls), so decisions fill at least the other half before a file rotates: a flood cannot push
    them out.

    Raises:
        OSError: (constructor) the file, its directory or the key cannot be created or opened.
        ValueError: (constructor) `max_bytes` or `keep` is not positive.
    """

    def __init__(
        self, path: Path, max_bytes: int = DEFAULT_MAX_BYTES, keep: int = DEFAULT_KEEP, key: Path | None = None
    ) -> None:
        """`key`: the chain's key file (made if missing), `<dir of path>/audit.key` unless given."""
        if max_bytes <= 0 or keep <= 0:
            raise ValueError(f"audit rotation needs max_bytes > 0 and keep > 0, got {max_bytes} and {keep}")
        self.path = path
        self.max_bytes = max_bytes
        self.keep = keep
        self.failed = False
        self.failures = 0
        self.held = HeldSecrets()  # every secret the gateway holds, whose it is, and its name
        self._lock = threading.Lock()
        self._budget = Budget()
        self._observers: list[Observer] = []
        make_dirs(path.parent)
        key = key if key is not None else path.with_name(KEY_NAME)
        self._chain = Chain(load_key(key))
        self._mac = ""  # the MAC of the last line this writer wrote
        self._sealed = ""  # the MAC of the line being written
        self._end = -1  # where that line ended in the current file (-1: not known)
        # bytes of the current file that servers' own events (and their summaries) take; None: not counted yet
        self._budgeted: int | None = None
        # beside the key, in the state dir: the log itself may be somewhere no lock file can be made
        self._lock_fd = os.open(key.with_name(f"{path.name}.lock"), os.O_RDWR | os.O_CREAT, 0o600)
        self._fd: int | None = self._open()
        self._identity = self._stat_identity(os.fstat(self._fd))

    def observe(self, observer: Observer) -> None:
        """Hand `observer` each event once it is written, and close it with the audit."""
        self._observers.append(observer)

    def add_secret(self, value: str, server: str = "", name: str | None = None) -> None:
        """Redact `value` wherever it appears in a string of a later event (keyring values, tokens);
        it is `server`'s ("" for the gateway's own) and called `name` (`scrub.HeldSecrets`)."""
        self.held.add(value, server, name)

    def secrets(self) -> tuple[str, ...]:
        """The values registered with `add_secret`, for text that leaves the gateway by another way."""
        return self.held.values()

    def secret_pattern(self) -> re.Pattern[str] | None:
        """What finds any of `secrets()` (compiled once per new secret, read without the lock)."""
        return self.held.pattern

    def note(self, event: str, server: str, **fields: Any) -> None:
        """`write`, for an event whose loss stops nothing: a failure is logged and flagged only."""
        with contextlib.suppress(AuditUnwritten):
            self.write(event, server, **fields)

    def write(self, event: str, server: str, **fields: Any) -> None:
        """Append one event; on failure log it, set `failed` (the event's fields are never logged)
        and raise.

        An event a server triggers by itself may be counted instead (see `audit_budget`): that is
        not a failure.

        Raises:
            AuditUnwritten: the event could not be written.
        """
        now = time.time()
        record: dict[str, Any] = {"ts": round(now, 3), "event": event, "server": server}
        for key, value in fields.items():
            if key not in CHAIN_FIELDS:  # the chain's own, never a caller's
                record.setdefault(key, value)  # ts, event and server are the gateway's, not a caller's
        kind = kind_of(event, fields)
        with self._lock:
            try:
                if kind is not None and not self._budget.admit(server, kind, now):
                    self._budget.leave_out(server, kind, now)
                    kind = None  # nothing of this event is written; only summaries that are due
                    record = {}
                if kind is not None or self._budget.next_due <= now:
                    for summary in self._budget.summaries(now, server, kind):
                        self._summarise(summary, now, floor=True)
                if record and not self._append(self._encode(record), floor=kind is not None):
                    self._budget.leave_out(server, kind or event, now)
                    record = {}
            except (OSError, ValueError, TypeError, RecursionError) as exc:
                self.failures += 1
                if not self.failed:
                    logger.error(
                        "audit: could not write a '%s' event for '%s' to %s: %s", event, server, self.path, exc
                    )
                else:
                    logger.debug("audit: still failing (%d failures): %s", self.failures, exc)
                self.failed = True
                raise AuditUnwritten(
                    f"the audit log {self.path} cannot be written ({type(exc).__name__}; the gateway's log "
                    "says why): free space on its disk, or make its directory writable again"
                ) from exc
            if self.failed:
                logger.warning("audit: writing to %s works again after %d failure(s)", self.path, self.failures)
            self.failed = False
        if record:
            for observer in self._observers:
                observer.record(record)

    def close(self) -> None:
        """Write the counts of events left out that are still pending, then close the file."""
        with self._lock:
            if self._fd is not None:
                with contextlib.suppress(OSError, ValueError):
                    for summary in self._budget.pending():
                        self._summarise(summary, time.time(), floor=False)
                os.close(self._fd)
                os.close(self._lock_fd)
                self._fd = None
        for observer in self._observers:
            observer.close()
        self._observers.clear()

    # -- internals (called with self._lock held) --------------------------------------------------

    def _summarise(self, summary: dict[str, Any], now: float, *, floor: bool) -> None:
        record = {"ts": round(now, 3), "event": "suppressed", **summary}
        if not self._append(self._encode(record), floor=floor):
            self._budget.restore(summary)

    def _encode(self, record: dict[str, Any]) -> bytes:
        """The event as one JSON object, without the newline and the chain's fields."""
        secrets = self.held.pattern
        clean: dict[str, Any] = {}
        for key, value in record.items():
            if key in ("ts", "event", "server"):
                clean[key] = value
            elif is_secret_name(key):
                clean[key] = REDACTED
            elif type(value) is str:  # most fields: the checks of `_clean` without its dispatch
                clean[key] = REDACTED if secrets is not None and secrets.search(value) else _cut(value)
            elif value is None or type(value) is bool:
                clean[key] = value
            else:
                clean[key] = _clean(value, secrets)
        return _ENCODER.encode(clean).encode("utf-8", errors="backslashreplace")

    def _append(self, body: bytes, *, floor: bool) -> bool:
        """Write `body` as the next chained line; False (nothing written) when `floor` and it would
        take servers' own events past half of `max_bytes` in this file, the share they may fill."""
        if self._fd is None:
            raise ValueError("the audit log is closed")
        if fcntl is not None:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
        try:
            size = self._current_size()
            prev, first = self._prev(size)
            line = self._seal(body, prev, first)
            if floor and size + len(line) > self.max_bytes // 2 and self._share(size) + len(line) > self.max_bytes // 2:
                return False
            if size > 0 and size + len(line) > self.max_bytes and self._rotate():
                size, line = 0, self._seal(body, prev, True)
            self._write_whole(line, size)
            if floor and self._budgeted is not None:
                self._budgeted += len(line)
            return True
        finally:
            if fcntl is not None:
                fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    def _share(self, size: int) -> int:
        """How many of the current file's first `size` bytes servers' own events take: read from
        the file once (only when the file is past half, where it matters), then kept count of."""
        if self._budgeted is None:
            data = os.pread(self._open_fd(), size, 0)
            self._budgeted = sum(len(m[0]) + 1 for m in _LINE.finditer(data) if _servers_own(m))
        return self._budgeted

    def _prev(self, size: int) -> tuple[str, bool]:
        """The MAC the next line chains to, and whether the line must name it (a file's first line)."""
        if size == 0:
            return self._mac, True
        if size == self._end:
            return self._mac, False  # the last line is this writer's own
        found = last_mac(os.pread(self._open_fd(), TAIL_BYTES, max(0, size - TAIL_BYTES)))
        return (found, False) if found is not None else ("", True)

    def _seal(self, body: bytes, prev: str, first: bool) -> bytes:
        if first:
            body = body[:-1] + b',"prev":"' + prev.encode("ascii") + b'"}'
        mac = self._chain.seal(prev, body)
        self._sealed = mac
        return body[:-1] + b',"mac":"' + mac.encode("ascii") + b'"}\n'

    def _write_whole(self, line: bytes, size: int) -> None:
        """One write of `line` at the end (`size`); if only part of it lands, the part is cut off again."""
        fd = self._open_fd()
        try:
            written = os.write(fd, line)
        except OSError:
            self._cut_back(size)
            raise
        if written != len(line):
            self._cut_back(size)
            raise OSError(f"short write: {written} of {len(line)} bytes (disk full?)")
        self._mac, self._end = self._sealed, size + written

    def _cut_back(self, size: int) -> None:
        fd = self._open_fd()
        try:
            os.ftruncate(fd, size)
        except OSError as exc:  # the next line then starts after a part: `--verify` and the report name it
            logger.error("audit: could not remove a partly written line from %s: %s", self.path, exc)
        self._end = -1

    def _open_fd(self) -> int:
        """The file's descriptor: the internals run under the lock, after `_append` refused a closed log."""
        if self._fd is None:
            raise RuntimeError(f"audit: a line went to {self.path} after it was closed")
        return self._fd

    def _current_size(self) -> int:
        """The size of the file at `path`; reopens it first if someone rotated or removed it."""
        try:
            info = os.stat(self.path)
        except FileNotFoundError:
            info = None
        if info is None or self._stat_identity(info) != self._identity:
            info = self._reopen()
        return info.st_size

    def _rotate(self) -> bool:
        """Shift the files up and start a new one (under the flock); False if that failed."""
        try:
            for n in range(self.keep - 1, 0, -1):
                older = self._numbered(n)
                if older.exists():
                    os.replace(older, self._numbered(n + 1))
            os.replace(self.path, self._numbered(1))
        except OSError as exc:
            # the event still goes into the current file: a bigger file beats a lost record
            logger.warning("audit: could not rotate %s: %s", self.path, exc)
            return False
        self._reopen()
        return True

    def _numbered(self, n: int) -> Path:
        return self.path.with_name(f"{self.path.name}.{n}")

    def _open(self) -> int:
        return os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)

    def _reopen(self) -> os.stat_result:
        fd = self._open()
        old, self._fd = self._fd, fd
        info = os.fstat(fd)
        self._identity = self._stat_identity(info)
        self._end = -1
        self._budgeted = None  # another file: counted again when it matters
        if old is not None:
            os.close(old)
        return info

    @staticmethod
    def _stat_identity(info: os.stat_result) -> tuple[int, int]:
        return info.st_dev, info.st_ino
