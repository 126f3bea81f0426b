"""Start the remote test server (`remote.py`) as a subprocess for a test and stop it afterwards.

``run_remote("oauth", lifetime=1)`` is a context manager yielding the server's MCP URL; the
process gets SIGTERM on exit. ``spawn_remote`` is the lower-level piece for tests that need the
process itself.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Literal

REMOTE = Path(__file__).with_name("remote.py")
RemoteAuth = Literal["none", "bearer", "oauth"]

# The `mcp` import alone takes up to a couple of seconds on a cold, busy machine.
READY_TIMEOUT = 20.0
# uvicorn's graceful shutdown is capped at 2 s in remote.py; anything longer is a hang.
STOP_TIMEOUT = 10.0


class RemoteStartError(RuntimeError):
    """The remote test server exited or stayed silent before printing its READY line."""


def spawn_remote(
    auth: RemoteAuth,
    env: Mapping[str, str] | None = None,
    lifetime: int | None = None,
    *,
    log: IO[bytes] | None = None,
    port: int = 0,
    extra: tuple[str, ...] = (),
) -> tuple[subprocess.Popen[bytes], str]:
    """Start `remote.py --auth <auth>` on a free port and wait for READY.

    `env` is added to this process's environment (put `REMOTE_TOKEN` there, never in argv);
    `lifetime` is `--token-lifetime`; the server's stderr goes to `log`, else to ours; `port` 0 is
    any free port (a fixed one lets a test restart the server at the same URL); `extra` are more
    arguments (`--client-id ID`).

    Returns:
        The running process and its MCP URL.

    Raises:
        RemoteStartError: The server exited or did not print READY within `READY_TIMEOUT`.
    """
    args = [sys.executable, str(REMOTE), "--auth", auth, "--port", str(port), *extra]
    if lifetime is not None:
        args += ["--token-lifetime", str(lifetime)]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=log, env={**os.environ, **(env or {})})
    try:
        url = _wait_ready(proc)
    except BaseException:
        stop_remote(proc)
        raise
    return proc, url


def stop_remote(proc: subprocess.Popen[bytes]) -> int:
    """SIGTERM `proc`, wait for it (killing it if it hangs), and return its exit status."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()
    return proc.returncode


@contextmanager
def run_remote(
    auth: RemoteAuth,
    env: Mapping[str, str] | None = None,
    lifetime: int | None = None,
    *,
    log: IO[bytes] | None = None,
    extra: tuple[str, ...] = (),
) -> Iterator[str]:
    """Run the remote test server for the duration of the block; yields its MCP URL.

    Raises:
        RemoteStartError: The server did not come up (see `spawn_remote`).
    """
    proc, url = spawn_remote(auth, env, lifetime, log=log, extra=extra)
    try:
        yield url
    finally:
        stop_remote(proc)


def _wait_ready(proc: subprocess.Popen[bytes]) -> str:
    """Read stdout until the READY line, with a deadline; raw reads so `select` sees all buffered data."""
    if proc.stdout is None:
        raise RemoteStartError("remote server was started without a stdout pipe")
    fd = proc.stdout.fileno()
    deadline = time.monotonic() + READY_TIMEOUT
    buffer = b""
    while b"\n" not in buffer:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise RemoteStartError(f"remote server printed no READY line within {READY_TIMEOUT:.0f} s")
        readable, _, _ = select.select([fd], [], [], remaining)
        if not readable:
            continue
        chunk = os.read(fd, 4096)
        if not chunk:
            status = proc.wait(STOP_TIMEOUT)
            raise RemoteStartError(f"remote server exited with status {status} before READY (see its stderr)")
        buffer += chunk
    line = buffer.split(b"\n", 1)[0].decode()
    word, _, url = line.partition(" ")
    if word != "READY" or not url.startswith("http://"):
        raise RemoteStartError(f"remote server's first line is not READY: got {line!r}, expected 'READY http://...'")
    return url
