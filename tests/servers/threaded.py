"""A plain HTTP handler served on loopback from a thread of the test process, for the duration of a block."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# serve_forever polls for shutdown this often; a test's end waits at most about this long
POLL_SECONDS = 0.05
JOIN_SECONDS = 5.0


@contextlib.contextmanager
def serving(handler: type[BaseHTTPRequestHandler], host: str = "127.0.0.1") -> Iterator[str]:
    """Serve `handler` on a free port of `host`; yields the base URL `http://host:port`."""
    httpd = ThreadingHTTPServer((host, 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": POLL_SECONDS}, daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(JOIN_SECONDS)
