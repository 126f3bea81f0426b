"""How a server that keeps crashing is restarted: the waits between attempts, and when to stop.

One kind of failure never counts toward stopping: the gateway running out of file descriptors
(EMFILE, ENFILE) while a server starts. That is the gateway's state, not the server's fault, and
it passes (a flood of connections ends, other servers close files): such a start is tried again,
at the wait of the last restart allowed, until it works (`OutOfDescriptors`).
"""

from __future__ import annotations

import errno
from collections.abc import Awaitable, Iterator
from dataclasses import dataclass
from typing import TypeVar

__all__ = ["Backoff", "OutOfDescriptors", "exhausted_by", "grouped", "short_of_descriptors"]

E = TypeVar("E", bound=BaseException)

_EXHAUSTED = (errno.EMFILE, errno.ENFILE)


@dataclass(frozen=True)
class Backoff:
    """Restarts after quick failures wait `first` seconds, doubling up to `most`; after `restarts`
    quick failures in a row the server is marked failed. A run that lasted `healthy` seconds resets
    the count, so a server that crashes once a day is restarted every time."""

    first: float = 0.5
    most: float = 10.0
    restarts: int = 5
    healthy: float = 30.0

    def delay(self, failures: int) -> float:
        """The wait before the next attempt after `failures` quick failures in a row (1 or more)."""
        return min(self.first * 2.0 ** (failures - 1), self.most)

    def count(self, failures: int, lasted: float, exhausted: bool = False) -> int:
        """The quick failures in a row once a run of `lasted` seconds has ended, `failures` before it.
        A run that failed for want of file descriptors (`exhausted`) counts no further than the last
        restart allowed: it is tried again, never given up on."""
        if lasted > self.healthy:
            return 1
        return min(failures + 1, self.restarts) if exhausted else failures + 1


class OutOfDescriptors(OSError):
    """A start failed because the gateway (or the system) had no file descriptor left to give it."""


def exhausted_by(exc: BaseException) -> OSError | None:
    """The EMFILE or ENFILE error `exc` comes of, if any: itself, one of its causes, or of its group."""
    for error in _errors(exc, causes=True):
        if isinstance(error, OSError) and error.errno in _EXHAUSTED:
            return error
    return None


def grouped(exc: BaseException, kinds: tuple[type[E], ...]) -> E | None:
    """`exc` if it is one of `kinds`, else the first of them in its group (a task group raises
    what failed in it as a group): a failure the supervisor handles by its kind."""
    for error in _errors(exc, causes=False):
        if isinstance(error, kinds):
            return error
    return None


def _errors(exc: BaseException, causes: bool) -> Iterator[BaseException]:
    """`exc`, the errors of its groups and (with `causes`) what each came of, each once."""
    seen: set[int] = set()
    todo = [exc]
    while todo:
        error = todo.pop()
        if id(error) in seen:
            continue
        seen.add(id(error))
        yield error
        if isinstance(error, BaseExceptionGroup):
            todo.extend(reversed(error.exceptions))
        if causes:
            todo.extend(e for e in (error.__cause__, error.__context__) if e is not None)


async def short_of_descriptors(run: Awaitable[None], alone: tuple[type[Exception], ...] = ()) -> None:
    """Await `run`; a failure that comes of running out of file descriptors, whatever it was
    raised as (a jail that could not be built, a group of a task group's errors), is raised as
    `OutOfDescriptors`, so the supervisor retries it. One of the kinds `alone` that a task group on
    the way (an allowlist's proxy) raised in a group is raised alone: the supervisor handles those
    by their kind (restarting cannot install a package or read a keyring).

    Raises:
        OutOfDescriptors: see above; one of `alone`; any other exception of `run` as it is.
    """
    try:
        await run
    except Exception as exc:  # re-raised: only its kind is looked at
        error = exhausted_by(exc)
        if error is not None:
            raise OutOfDescriptors(f"the gateway ran out of file descriptors as it started ({error.strerror})") from exc
        single = grouped(exc, alone) if isinstance(exc, BaseExceptionGroup) else None
        if single is None:
            raise
        raise single from exc
