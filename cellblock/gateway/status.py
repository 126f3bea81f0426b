"""The gateway's own read-only tool: what Cellblock holds back for the user, and what they run.

Right after `cellblock wrap` the lock holds every catalog, so the client lists no tools and the
model can only guess why. While anything is held the catalog offers `cellblock<sep>status`,
which tells what is held, which calls wait for an approval and which servers are down, with the
commands the user runs. It reads; it approves, starts and changes nothing, whoever calls it.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import mcp.types as types

from cellblock.gateway.config import RESERVED_SERVER

__all__ = ["NAMESPACE", "ServerStatus", "status_text", "status_tool", "tool_name"]

NAMESPACE = RESERVED_SERVER  # no server may take this name: the gateway's own tools live under it
_TOOL = "status"


@dataclass(frozen=True)
class ServerStatus:
    name: str
    held: int  # items the lock holds back
    first_contact: bool  # nothing of it was ever approved
    down: str | None  # why it is not running, when it is not


def tool_name(separator: str, max_length: int) -> str:
    """`cellblock<sep>status`, cut to the names' length limit (its prefix is never a server's)."""
    return f"{NAMESPACE}{separator}{_TOOL}"[:max_length]


def status_tool(separator: str, max_length: int) -> types.Tool:
    return types.Tool(
        name=tool_name(separator, max_length),
        title="Cellblock: what waits for the user",
        description=(
            "Tells what Cellblock holds back until the user acts: servers whose tools are held for the "
            "user's review (so they are not listed), calls waiting for the user's approval, servers that "
            "are down, and the command the user runs in a terminal for each. Read-only: it approves and "
            "changes nothing. Call it when tools seem to be missing, then tell the user what to run."
        ),
        input_schema={"type": "object", "properties": {}, "additionalProperties": False},
        annotations=types.ToolAnnotations(
            read_only_hint=True, destructive_hint=False, idempotent_hint=True, open_world_hint=False
        ),
    )


def status_text(servers: Iterable[ServerStatus], pending: Iterable[Mapping[str, Any]]) -> str:
    """The status as the model reads it: one line per thing waiting, each with its command."""
    lines: list[str] = []
    servers = list(servers)
    held = [s for s in servers if s.held]
    if held:
        lines.append("Held for the user's review; their tools are not offered until the user approves them:")
        for s in held:
            why = "never reviewed" if s.first_contact else "changed since approved"
            lines.append(
                f"- {s.name}: {s.held} item(s), {why}. The user runs `cellblock diff {s.name}`, then "
                f"`cellblock approve {s.name}`"
            )
        lines.append("Or all at once, one server at a time in a terminal: `cellblock review`.")
    now = time.time()
    waiting = [p for p in pending if p.get("waits_until")]
    if waiting:
        lines.append("Calls waiting for the user's approval:")
        for p in waiting:
            left = max(0, int(float(p["waits_until"]) - now))
            lines.append(
                f"- {p.get('server')}: '{p.get('tool')}' ({left}s left): the user runs "
                f"`cellblock approve {p.get('id')}` or `cellblock deny {p.get('id')}`"
            )
    down = [s for s in servers if s.down]
    if down:
        lines.append("Not running:")
        lines += [f"- {s.name}: {s.down}" for s in down]
    return "\n".join(lines) or "Nothing is held or waiting for the user."
