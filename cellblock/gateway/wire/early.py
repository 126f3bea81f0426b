"""The client's opening requests answered as at the last start, while the gateway loads.

Importing the SDK takes the gateway about a second, and a client's first requests (the handshake,
or 2026-07-28's `server/discover`, then the lists) would wait for it. They need not: with the same
config, locks, code and environment, the gateway answers them exactly as it did the last time it
started. So it records those answers in `<state dir>/early.json`, with a fingerprint of
everything they depend on, and at the next start a thread answers the same requests from the
record before the SDK is even imported (`EarlyAnswers`), in this module, which imports neither
the SDK nor pydantic.

Once the gateway is up, every line the thread read is handed to it, in order, as if it had just
arrived; the gateway answers the early requests again and compares instead of sending
(`gateway/wire/client.py`): a difference replaces the record and tells the client to list again.
Anything the thread cannot answer (a call, a request not recorded or already answered once, any
other notification than `notifications/initialized`) stops it, and waits for the gateway like
everything after it.

No decision is made here: what is answered early is the gateway's own handshake and lists from
the last start, and every call passes route, lock and policy in the gateway proper.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import select
import sys
import threading
from dataclasses import dataclass, field
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from cellblock import __version__
from cellblock.gateway.state import atomic_write_json, read_json
from cellblock.gateway.wire.stdio import is_pipe

__all__ = [
    "CODE",
    "MAX_ANSWERS",
    "RECORD",
    "SAVE_AFTER_SECONDS",
    "Early",
    "EarlyAnswers",
    "Handover",
    "client_name",
    "fingerprint",
    "request_key",
]

logger = logging.getLogger(__name__)

RECORD = "early.json"
# the record is written this long after an answer changed it: a client's opening requests come
# together, so one write holds them all (and at exit, if it is still to be written)
SAVE_AFTER_SECONDS = 2.0
# Requests whose answer depends only on what the fingerprint covers. A cursor means a later
# page, which the gateway's one-page lists never give: that is the SDK's to refuse.
ANSWERABLE = frozenset(
    {"initialize", "server/discover", "tools/list", "prompts/list", "resources/list", "resources/templates/list"}
)
_PASSING = "notifications/initialized"  # expects no answer; the gateway gets it with the rest
# the environment the gateway's paths and expansions read; the rest of it changes nothing listed.
# The state dir's own path is not part of it: what it holds is.
_ENV_PREFIXES = ("CELLBLOCK_", "XDG_")
_ENV_NAMES = ("HOME",)
_ENV_SKIPPED = ("CELLBLOCK_STATE_DIR",)
_CHUNK = 64 * 1024
# An opening request is a few hundred bytes; a longer line is not one, and is left to the gateway.
EARLY_LINE_LIMIT = 64 * 1024
# answers kept in the record, the latest answered kept: a client's opening is a handful, and each
# client that opened (by its name and version) adds its own
MAX_ANSWERS = 32
# Cellblock's own code, all of whose modules the fingerprint covers
CODE = Path(__file__).resolve().parents[2]


def request_key(method: Any, params: Any, client: str | None = None) -> str | None:
    """The record's key for a request that may be answered early, or None.

    `client`: the name a handshake-era client gave at its `initialize`, for the requests after
    it. What a list holds may depend on who asks (`catalog.search: auto`), and the record is
    shared by every client that starts the gateway: without the name, one client's list would
    answer another's next start. A 2026-07-28 request names its client in its own envelope."""
    if method not in ANSWERABLE or (isinstance(params, dict) and params.get("cursor") is not None):
        return None
    request = [method, params] if client is None or method == "initialize" else [method, params, client]
    return json.dumps(request, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def client_name(info: Any) -> str | None:
    """The name in a clientInfo, if it has one."""
    name = info.get("name") if isinstance(info, dict) else None
    return name if isinstance(name, str) else None


def fingerprint(config: Path, state: Path) -> str | None:
    """A digest of everything the gateway's opening answers depend on: its code and the SDK's,
    the interpreter, the config file, the locks and saved catalogs, the environment it reads.
    None when the config cannot be read (the gateway then reports why)."""
    digest = hashlib.sha256()

    def add(*parts: object) -> None:
        for part in parts:
            digest.update(part if isinstance(part, bytes) else str(part).encode("utf-8", "surrogateescape"))
            digest.update(b"\0")

    add(__version__, sys.version, sys.executable, config)
    try:
        add(config.read_bytes())
    except OSError:
        return None
    for name in sorted(os.environ):
        if (name.startswith(_ENV_PREFIXES) or name in _ENV_NAMES) and name not in _ENV_SKIPPED:
            add(name, os.environ[name])
    # the code: Cellblock's modules as they are on disk, the SDK's as installed (its RECORD
    # lists every file's hash); find_spec locates a package without importing it
    add(*_modules(CODE))
    for package in ("mcp", "mcp_types"):
        spec = find_spec(package)
        origin = Path(spec.origin) if spec is not None and spec.origin else None
        add(package, origin)
        if origin is not None:
            for record in sorted(origin.parent.parent.glob(f"{package}-*.dist-info/RECORD")):
                add(record.read_bytes())
    for directory in ("locks", "catalogs"):
        for path in sorted((state / directory).glob("*.json")):
            with contextlib.suppress(OSError):
                add(path.name, path.read_bytes())
    return digest.hexdigest()


def _modules(directory: Path) -> list[object]:
    """Each module under `directory` with its size and change time, in a stable order."""
    found: list[object] = []
    with os.scandir(directory) as entries:
        for entry in sorted(entries, key=lambda e: e.name):
            if entry.is_dir(follow_symlinks=False) and entry.name != "__pycache__":
                found += _modules(Path(entry.path))
            elif entry.name.endswith(".py"):
                info = entry.stat()
                found += [entry.path, info.st_size, info.st_mtime_ns]
    return found


def load_answers(state: Path, print_: str | None) -> dict[str, str]:
    """The recorded answers (key -> result JSON), if they were recorded under `print_`."""
    record = read_json(state / RECORD) if print_ is not None else None
    if not isinstance(record, dict) or record.get("fingerprint") != print_:
        return {}
    answers = record.get("answers")
    if not isinstance(answers, dict):
        return {}
    return {k: v for k, v in answers.items() if isinstance(k, str) and isinstance(v, str)}


@dataclass
class Handover:
    """What the early thread leaves the gateway: every byte it read, in order (the lines it
    answered and what it did not), and the result it sent for each request id it answered."""

    data: bytes = b""
    served: dict[Any, tuple[str, str]] = field(default_factory=dict)  # id -> (key, result JSON)


@dataclass
class Early:
    """The gateway's start: the fingerprint its answers are recorded under, the answers recorded
    last time under the same one, and the thread answering with them (if any)."""

    path: Path
    fingerprint: str | None
    answers: dict[str, str]
    thread: EarlyAnswers | None = None
    changed: bool = False  # answers differ from the file

    @classmethod
    def begin(cls, config: Path, state: Path) -> Early:
        """Compute the fingerprint and, when the record matches and stdio are pipes, start answering."""
        print_ = fingerprint(config, state)
        answers = load_answers(state, print_)
        early = cls(state / RECORD, print_, answers)
        if answers and is_pipe(0) and is_pipe(1):
            early.thread = EarlyAnswers(answers)
            early.thread.start()
        return early

    def stop(self) -> Handover:
        """Stop answering (waits for an answer being written) and hand over what was read."""
        return self.thread.stop() if self.thread is not None else Handover()

    def record(self, key: str, result: str) -> bool:
        """Keep `result` as the answer to `key`; True when that changed the record."""
        if self.fingerprint is None or self.answers.get(key) == result:
            return False
        self.answers.pop(key, None)  # put back last: the latest answered
        self.answers[key] = result
        for oldest in list(self.answers)[:-MAX_ANSWERS]:
            del self.answers[oldest]
        self.changed = True
        return True

    def snapshot(self) -> dict[str, Any] | None:
        """The record to write if it changed (then it counts as written), else None."""
        if not self.changed:
            return None
        self.changed = False
        return {"fingerprint": self.fingerprint, "answers": dict(self.answers)}

    def write(self, record: dict[str, Any]) -> None:
        """Write a snapshot (atomically, 0600; any thread); a failure only costs the next start its head start."""
        try:
            atomic_write_json(self.path, record)
        except OSError as exc:
            logger.warning("could not save the opening answers for the next start to %s: %s", self.path, exc)

    def save(self) -> None:
        record = self.snapshot()
        if record is not None:
            self.write(record)


class EarlyAnswers:
    """Answers the client's opening requests on stdin/stdout from `answers`, on a thread."""

    def __init__(self, answers: dict[str, str], fd_in: int = 0, fd_out: int = 1) -> None:
        self._answers = answers
        self._in, self._out = fd_in, fd_out
        self._read = bytearray()  # everything read from the client
        self._done = 0  # how much of it has been looked at (whole lines, answered or passed)
        self._served: dict[Any, tuple[str, str]] = {}
        self._keys: set[str] = set()  # the requests answered (each at most once)
        self._client: str | None = None  # the name given in the `initialize` answered (see request_key)
        self._wake_r, self._wake_w = os.pipe()
        self._thread = threading.Thread(target=self._run, name="cellblock-early", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> Handover:
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")
        self._thread.join()
        for fd in (self._wake_r, self._wake_w):
            os.close(fd)
        return Handover(bytes(self._read), dict(self._served))

    def _run(self) -> None:
        with contextlib.suppress(OSError):  # the client left: the gateway finds that out itself
            while True:
                ready, _, _ = select.select([self._in, self._wake_r], [], [])
                if self._wake_r in ready:
                    return
                chunk = os.read(self._in, _CHUNK)
                if not chunk:
                    return
                searched = len(self._read)  # the bytes before had no newline after `_done`
                self._read += chunk
                while (end := self._read.find(b"\n", searched)) >= 0:
                    if not self._answer(bytes(self._read[self._done : end])):
                        return
                    self._done = searched = end + 1
                if len(self._read) - self._done > EARLY_LINE_LIMIT:
                    return  # no opening request is this long: the gateway's reader, with its limit, takes it

    def _answer(self, line: bytes) -> bool:
        """Answer or pass one line; False when it is the gateway's to handle (and everything after it)."""
        if not line.strip():
            return True
        try:
            message = json.loads(line)
        except ValueError:
            return False
        if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
            return False
        if "id" not in message:
            return message.get("method") == _PASSING
        ident = message["id"]
        if not isinstance(ident, str | int) or isinstance(ident, bool) or ident in self._served:
            return False
        method, params = message.get("method"), message.get("params", {})
        key = request_key(method, params, self._client)
        # the same request again is a client listing again: that one waits for the gateway
        result = self._answers.get(key) if key is not None and key not in self._keys else None
        if key is None or result is None:
            return False
        self._keys.add(key)
        if method == "initialize" and isinstance(params, dict):
            self._client = client_name(params.get("clientInfo"))
        self._write(f'{{"jsonrpc":"2.0","id":{json.dumps(ident)},"result":{result}}}\n'.encode())
        self._served[ident] = (key, result)
        return True

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self._out, view) :]
