"""A local server's stderr: passed on to the gateway's own, its last lines kept to tell why it stopped.

A server that dies at start usually says why on stderr ("Could not find the uv binary at …", a
traceback's last line); without those lines the gateway could only report "Connection closed".
The relay is a thread, not a task: a blocking write to a stderr nobody drains then stalls this one
server, as it did when the server wrote to the gateway's stderr itself, never the event loop.

The last words are the server's own text, so they are told as such: whole lines only (a line
too long to keep whole is named by its length, so no part of a secret is ever cut out of one),
the gateway's known secrets redacted, then shortened, with everything a terminal or a reader
would not see as text replaced. Per chunk only the lines that could be among the last are kept,
so a flood costs the gateway little more than the copy.
"""

from __future__ import annotations

import os
import re
import select
import threading
import unicodedata
from collections import deque
from collections.abc import Iterable

from cellblock.gateway.scrub import REDACTED, pattern_of

__all__ = ["LAST_LINES", "LINE_BYTES", "LINE_CHARS", "StderrRelay"]

LAST_LINES = 3
LINE_BYTES = 4096  # longer lines are not kept, only named
LINE_CHARS = 300
_CHUNK = 65536
# letters, digits, punctuation and symbols are text; of the rest only the plain space is kept
_TEXT = ("L", "N", "P", "S")
# printable by Unicode's account, and shown as nothing: fillers and the blank braille pattern
_BLANK = frozenset("\u115f\u1160\u3164\uffa0\u2800")


class StderrRelay:
    """Copies what a server writes to the read end `source` on to the fd `target`, keeping its last lines.

    Owns `source` (closed at EOF). `last_words()` may be called from any thread, at any time.
    """

    def __init__(self, source: int, target: int) -> None:
        self._source, self._target = source, target
        self._lines: deque[bytes] = deque(maxlen=LAST_LINES)
        self._partial = b""
        self._partial_size = 0  # of the line not yet ended, which may be longer than what is kept
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="cellblock-stderr", daemon=True)
        self._thread.start()

    def last_words(self, secrets: Iterable[str] = ()) -> str:
        """The last lines the server wrote (a line not yet ended included), as one printable line."""
        with self._lock:
            raw = [*self._lines, *([_kept(self._partial, self._partial_size)] if self._partial.strip() else [])]
        known = pattern_of(tuple(secrets))
        return " | ".join(_plain(line, known) for line in raw[-LAST_LINES:])

    def join(self, timeout: float) -> None:
        """Wait (a blocking call) until the server's stderr has ended and every line is kept."""
        self._thread.join(timeout)

    def _run(self) -> None:
        try:
            while chunk := os.read(self._source, _CHUNK):
                self._keep(chunk)
                _write_all(self._target, chunk)
        except OSError:
            pass  # the gateway's stderr is gone: there is nowhere left to tell
        finally:
            os.close(self._source)

    def _keep(self, chunk: bytes) -> None:
        *ended, rest = chunk.split(b"\n")
        last: list[bytes] = []
        if ended:
            last.append(_kept(self._partial + ended[0], self._partial_size + len(ended[0])))
            found = 0
            for line in reversed(ended[1:]):  # only what could be among the last lines is looked at
                if found == LAST_LINES:
                    break
                if line.strip():
                    found += 1
                    last.insert(1, _kept(line, len(line)))
            self._partial, self._partial_size = b"", 0
        with self._lock:
            self._lines.extend(line for line in last if line.strip())
            self._partial_size += len(rest)
            if len(self._partial) < LINE_BYTES:
                self._partial = (self._partial + rest)[: LINE_BYTES + 1]


def _kept(line: bytes, size: int) -> bytes:
    """`line` whole, or only how long it was when it is too long to keep whole."""
    return line if size <= LINE_BYTES else f"[a line of {size} bytes]".encode()


def _plain(raw: bytes, secrets: re.Pattern[str] | None) -> str:
    """One line of a server's output as text a log, a terminal and a client can show as it is."""
    text = raw.decode("utf-8", "replace").strip()
    if secrets is not None:
        text = secrets.sub(REDACTED, text)
    text = "".join(
        c if c == " " or (unicodedata.category(c)[0] in _TEXT and c not in _BLANK) else "\N{REPLACEMENT CHARACTER}"
        for c in text
    )
    return text if len(text) <= LINE_CHARS else text[: LINE_CHARS - 1] + "…"


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except BlockingIOError:  # a stderr the client made non-blocking: wait until it drains
            select.select([], [fd], [])
