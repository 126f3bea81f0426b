"""The running gateways, reached through their control sockets: which run, what each answers, and
an approve or deny answered by the one gateway that holds the pending call.

The client side that `cellblock pending|approve|deny|ps` and `cellblock dashboard` share, so the
two can never drift apart; the protocol itself is `serve/control.py`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cellblock.gateway.serve.control import NOT_FOUND, ControlError, gateways, request
from cellblock.gateway.state import runtime_dir

__all__ = [
    "SCOPE_TEXT",
    "Answered",
    "answer_pending",
    "ask_each",
    "duration",
    "network_text",
    "pid_of",
    "running",
    "time_left",
]

# how an approval's scope is said, by `cellblock approve` and the dashboard alike
SCOPE_TEXT = {"once": "once", "session": "for this session", "always": "always"}


def running() -> list[Path]:
    """The control sockets of the running gateways.

    Raises:
        ControlError: the runtime directory cannot be read.
    """
    try:
        return gateways(runtime_dir())
    except OSError as exc:
        raise ControlError(f"runtime dir: {exc}") from exc


def pid_of(path: Path) -> str:
    return path.name.removeprefix("control-").removesuffix(".sock")


def ask_each(message: dict[str, Any]) -> list[tuple[Path, dict[str, Any] | ControlError]]:
    """Each running gateway's reply to `message`, or the error of one that did not answer.

    Raises:
        ControlError: the runtime directory cannot be read.
    """
    replies: list[tuple[Path, dict[str, Any] | ControlError]] = []
    for path in running():
        try:
            replies.append((path, request(path, message)))
        except ControlError as exc:
            replies.append((path, exc))
    return replies


@dataclass(frozen=True)
class Answered:
    """What became of an approve or deny sent to the running gateways."""

    done: bool  # a gateway held the id and took the answer
    gateways: int  # how many were running
    refusals: tuple[str, ...] = ()  # "PID: why" of each gateway that held the id and refused
    unreachable: tuple[str, ...] = ()  # why each gateway that did not answer did not


def answer_pending(message: dict[str, Any]) -> Answered:
    """Send `message` (`{"op": "approve"|"deny", "id": ..., ...}`) to each running gateway until
    one holds the id; a gateway's NOT_FOUND means "not mine", anything else is a refusal.

    Raises:
        ControlError: the runtime directory cannot be read.
    """
    refusals: list[str] = []
    unreachable: list[str] = []
    paths = running()
    for path in paths:
        try:
            reply = request(path, message)
        except ControlError as exc:
            unreachable.append(str(exc))
            continue
        if reply["ok"]:
            return Answered(True, len(paths), tuple(refusals), tuple(unreachable))
        if reply.get("code") != NOT_FOUND:
            refusals.append(f"{pid_of(path)}: {reply.get('error', 'refused')}")
    return Answered(False, len(paths), tuple(refusals), tuple(unreachable))


def network_text(server: dict[str, Any]) -> str:
    """How a `ps` reply's server runs: UNJAILED, remote, or its jail's network (and backend)."""
    jail = server.get("jail")
    # jail: false is the one way to run unjailed, and it must be said plainly; "network none" is a
    # jail's network, which "jail none" would misread as no jail at all
    text = "UNJAILED" if jail is False else "remote" if jail == "remote" else f"network {jail}"
    if server.get("backend"):
        text += f" ({server['backend']})"
    return text


def time_left(item: dict[str, Any], now: float) -> str:
    """A `pending` item's time: while its call waits, what is left of the wait; after, what is left
    for its retry to be let through; else "expired"."""
    waits, expires = item.get("waits_until"), _number(item.get("expires"), now) - now
    if expires <= 0:
        return "expired"
    return duration(_number(waits, now) - now) if waits else f"retry {duration(expires)}"


def duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def _number(value: Any, default: float) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else default
