"""An escape attempt's outcome, and the guard that keeps any attempt from raising."""

from __future__ import annotations

import errno
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["Attempt", "errno_name", "error_label", "never_raises"]


@dataclass(frozen=True)
class Attempt:
    """The outcome of one escape attempt. `got_through` True means the jail failed to stop it."""

    name: str  # the kind, e.g. "read"
    target: str
    got_through: bool
    detail: str
    amount: int | None = None  # what it got, when that is a quantity (processes made, MiB had)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def line(self) -> str:
        """One line for humans: ``GOT THROUGH read /etc/shadow: read 1 byte(s)``."""
        verdict = "GOT THROUGH" if self.got_through else "blocked"
        return f"{verdict} {self.name} {self.target}: {self.detail}"


def error_label(exc: BaseException) -> str:
    """An error's class and errno name, without the paths or data some messages carry."""
    code = getattr(exc, "errno", None)
    if isinstance(code, int) and code in errno.errorcode:
        return f"{type(exc).__name__} {errno.errorcode[code]}"
    return type(exc).__name__


def never_raises(kind: str) -> Callable[[Callable[..., Attempt]], Callable[..., Attempt]]:
    """Turn any error an attempt did not expect into a blocked result that names the error.

    An attempt that crashed proves nothing either way; the honest controls (run unjailed, expected
    to get through) are what catch an attempt that is broken rather than blocked.
    """

    def wrap(fn: Callable[..., Attempt]) -> Callable[..., Attempt]:
        def attempt(*args: Any, **kwargs: Any) -> Attempt:
            try:
                return fn(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - top level of one attempt: report, never crash the probe
                target = str(args[0]) if args else str(kwargs.get("path", kwargs.get("target", "")))
                return Attempt(kind, target, False, f"attempt failed unexpectedly: {error_label(exc)}")

        attempt.__name__ = fn.__name__
        attempt.__qualname__ = fn.__qualname__
        attempt.__doc__ = fn.__doc__
        return attempt

    return wrap


def errno_name(code: int | str) -> str:
    if isinstance(code, str):
        return code
    return errno.errorcode.get(code, f"error {code}")
