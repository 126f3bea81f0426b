"""A local server's stderr: passed on to the gateway's own, its last lines kept to tell why it stopped.

A server that dies at start usually says why on stderr ("Could not find the uv binary at …", a
traceback's last line); without those lines the gateway could only report "Connection closed".
The relay is a thread, not a task: a blocking write to a stderr nobody drains then stalls this one
server, as it did when the server wrote to the gateway's stderr itself, never the event loop.
"""

from __future__ import annotations

import os
import threading
from collections import deque

__all__ = ["LAST_LINES", "LINE_CHARS", "StderrRelay"]

LAST_LINES = 3
LINE_CHARS = 300
_CHUNK = 65536


class StderrRelay:
    """Copies what a server writes to the read end `source` on to the fd `target`, keeping its last lines.

    Owns `source` (closed at EOF). `last_words()` may be called from any thread, at any time.
    """

    def __init__(self, source: int, target: int) -> None:
        self._source, self._target = source, target
        self._lines: deque[str] = deque(maxlen=LAST_LINES)
        self._partial = b""
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="cellblock-stderr", daemon=True)
        self._thread.start()

    def last_words(self) -> str:
        """The last lines the server wrote (a line not yet ended included), one line, printable."""
        with self._lock:
            lines = [*self._lines, *([_plain(self._partial)] if _plain(self._partial) else [])]
        return " | ".join(lines[-LAST_LINES:])

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
        *ended, rest = (self._partial + chunk).split(b"\n")
        with self._lock:
            self._lines.extend(line for line in map(_plain, ended) if line)
            self._partial = rest[-LINE_CHARS * 4 :]  # a line without end costs no more than this


def _plain(raw: bytes) -> str:
    """One line of a server's output as text a terminal, a log and a client can show as it is."""
    text = raw.decode("utf-8", "replace").strip()
    text = "".join(c if c.isprintable() else "\N{REPLACEMENT CHARACTER}" for c in text)
    return text if len(text) <= LINE_CHARS else text[: LINE_CHARS - 1] + "…"


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
