"""The ways a server may read a resource URI that a rule or the lock judged as written.

A rule names `note://secret`; the model asks for `note://%73ecret`, `doc://private%2Fkey` or
`file:///srv/public/../secret/key`. The server decodes the escapes and resolves the dot segments
(the SDK's template matcher decodes; Node's `new URL()` resolves `..`), and reads the item the rule
denies. So a read is judged under every spelling it may be read as, the strictest wins, and the
lock holds it if any spelling is held.
"""

from __future__ import annotations

import posixpath
import re
from urllib.parse import unquote, urlsplit, urlunsplit

__all__ = ["spellings"]

_DECODE_ROUNDS = 3  # an escape of an escape (`%2573`) decoded by a server that decodes twice
_SLASHES = re.compile(r"/{2,}")


def spellings(uri: str) -> tuple[str, ...]:
    """`uri` as written, then as a server may read it: escapes decoded (until nothing changes, a
    few rounds at most), the scheme and host in lower case (`file://localhost/` as `file:///`),
    `.`, `..` and empty path segments resolved. One entry when they are the same."""
    decoded = uri
    for _ in range(_DECODE_ROUNDS):
        again = unquote(decoded, errors="replace")
        if again == decoded:
            break
        decoded = again
    parts = urlsplit(decoded)
    host = "" if parts.scheme.lower() == "file" and parts.netloc.lower() == "localhost" else parts.netloc.lower()
    path = parts.path
    if path:
        resolved = posixpath.normpath(_SLASHES.sub("/", path))
        # normpath drops a trailing slash and keeps a leading '//' (POSIX): put the first back, fold the other
        path = "/" + resolved.lstrip("/") if path.startswith("/") else resolved.lstrip("/")
        if parts.path.endswith("/") and not path.endswith("/"):
            path += "/"
    normal = urlunsplit((parts.scheme.lower(), host, path, parts.query, parts.fragment))
    if parts.scheme.lower() == "file" and not host and path.startswith("/") and not normal.startswith("file:///"):
        normal = "file://" + normal.removeprefix("file:")  # urlunsplit writes file:/x for an empty host
    return (uri,) if normal == uri else (uri, normal)
