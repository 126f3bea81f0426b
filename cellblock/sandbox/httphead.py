"""The egress proxy's requests: their head read, parsed strictly and rewritten for upstream.

Anything odd is a `Refused` (400, 408 or 431), which the proxy answers and records: a bare CR or
LF, a folded header, an ambiguous body length, an absolute https:// URI (use CONNECT), a host
without a port for CONNECT. An absolute-form request is rewritten to origin-form with Host set
from the URI, hop-by-hop headers dropped and `Connection: close`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import anyio
from anyio.streams.buffered import BufferedByteReceiveStream

__all__ = [
    "HEADER_TIMEOUT",
    "MAX_HEADER_BYTES",
    "Refused",
    "Request",
    "authority",
    "clip",
    "origin_head",
    "parse_head",
    "read_head",
]

# Request line + headers. Real proxy requests are well under 4 KiB; 16 KiB leaves room for big
# cookies while bounding what an idle or hostile client can make the gateway buffer.
MAX_HEADER_BYTES = 16 * 1024
# Seconds to send the whole request head. Clients send it at once; this only ends slow-loris
# connections that would otherwise hold a slot forever.
HEADER_TIMEOUT = 10.0

# Longest host text copied into a decision for a request that could not be parsed.
_MAX_REPORTED_HOST = 255

_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_TARGET = re.compile(rb"[\x21-\x7e]+")
_VERSIONS = (b"HTTP/1.0", b"HTTP/1.1")
# Hop-by-hop headers (RFC 9110 7.6.1) and the proxy's own; never forwarded upstream.
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "proxy-connection",
        "keep-alive",
        "proxy-authorization",
        "proxy-authenticate",
        "te",
        "trailer",
        "upgrade",
    }
)


class Refused(Exception):
    """The request ends with an error response and a refusal decision."""

    def __init__(
        self,
        status: int,
        reason: str,
        host: str = "",
        port: int = 0,
        address: str | None = None,
        rule: str | None = None,
        asked: str | None = None,
    ) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.host = host
        self.port = port
        self.address = address
        self.rule = rule
        self.asked = asked  # how the human decided, when one was asked


@dataclass(frozen=True, slots=True)
class Request:
    host: str  # as written by the client (not yet normalised)
    port: int
    connect: bool
    # absolute-form only: the request head rewritten to origin-form, without the Host line
    method: bytes = b""
    origin: bytes = b""
    version: bytes = b"HTTP/1.1"
    headers: tuple[tuple[bytes, bytes], ...] = ()


async def read_head(reader: BufferedByteReceiveStream) -> bytes:
    try:
        with anyio.fail_after(HEADER_TIMEOUT):
            head = await reader.receive_until(b"\r\n\r\n", MAX_HEADER_BYTES)
    except TimeoutError as exc:
        raise Refused(408, f"request head not received within {HEADER_TIMEOUT:g} s") from exc
    except anyio.DelimiterNotFound as exc:
        raise Refused(431, f"request head is longer than {MAX_HEADER_BYTES} bytes") from exc
    except (anyio.IncompleteRead, anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
        raise Refused(400, "connection closed before the request head was complete") from exc
    # receive_until only stops reading once the buffer is over the limit, so one large read can
    # still hold a complete, oversized head: measure it
    if len(head) + 4 > MAX_HEADER_BYTES:
        raise Refused(431, f"request head is longer than {MAX_HEADER_BYTES} bytes")
    return head


def parse_head(head: bytes) -> Request:
    if b"\n" in head.replace(b"\r\n", b"") or b"\r" in head.replace(b"\r\n", b""):
        raise Refused(400, "bare CR or LF in the request head")
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3:
        raise Refused(400, "malformed request line (expected 'METHOD target HTTP/1.1')")
    method, target, version = parts
    if not _TOKEN.fullmatch(method) or not _TARGET.fullmatch(target) or version not in _VERSIONS:
        raise Refused(400, "malformed request line (expected 'METHOD target HTTP/1.1')")
    headers = _parse_headers(lines[1:])

    if method == b"CONNECT":
        host, port = _split_authority(target.decode("ascii"), default_port=None)
        return Request(host=host, port=port, connect=True)

    lowered = target.lower()
    if lowered.startswith(b"https://"):
        raise Refused(400, "absolute https:// URIs are not proxied; use CONNECT")
    if not lowered.startswith(b"http://"):
        raise Refused(400, "not a proxy request (expected CONNECT host:port or an absolute http:// URI)")
    rest = target[len(b"http://") :].decode("ascii")
    end = len(rest)
    for delimiter in "/?#":
        index = rest.find(delimiter)
        if index >= 0:
            end = min(end, index)
    authority, path = rest[:end], rest[end:]
    path = path.partition("#")[0]
    if not path.startswith("/"):
        path = "/" + path
    host, port = _split_authority(authority, default_port=80)
    return Request(
        host=host,
        port=port,
        connect=False,
        method=method,
        origin=path.encode("ascii"),
        version=version,
        headers=headers,
    )


def _parse_headers(lines: list[bytes]) -> tuple[tuple[bytes, bytes], ...]:
    headers: list[tuple[bytes, bytes]] = []
    for line in lines:
        if not line:
            continue  # the final empty line(s) of the head
        if line[:1] in (b" ", b"\t"):
            raise Refused(400, "folded header lines are not accepted")
        name, sep, value = line.partition(b":")
        if not sep or not _TOKEN.fullmatch(name):
            raise Refused(400, "malformed header line")
        value = value.strip(b" \t")
        if b"\x00" in value:
            raise Refused(400, "NUL in a header value")
        headers.append((name, value))
    lengths = {v for n, v in headers if n.lower() == b"content-length"}
    if len(lengths) > 1 or (lengths and any(n.lower() == b"transfer-encoding" for n, _ in headers)):
        raise Refused(400, "ambiguous request body length (Content-Length and Transfer-Encoding)")
    return tuple(headers)


def _split_authority(authority: str, default_port: int | None) -> tuple[str, int]:
    """Split `host[:port]` (IPv6 in brackets); userinfo is dropped as `normalize_host` does."""
    authority = authority.rpartition("@")[2]
    if authority.startswith("["):
        close = authority.find("]")
        if close < 0:
            raise Refused(400, "unclosed '[' in the request target", clip(authority))
        host, rest = authority[: close + 1], authority[close + 1 :]
        if rest and not rest.startswith(":"):
            raise Refused(400, "malformed authority in the request target", clip(authority))
        port_text = rest[1:] if rest else None
    else:
        host, sep, port_text_found = authority.rpartition(":")
        if not sep:
            host, port_text = authority, None
        else:
            port_text = port_text_found
        if ":" in host:
            raise Refused(400, "IPv6 addresses must be in brackets", clip(authority))
    if not host:
        raise Refused(400, "no host in the request target")
    if port_text is None or port_text == "":
        if default_port is None:
            raise Refused(400, "CONNECT needs host:port", clip(host))
        return host, default_port
    if not port_text.isascii() or not port_text.isdigit() or len(port_text) > 5 or not 1 <= int(port_text) <= 65535:
        raise Refused(400, f"bad port {port_text[:8]!r}", clip(host))
    return host, int(port_text)


def origin_head(request: Request, host: str, port: int) -> bytes:
    """The request head in origin-form, Host set from the URI, hop-by-hop headers dropped."""
    listed = {
        token.strip().lower()
        for name, value in request.headers
        if name.lower() in (b"connection", b"proxy-connection")
        for token in value.decode("latin-1").split(",")
    }
    lines = [request.method + b" " + request.origin + b" " + request.version]
    shown = authority(host, port) if port != 80 else authority(host, None)
    lines.append(b"Host: " + shown.encode("ascii"))
    for name, value in request.headers:
        lowered = name.decode("ascii").lower()
        if lowered == "host" or lowered in _HOP_BY_HOP or lowered in listed:
            continue
        lines.append(name + b": " + value)
    lines.append(b"Connection: close")
    return b"\r\n".join(lines) + b"\r\n\r\n"


def authority(host: str, port: int | None) -> str:
    shown = f"[{host}]" if ":" in host else host
    return shown if port is None else f"{shown}:{port}"


def clip(text: str) -> str:
    return text[:_MAX_REPORTED_HOST]
