"""Accepting on a listener while the process is out of descriptors (retried, and told within a
budget), or when the connection failed as it was accepted (passed over)."""

from __future__ import annotations

import errno
import logging
import socket

import pytest

from cellblock.sandbox import unix

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Exhausted:
    """A listener whose next `failures` accepts fail with `error` (EMFILE); it always looks readable."""

    def __init__(self, ready: socket.socket, failures: int) -> None:
        self.ready, self.failures = ready, failures
        self.error = OSError(errno.EMFILE, "Too many open files")

    def fileno(self) -> int:
        return self.ready.fileno()

    def accept(self) -> tuple[socket.socket, object]:
        if self.failures:
            self.failures -= 1
            raise self.error
        return socket.socket(), None


@pytest.mark.parametrize(("tell_every", "lines"), [(unix.ACCEPT_TELL_SECONDS, 1), (0.0, 60)])
async def test_accepts_that_keep_failing_are_told_once_in_a_while_not_once_each(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tell_every: float, lines: int
) -> None:
    monkeypatch.setattr(unix, "ACCEPT_BACKOFF", 0)
    monkeypatch.setattr(unix, "ACCEPT_TELL_SECONDS", tell_every)  # 0: the control, a line per failure
    monkeypatch.setattr(unix, "_untold", {})
    left, right = socket.socketpair()
    right.send(b"x")  # `left` is readable from now on
    with left, right, caplog.at_level(logging.WARNING, logger=unix.__name__):
        for _ in range(3):  # three connections, each after 20 failures
            (await unix.accept(Exhausted(left, 20), "listener")).close()  # type: ignore[arg-type]  # duck-typed
    told = [r.getMessage() for r in caplog.records if r.name == unix.__name__]
    assert len(told) == lines, told
    assert told[0] == "listener: accept failed 1 time(s) (Too many open files); backing off"


@pytest.mark.parametrize("code", [errno.ECONNABORTED, errno.EPROTO, errno.EHOSTUNREACH])
async def test_a_connection_that_failed_as_it_was_accepted_is_passed_over(code: int) -> None:
    left, right = socket.socketpair()
    right.send(b"x")
    listener = Exhausted(left, 1)
    listener.error = OSError(code, "its own")
    with left, right:
        (await unix.accept(listener, "listener")).close()  # type: ignore[arg-type]  # duck-typed
    assert listener.failures == 0
