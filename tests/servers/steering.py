"""Steering: a server that tries to steer what `learn: true` proposes, and writes what it may.

Run as ``python tests/servers/steering.py [--clobber FILE] [--dial SOCKET]``. With ``--clobber
FILE`` it writes "clobbered" over FILE at start, with ``--dial SOCKET`` it connects to that Unix
socket at start and sends "dialed" (where its jail lets it; errors are ignored).

Tools (each tries every attempt and ignores what the jail refuses; none fails):

- ``open`` (``paths``, ``write``, ``mode``): opens each path, for reading, or for appending when
  ``write``, or in ``mode`` (``r+``: for writing, never creating it) when given.
- ``lookup`` (``names``): sends a DNS query for each name (a list of labels, each sent as it is,
  dots and slashes included) to 192.0.2.53:53.
- ``connect`` (``targets``): a TCP connection to each ``[host, port]`` (IPv4 or IPv6, blocking).
- ``append`` (``path``, ``text``): appends ``text`` to the file; says "wrote" or the error.
- ``read`` (``path``): says "read N bytes" or the error.
- ``run`` (``path``, ``text``): writes ``text`` into ``path`` when given (or a ``#!/bin/sh`` script
  that exits 0 when the file is no script), makes it executable and runs it; says "ran" or the error.
- ``link`` (``path``, ``target``): makes ``path`` a symbolic link to ``target``, in place of what
  is there; says "linked" or the error.
- ``fetch`` (``url``): fetches the URL (through the proxy the environment names); says "fetched"
  or the error.
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from raw import Raw, text

RESOLVER = ("192.0.2.53", 53)


def _query(labels: list[str]) -> bytes:
    """A DNS query (type A) for `labels`, each label's bytes as given."""
    name = b"".join(bytes([len(label)]) + label.encode() for label in labels) + b"\0"
    return struct.pack("!HHHHHH", 0x1234, 0x0100, 1, 0, 0, 0) + name + struct.pack("!HH", 1, 1)


def _script(path: Path) -> bool:
    try:
        return path.read_bytes().startswith(b"#!")
    except OSError:
        return False


class Steering(Raw):
    def tools(self) -> list[dict[str, Any]]:
        items = {"type": "array", "items": {}}
        schemas = {
            "open": {"paths": items, "write": {"type": "boolean"}, "mode": {"type": "string"}},
            "lookup": {"names": items},
            "connect": {"targets": items},
            "append": {"path": {"type": "string"}, "text": {"type": "string"}},
            "read": {"path": {"type": "string"}},
            "fetch": {"url": {"type": "string"}},
            "run": {"path": {"type": "string"}, "text": {"type": "string"}},
            "link": {"path": {"type": "string"}, "target": {"type": "string"}},
        }
        return [
            {"name": n, "description": f"steering {n}", "inputSchema": {"type": "object", "properties": p}}
            for n, p in schemas.items()
        ]

    def call(self, ident: Any, params: dict[str, Any]) -> dict[str, Any] | None:
        name, arguments = params.get("name"), params.get("arguments") or {}
        if name == "open":
            for path in arguments.get("paths", []):
                mode = arguments.get("mode") or ("a" if arguments.get("write") else "r")
                with contextlib.suppress(OSError), open(path, mode):
                    pass
            return text("opened")
        if name == "lookup":
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
                for labels in arguments.get("names", []):
                    with contextlib.suppress(OSError):
                        sock.sendto(_query(labels), RESOLVER)
            return text("looked up")
        if name == "connect":
            for target in arguments.get("targets", []):  # blocking: the refusal is the call's own result
                host, port = target if isinstance(target, list) and len(target) == 2 else ("", 0)
                family = socket.AF_INET6 if ":" in str(host) else socket.AF_INET
                with contextlib.suppress(OSError, ValueError, TypeError), socket.socket(family) as sock:
                    sock.connect((str(host), int(port)))
            return text("connected")
        if name == "append":
            try:
                with open(str(arguments.get("path")), "a") as out:
                    out.write(str(arguments.get("text", "")))
            except OSError as exc:
                return text(f"{type(exc).__name__}: {exc}")
            return text("wrote")
        if name == "read":
            try:
                return text(f"read {len(Path(str(arguments.get('path'))).read_bytes())} bytes")
            except OSError as exc:
                return text(f"{type(exc).__name__}: {exc}")
        if name == "run":
            import subprocess

            path = Path(str(arguments.get("path")))
            try:
                if arguments.get("text") or not _script(path):
                    path.write_text(str(arguments.get("text") or "#!/bin/sh\nexit 0\n"))
                with contextlib.suppress(OSError):
                    path.chmod(0o755)
                subprocess.run([str(path)], check=True, timeout=10)
            except (OSError, subprocess.SubprocessError) as exc:
                return text(f"{type(exc).__name__}: {exc}")
            return text("ran")
        if name == "link":
            path = Path(str(arguments.get("path")))
            swap = path.with_name(path.name + ".link")
            try:
                swap.unlink(missing_ok=True)
                swap.symlink_to(str(arguments.get("target")))
                swap.replace(path)
            except OSError as exc:
                return text(f"{type(exc).__name__}: {exc}")
            return text("linked")
        if name == "fetch":
            import urllib.request

            try:
                with urllib.request.urlopen(str(arguments.get("url")), timeout=5) as page:
                    page.read(100)
            except OSError as exc:
                return text(f"{type(exc).__name__}: {exc}")
            return text("fetched")
        return super().call(ident, params)


def main() -> None:
    argv = sys.argv[1:]
    if "--clobber" in argv:
        with contextlib.suppress(OSError):
            Path(argv[argv.index("--clobber") + 1]).write_text("clobbered\n")
    if "--dial" in argv:
        with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX) as sock:
            sock.connect(argv[argv.index("--dial") + 1])
            sock.sendall(b"dialed")
    sys.argv = [sys.argv[0]]
    from raw import main as serve

    serve(Steering)


if __name__ == "__main__":
    os.umask(0o077)
    main()
