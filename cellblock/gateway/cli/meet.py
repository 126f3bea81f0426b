"""Meeting the servers no gateway has met: the step `review`, `diff --all` and `approve --all` take first.

Right after `cellblock wrap` nothing is approved and nothing is held: no gateway has started the
servers yet. Each of those commands starts the gateway once, as a client does; it starts every
server it has not met in its jail, and the lock holds what each offers for review.

What the gateway and the servers write meanwhile (its log, their stderr, an old SDK's dumps) goes
to a log file in the state dir, never to the terminal: a server's text could fake the review that
follows, and a user reading fourteen servers wants one line for each that failed, naming the
server, the cause and the log. A server that could not be met is met again by the next command
(nothing of the failure is kept).
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import TextIO

import anyio

from cellblock.gateway.config.model import Config
from cellblock.gateway.state import lock_path, pending_path
from cellblock.gateway.terminal import printable

__all__ = ["MEETING_LOG", "causes", "meet", "meet_unmet", "unmet"]

MEETING_LOG = "meeting.log"  # in the state dir: the last meeting's gateway log, servers' stderr included

# the gateway's own lines about a server that stopped (a server's relayed stderr starts with
# `[NAME stderr] `, so it cannot write one of these)
_CAUSE = 300  # characters of a cause said on the terminal: the rest is in the log
_STOPPED = re.compile(r"^cellblock: \w+ [\w.]+: server '([^']+)' (?:failed: (.*)|is down \((.*)\); restarting in .*)$")


def unmet(config: Config, state: Path) -> list[str]:
    """The servers of `config` no gateway has met yet: nothing approved, nothing held."""
    return [n for n in config.servers if not lock_path(state, n).exists() and not pending_path(state, n).exists()]


def meet_unmet(config: Config, source: Path, state: Path) -> list[str]:
    """Meet the servers of `config` (from `source`) no gateway has met, saying one line for each
    that could not be met; the servers still unmet."""
    waiting = unmet(config, state)
    if not waiting:
        return []
    print(
        f"cellblock: meeting {', '.join(waiting)}: each starts once in its jail to say what it offers", file=sys.stderr
    )
    log = state / MEETING_LOG
    state.mkdir(mode=0o700, parents=True, exist_ok=True)
    log.unlink(missing_ok=True)  # replaced, 0600: a server's stderr is its own business
    with open(
        os.open(log, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600), "w", encoding="utf-8"
    ) as errlog:
        anyio.run(meet, source, dict(os.environ), errlog)
    left = unmet(config, state)
    found = causes(log)
    for name in left:
        cause = found.get(name, "it did not say what it offers in time")
        print(
            f"cellblock: could not meet '{name}': {printable(cause)}; the log is {log}. It is met again at the "
            "next review, diff --all or approve --all",
            file=sys.stderr,
        )
    return left


def causes(log: Path) -> dict[str, str]:
    """server -> why it first stopped, from the gateway's own lines in the meeting's log: a server
    that fails is started again while the meeting lasts, and a later start may end only because the
    meeting does (its proxy's socket gone as its jail starts), which says nothing of the server."""
    found: dict[str, str] = {}
    try:
        text = log.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return found
    for line in text.splitlines():
        stopped = _STOPPED.match(line)
        if stopped:
            cause = stopped[2] or stopped[3]
            found.setdefault(stopped[1], cause if len(cause) <= _CAUSE else f"{cause[:_CAUSE]}…")
    return found


async def meet(config_file: Path, env: dict[str, str], errlog: TextIO) -> None:
    """Start the gateway on `config_file` once, as a client does, so that it meets every server it
    has not met: each starts in its jail, and the lock holds what it offers for review. All the
    gateway writes (the servers' stderr in it) goes to `errlog`."""
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters, stdio_client

    serve = ["-m", "cellblock.gateway.cli.main", "serve", "--config", str(config_file)]
    params = StdioServerParameters(command=sys.executable, args=serve, env=env)
    async with Client(stdio_client(params, errlog=errlog), cache=None) as client:
        await client.list_tools()  # answered once the servers it starts have settled (bounded)
