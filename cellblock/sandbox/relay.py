"""In-jail relay: 127.0.0.1:PORT -> the egress proxy's Unix socket, then run the server.

    python3 relay.py --listen 127.0.0.1:PORT --socket PATH [--set-proxy-env] -- ARGV...

Runs INSIDE the jail with whatever python3 is mounted there, so it is one standalone file: stdlib
only, no `cellblock` import. It listens first, then starts ARGV with the inherited stdin, stdout
and stderr (stdout carries MCP, so the relay never writes to it), forwards SIGTERM, SIGINT and
SIGHUP to the child, and exits with the child's exit code, or 128 + N when a signal N ended it.
Each accepted TCP connection is piped to a fresh connection on the Unix socket; the relay does
not look at the bytes, the proxy does all checking.

With `--set-proxy-env` the child gets http_proxy, https_proxy, HTTP_PROXY and HTTPS_PROXY pointing
at the listener (PORT may then be 0 for an ephemeral port) and no no_proxy/NO_PROXY.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from types import FrameType

__all__ = ["main"]

# Connections piped at once; more are closed on accept. The proxy has its own, lower limit; this
# only keeps a runaway client from making the relay spawn threads without bound.
MAX_CONNECTIONS = 256
# Seconds to open the Unix socket connection; the proxy accepts at once when it is up.
CONNECT_TIMEOUT = 10.0
# Seconds to pause after a failed accept (out of file descriptors) instead of spinning.
ACCEPT_BACKOFF = 0.1
_CHUNK = 64 * 1024
_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_PROXY_VARS = ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY")
_NO_PROXY_VARS = ("no_proxy", "NO_PROXY")
_EXIT_CANNOT_START = 127


def _say(message: str) -> None:
    print(f"cellblock-relay: {message}", file=sys.stderr, flush=True)


def _parse_listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT (got {text!r})")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    return host, int(port)


def _pump(source: socket.socket, sink: socket.socket) -> None:
    """Copy one direction until EOF, then half-close the sink."""
    try:
        while True:
            data = source.recv(_CHUNK)
            if not data:
                break
            sink.sendall(data)
    except OSError:
        # a reset on one side: tear down both directions
        for s in (source, sink):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
        return
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_WR)


def _serve_connection(client: socket.socket, socket_path: str, slots: threading.BoundedSemaphore) -> None:
    try:
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            upstream.settimeout(CONNECT_TIMEOUT)
            upstream.connect(socket_path)
            upstream.settimeout(None)
        except OSError as exc:
            _say(f"cannot reach the egress proxy at {socket_path}: {exc}")
            upstream.close()
            return
        with upstream:
            back = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
            back.start()
            _pump(client, upstream)
            back.join()
    finally:
        client.close()
        slots.release()


def _accept_loop(listener: socket.socket, socket_path: str) -> None:
    slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
    while True:
        try:
            client, _ = listener.accept()
        except OSError as exc:
            _say(f"accept failed: {exc}")
            time.sleep(ACCEPT_BACKOFF)
            continue
        if not slots.acquire(blocking=False):
            client.close()
            continue
        threading.Thread(target=_serve_connection, args=(client, socket_path, slots), daemon=True).start()


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((host, port))
    listener.listen(128)
    return listener


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="relay.py", description="Relay 127.0.0.1:PORT to the egress proxy, then run ARGV."
    )
    parser.add_argument("--listen", required=True, type=_parse_listen, help="HOST:PORT to listen on (loopback)")
    parser.add_argument("--socket", required=True, help="the egress proxy's Unix socket")
    parser.add_argument("--set-proxy-env", action="store_true", help="point the child's *_proxy variables here")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- ARGV of the server to run")
    args = parser.parse_args(argv)
    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        parser.error("no command given after --")

    try:
        listener = _listen(*args.listen)
    except OSError as exc:
        _say(f"cannot listen on {args.listen[0]}:{args.listen[1]}: {exc}")
        return _EXIT_CANNOT_START
    host, port = listener.getsockname()[:2]
    threading.Thread(target=_accept_loop, args=(listener, args.socket), daemon=True).start()

    env = dict(os.environ)
    if args.set_proxy_env:
        shown = f"[{host}]" if ":" in host else host
        for name in _PROXY_VARS:
            env[name] = f"http://{shown}:{port}"
        for name in _NO_PROXY_VARS:
            env.pop(name, None)

    # Handlers go in before the child exists, so a signal in between is kept and passed on.
    child: subprocess.Popen[bytes] | None = None
    pending: list[int] = []

    def forward(signum: int, _frame: FrameType | None) -> None:
        if child is None:
            pending.append(signum)
        else:
            with contextlib.suppress(OSError):
                child.send_signal(signum)

    for each in _FORWARDED:
        signal.signal(each, forward)

    try:
        child = subprocess.Popen(command, env=env)
    except OSError as exc:
        _say(f"cannot start {command[0]!r}: {exc}")
        return _EXIT_CANNOT_START
    for waiting in pending:
        child.send_signal(waiting)

    code = child.wait()
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main())
