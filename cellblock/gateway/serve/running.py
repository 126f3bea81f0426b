"""The running gateways, reached through their control sockets: which run, what each answers, and
an approve or deny answered by the one gateway that holds the pending call; and the running
dashboard's address, which a gateway gives with each approval it waits for.

The client side that `cellblock pending|approve|deny|ps` and `cellblock dashboard` share, so the
two can never drift apart; the protocol itself is `serve/control.py`'s.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cellblock.gateway.serve.control import NOT_FOUND, ControlError, gateways, request
from cellblock.gateway.state import RuntimeDirError, StateWriteError, atomic_write_json, read_json, runtime_dir

__all__ = [
    "SCOPE_TEXT",
    "Answered",
    "answer_pending",
    "approval_link",
    "ask_each",
    "duration",
    "network_text",
    "pid_of",
    "publish_dashboard",
    "running",
    "time_left",
    "withdraw_dashboard",
]

# where `cellblock dashboard` says it serves, in the runtime directory: its port and pid, never
# its secret (the page's address given to a client or a notification opens no session by itself)
DASHBOARD_FILE = "dashboard.json"

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


def publish_dashboard(port: int) -> Path | None:
    """Say that this process serves the dashboard on `port`, for the gateways' approval links; the
    last dashboard started wins. None where it cannot be said (the links are then left out).
    """
    try:
        path = runtime_dir() / DASHBOARD_FILE
        atomic_write_json(path, {"pid": os.getpid(), "port": port})
    except (RuntimeDirError, StateWriteError):
        return None
    return path


def withdraw_dashboard(path: Path) -> None:
    """Take back what `publish_dashboard` said, unless a dashboard started since has said its own."""
    published = read_json(path)
    if isinstance(published, dict) and published.get("pid") == os.getpid():
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def approval_link(ident: str) -> str | None:
    """The address of pending approval `ident` on the running dashboard, or None when none runs.
    It carries no secret: it opens the page in a browser that already has the dashboard's session
    (`cellblock dashboard` opened it there), and nowhere else."""
    try:
        published = read_json(runtime_dir() / DASHBOARD_FILE)
    except RuntimeDirError:
        return None
    if not isinstance(published, dict):
        return None
    pid, port = published.get("pid"), published.get("port")
    if not (isinstance(pid, int) and isinstance(port, int) and 0 < port < 65536 and pid > 0):
        return None
    try:
        os.kill(pid, 0)  # a dashboard that died without taking its file back is no link
    except ProcessLookupError:
        return None
    except PermissionError:
        return None  # another user's process by now: not our dashboard
    return f"http://127.0.0.1:{port}/#approval={ident}"
