"""A local server's stderr: passed on to the gateway's own as the server's, its last lines kept to
tell why it stopped.

A server that dies at start usually says why on stderr ("Could not find the uv binary at …", a
traceback's last line); without those lines the gateway could only report "Connection closed".
The relay is a thread, not a task: a blocking write to a stderr nobody drains then stalls this one
server, as it did when the server wrote to the gateway's stderr itself, never the event loop.

What a server writes there is its own text, and the gateway's stderr is the client's log of the
gateway: so nothing passes as it was written. Each line (`shown`) is whole (a line too long to
keep whole is named by its length, so no part of a secret is ever cut out of one), has every
secret the gateway holds redacted (any server's, and each line of one that spans lines), has
everything a terminal or a reader would act on or not see as text (ANSI escapes, CR, other
controls, bidi overrides, invisible characters) written as a `\\uXXXX` escape, and is cut to a
bound. A relayed line starts with `[NAME stderr] `, never as the gateway's own lines do
(`cellblock: `), whatever the server wrote; lines past a budget (`STDERR_RATE` a second after a
burst) are counted and said, not passed on. Per chunk only the lines that could be among the last
or within the budget are looked at, so a flood costs the gateway little more than the read.

The gateway's first request to a server with `protocol: auto` is most often the 2026-07-28
discovery probe (`server/discover`; not when it follows a handshake-era client, downstream/offer.py). A
server on the Python SDK 1.x does not know it and logs a pydantic validation dump of ~100 lines
before it answers with an error: the gateway's doing, not the server's news. So what the server
writes between the probe and its answer is held (`hold`); once answered (`probe_answered`), what
was written before the answer is in the pipe or read, and is passed on, except, after a refusal,
the lines from the SDK's complaint (`PROBE_COMPLAINT`) on, which are counted in a debug note.
Lines the server writes after its answer pass as ever.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import select
import threading
import time
import unicodedata
from collections import deque
from collections.abc import Callable, Iterable, Iterator

from cellblock.gateway.downstream.ratelimit import Budget
from cellblock.gateway.scrub import REDACTED, line_pattern

__all__ = [
    "LAST_LINES",
    "LINE_BYTES",
    "LINE_CHARS",
    "RELAY_CHARS",
    "STDERR_BURST",
    "STDERR_RATE",
    "TAIL_LINES",
    "StderrRelay",
    "shown",
]

logger = logging.getLogger(__name__)

LAST_LINES = 3  # told in why the server stopped
TAIL_LINES = 20  # kept for `cellblock ps` and the dashboard (`last_lines`)
LINE_BYTES = 4096  # longer lines are not kept, only named
LINE_CHARS = 300  # of a last line, told in why the server stopped
RELAY_CHARS = 1000  # of a relayed line, escapes included
# A server that logs a traceback or a page of start-up output is passed on whole; a flood of
# lines (a client keeps the gateway's stderr as its log, often in a file) is cut to this rate.
STDERR_RATE = 20.0
STDERR_BURST = 500.0
# how the Python SDK 1.x's log of a request it cannot validate starts (mcp/shared/session.py)
PROBE_COMPLAINT = b"Failed to validate request:"
# a server that writes more lines than this while the probe waits has them passed on (each held
# line is at most `LINE_BYTES`)
HELD_LINES = 1000
TELL_EVERY = 10.0  # seconds between the gateway's notes of how many lines were left out
_CHUNK = 65536
_PIPE_MAX = 1 << 20  # the most a pipe can hold (Linux's pipe-max-size by default)
# letters, digits, punctuation and symbols are text; of the rest only the plain space is kept
_TEXT = ("L", "N", "P", "S")
# printable by Unicode's account, and shown as nothing: fillers and the blank braille pattern
_BLANK = frozenset("\u115f\u1160\u3164\uffa0\u2800")

Secrets = Callable[[], Iterable[str]]  # every secret the gateway holds, as it is now


class StderrRelay:
    """Copies what a server writes to the read end `source` on to the fd `target` as `server`'s
    lines (`shown`), keeping its last lines; `secrets` gives every secret the gateway holds.

    Owns `source` (closed at EOF). `last_words()` may be called from any thread, at any time.
    """

    def __init__(self, source: int, target: int, server: str = "server", secrets: Secrets | None = None) -> None:
        self._source, self._target = source, target
        self._mark = f"[{server} stderr] ".encode()
        self._server, self._secrets = server, secrets or tuple
        self._lines: deque[bytes] = deque(maxlen=TAIL_LINES)
        self._partial = b""
        self._partial_size = 0  # of the line not yet ended, which may be longer than what is kept
        self._lock = threading.RLock()
        self._budget = Budget(rate=STDERR_RATE, burst=STDERR_BURST)  # used by the relay's thread only
        self._told = 0.0  # when the gateway last said how many lines were left out
        self._held: list[bytes] | None = None  # while the discovery probe waits for its answer
        self._probed = False  # the probe was answered, or held lines were passed on: nothing is held again
        self._released: list[bytes] = []  # held lines the thread is to pass on
        self._wake, self._woken = os.pipe()  # `probe_answered` wakes the relay's thread with a byte
        self._ended = False  # the relay's thread has ended and closed its pipes
        for fd in (self._source, self._woken):
            os.set_blocking(fd, False)
        self._thread = threading.Thread(target=self._run, name="cellblock-stderr", daemon=True)
        self._thread.start()

    def last_words(self, secrets: Iterable[str] | None = None) -> str:
        """The last lines the server wrote (a line not yet ended included), as one printable line;
        the relay's secrets are redacted unless others are given."""
        raw = self._last()
        known = line_pattern(tuple(self._secrets() if secrets is None else secrets))
        return " | ".join(shown(line, known, LINE_CHARS) for line in raw[-LAST_LINES:])

    def last_lines(self, secrets: Iterable[str] | None = None) -> list[str]:
        """The last `TAIL_LINES` lines the server wrote (a line not yet ended included), each as
        `last_words` gives it: secrets redacted, what is not text escaped, cut at `LINE_CHARS`."""
        raw = self._last()
        known = line_pattern(tuple(self._secrets() if secrets is None else secrets))
        return [shown(line, known, LINE_CHARS) for line in raw[-TAIL_LINES:]]

    def _last(self) -> list[bytes]:
        with self._lock:
            return [*self._lines, *([_kept(self._partial, self._partial_size)] if self._partial.strip() else [])]

    def join(self, timeout: float) -> None:
        """Wait (a blocking call) until the server's stderr has ended and every line is kept."""
        self._thread.join(timeout)

    def hold(self) -> None:
        """Hold what the server writes from now until `probe_answered` (see the module docstring)."""
        with self._lock:
            if not self._probed:
                self._held = []

    def probe_answered(self, refused: bool) -> None:
        """The probe was answered (`refused`: with an error). What the server wrote before its
        answer is all in the pipe or read by now: it is read here, and what is held is passed on
        (by the relay's thread), or after a refusal, cut at the SDK's complaint."""
        with self._lock:
            if self._held is None or self._ended:
                return
            for _ in range(_PIPE_MAX // _CHUNK):  # what a pipe holds, however a flood goes on
                chunk = self._read()
                if not chunk:
                    break
                self._hold(self._keep(chunk))
            held = self._take_held()
            complaint = next((i for i, line in enumerate(held) if PROBE_COMPLAINT in line), None) if refused else None
            self._released.extend(held[:complaint])
            with contextlib.suppress(BlockingIOError):  # a byte is there already: the thread wakes
                os.write(self._woken, b"!")
        if complaint is not None:
            logger.debug(
                "server '%s' does not know the discovery probe (an MCP SDK before 2026-07-28): "
                "the %d line(s) it wrote about it are not passed on",
                self._server,
                len(held) - complaint,
            )

    def _run(self) -> None:
        poll = select.poll()
        poll.register(self._source, select.POLLIN)
        poll.register(self._wake, select.POLLIN)
        try:
            while True:
                ready = {fd for fd, _ in poll.poll()}
                if self._wake in ready:
                    os.read(self._wake, 64)
                with self._lock:  # read and held at once: `probe_answered` sees all or none of it
                    chunk = self._read() if self._source in ready else None
                    lines = self._hold(self._keep(chunk)) if chunk else []
                    lines = [*self._released, *lines]
                    self._released.clear()
                if lines:
                    self._relay(lines)
                if chunk == b"":
                    break
            with self._lock:
                last = [_kept(self._partial, self._partial_size)] if self._partial.strip() else []  # never ended
                # held lines too: it ended before the probe was answered
                lines = [*self._released, *self._take_held(), *self._hold(last)]
            if lines:
                self._relay(lines)
        except OSError:
            pass  # the gateway's stderr is gone: there is nowhere left to tell
        finally:
            self._tell(at_end=True)
            with self._lock:
                self._ended = True
                for fd in (self._source, self._wake, self._woken):
                    os.close(fd)

    def _read(self) -> bytes | None:
        """A chunk of what the server wrote; None when nothing is there now, b"" at its end."""
        try:
            return os.read(self._source, _CHUNK)
        except BlockingIOError:
            return None

    def _hold(self, lines: list[bytes]) -> list[bytes]:
        """(Under the lock) hold `lines` while the probe waits; what is to be relayed now. A server
        that writes more than `HELD_LINES` meanwhile has it all passed on."""
        held = self._held
        if held is None:
            return lines
        held.extend(_kept(line, len(line)) for line in lines)  # as relayed: a long line only named
        return self._take_held() if len(held) > HELD_LINES else []

    def _take_held(self) -> list[bytes]:
        """(Under the lock) what is held, which is held no longer, nor ever again."""
        held, self._held = self._held, None
        self._probed = self._probed or held is not None
        return held or []

    def _keep(self, chunk: bytes) -> list[bytes]:
        """Keep the last lines of `chunk`; the lines it ended, each whole or named (`_kept`)."""
        *ended, rest = chunk.split(b"\n")
        lines: list[bytes] = []
        if ended:
            lines = [_kept(self._partial + ended[0], self._partial_size + len(ended[0]))]
            lines += ended[1:]  # cut, if too long, as they are relayed: most are not looked at
            self._partial, self._partial_size = b"", 0
        last: list[bytes] = []
        for line in reversed(lines):  # only what could be among the last lines is looked at
            if len(last) == TAIL_LINES:
                break
            if line.strip():
                last.insert(0, _kept(line, len(line)))
        with self._lock:
            self._lines.extend(last)
            self._partial_size += len(rest)
            if len(self._partial) < LINE_BYTES:
                self._partial = (self._partial + rest)[: LINE_BYTES + 1]
        return lines

    def _relay(self, lines: list[bytes]) -> None:
        """Write the lines within the budget as the server's, in one write; count the rest."""
        known = line_pattern(tuple(self._secrets()))
        out = []
        for index, line in enumerate(lines):
            # a blank line is not passed on, but costs as much: a flood of them is looked at no longer
            if not self._budget.take():
                self._budget.dropped += len(lines) - index - 1  # counted, not looked at
                break
            if line.strip():
                out.append(self._mark + shown(_kept(line, len(line)), known, RELAY_CHARS).encode() + b"\n")
        for batch in _batches(out):
            _write_all(self._target, batch)
        self._tell()

    def _tell(self, at_end: bool = False) -> None:
        """Say how many lines were left out: at most once every `TELL_EVERY` seconds, and at the end."""
        now = time.monotonic()
        if self._budget.dropped and (at_end or now - self._told >= TELL_EVERY):
            self._told = now
            logger.warning(
                "server '%s' wrote more to stderr than %g lines a second: %d line(s) were not passed on",
                self._server,
                STDERR_RATE,
                self._budget.settle(),
            )


def _kept(line: bytes, size: int) -> bytes:
    """`line` whole, or only how long it was when it is too long to keep whole."""
    return line if size <= LINE_BYTES else f"[a line of {size} bytes]".encode()


def shown(raw: bytes, secrets: re.Pattern[str] | None, limit: int) -> str:
    """One line of a server's output as text a log, a terminal and a client show as it is: the
    secrets `secrets` finds redacted, what is not text escaped (`\\u001b`), cut at `limit`."""
    text = raw.decode("utf-8", "replace").strip()
    if secrets is not None:
        text = secrets.sub(REDACTED, text)
    text = "".join(c if _is_text(c) else _escaped(c) for c in text)
    return text if len(text) <= limit else f"{text[: limit - 1]}…"


def _is_text(c: str) -> bool:
    return c == " " or (unicodedata.category(c)[0] in _TEXT and c not in _BLANK)


def _escaped(c: str) -> str:
    return f"\\u{ord(c):04x}" if ord(c) <= 0xFFFF else f"\\U{ord(c):08x}"


def _batches(lines: list[bytes]) -> Iterator[bytes]:
    """`lines` joined into writes of whole lines of at most `PIPE_BUF` bytes each where they fit (on
    Linux, 4 KiB, longer than any relayed line: `RELAY_CHARS` characters of at most 4 bytes and a
    server's name of 24; macOS's 512 bytes holds most). A write that size is never interleaved with
    another writer's to the same pipe (the gateway's own log, the relay of another server), even
    when the pipe is full: a longer one can be, and the rest of a line split there would start a
    line without its mark."""
    batch = b""
    for line in lines:
        if batch and len(batch) + len(line) > select.PIPE_BUF:
            yield batch
            batch = b""
        batch += line
    if batch:
        yield batch


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except BlockingIOError:  # a stderr the client made non-blocking: wait until it drains
            select.select([], [fd], [])
