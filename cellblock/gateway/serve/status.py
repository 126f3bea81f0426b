"""The gateway's own tools: what Cellblock holds back for the user, and a way to ask them.

Right after `cellblock wrap` the lock holds every catalog, so the client lists no tools and the
model can only guess why. While anything is held the catalog offers `cellblock<sep>status`,
which tells what is held, which calls wait for an approval and which servers are down, with the
commands the user runs. It reads; it approves, starts and changes nothing, whoever calls it.

Beside it, `cellblock<sep>review` puts one held catalog before the user in the client's own form
(both eras), as `cellblock review` does in a terminal. The user's answer decides; the call itself
carries no decision (its only argument is the server), so a model cannot approve anything with it.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import mcp.types as types

from cellblock.gateway.config.model import RESERVED_SERVER, Config
from cellblock.gateway.downstream.listing import Listing

__all__ = [
    "CALL",
    "FIND",
    "NAMESPACE",
    "REVIEW",
    "STATUS",
    "ServerStatus",
    "instructions",
    "review_tool",
    "status_text",
    "status_tool",
    "tool_name",
]

NAMESPACE = RESERVED_SERVER  # no server may take this name: the gateway's own tools live under it
STATUS, REVIEW = "status", "review"
FIND, CALL = "find_tools", "call_tool"  # tool search's (serve/search.py)
INSTRUCTIONS = (
    "Cellblock gateway. Every tool, prompt and resource here belongs to one downstream server and is "
    "named '<server>{sep}<name>'."
)


@dataclass(frozen=True)
class ServerStatus:
    name: str
    held: int  # items the lock holds back
    first_contact: bool  # nothing of it was ever approved
    down: str | None  # why it is not running, when it is not


def tool_name(separator: str, max_length: int, tool: str = STATUS) -> str:
    """`cellblock<sep>status` (or `review`), cut to the names' length limit (its prefix is never a
    server's)."""
    return f"{NAMESPACE}{separator}{tool}"[:max_length]


def review_tool(separator: str, max_length: int, held: Iterable[str]) -> types.Tool:
    return types.Tool(
        name=tool_name(separator, max_length, REVIEW),
        title="Cellblock: ask the user to review a held server",
        description=(
            "Shows the user, in this client's own form, what a server whose tools Cellblock holds offers, "
            "and asks them whether to approve it. Only the user's answer approves; call it when the user "
            "wants to start using that server. Without a form in this client, it says what the user runs."
        ),
        input_schema={
            "type": "object",
            "properties": {"server": {"type": "string", "enum": sorted(held)}},
            "required": ["server"],
            "additionalProperties": False,
        },
        annotations=types.ToolAnnotations(
            read_only_hint=False, destructive_hint=False, idempotent_hint=True, open_world_hint=False
        ),
    )


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


def status_text(servers: Iterable[ServerStatus], pending: Iterable[Mapping[str, Any]], review: str) -> str:
    """The status as the model reads it: one line per thing waiting, each with its command
    (`review`: the name of the review tool)."""
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
        lines.append(f"In a client that shows forms, {review} with a server's name asks the user there.")
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


def instructions(config: Config, held: Mapping[str, Any], shown: Mapping[str, Listing]) -> str:
    """What the client is told of the catalog: how names are made, what is held and how tools are
    found (`catalog.search`), then each server's own instructions."""
    names = config.names
    parts = [INSTRUCTIONS.format(sep=names.separator)]
    if bare := sorted(config.unprefixed()):
        parts.append(f"Except those of {', '.join(bare)}: they keep their own names.")
    find, call = (tool_name(names.separator, names.max_length, tool) for tool in (FIND, CALL))
    if config.catalog.search == "on":
        parts.append(
            f"Most tools are not listed: find the ones for a task with {find} (a request in words) "
            f"and call them with {call}."
        )
    elif config.catalog.search == "auto":
        parts.append(
            f"When the catalog is larger than this client takes, most tools are not listed: then the list "
            f"holds {find}, to find the ones for a task (a request in words), and {call} to call them."
        )
    if waiting := [name for name, items in held.items() if items]:
        parts.append(
            f"The tools of {', '.join(waiting)} are held for the user's review and not listed yet. Call "
            f"{tool_name(names.separator, names.max_length, STATUS)} to learn what waits, and tell the user what "
            f"to run; where the user wants a held server now, {tool_name(names.separator, names.max_length, REVIEW)} "
            "asks them in a form."
        )
    for name, listing in shown.items():
        if listing.instructions:
            parts.append(f"[{name}] {listing.instructions.strip()}")
    return "\n\n".join(parts)
