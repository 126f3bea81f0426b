"""What the dashboard shows, read from every running gateway as `cellblock ps`, `cellblock
pending --full ID` and `cellblock diff` read it, and the approve or deny it sends them as `cellblock
approve|deny` and `cellblock approve SERVER --hash` do.

Every string a gateway relays (server and tool names, arguments, errors) came from a server or a
model: it is escaped here as the CLI escapes it (`visible`: control characters written as `\\u001b`),
and the page only ever sets it as text.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Protocol

from cellblock.gateway.dashboard.servers import server_details
from cellblock.gateway.serve.control import ControlError, request
from cellblock.gateway.serve.running import (
    SCOPE_TEXT,
    Answered,
    answer_pending,
    network_text,
    pid_of,
    running,
    time_left,
)
from cellblock.policy.text import visible

__all__ = ["MAX_SHOWN", "Gateways", "Source", "answer_text", "catalog_answer_text"]

# the approvals read in full per gateway and poll: a queue longer than any human answers one by one,
# and a cap on what a flood of waiting calls makes every poll cost
MAX_SHOWN = 50


class Source(Protocol):
    """Where the dashboard's data comes from and its answers go (a fake one in the unit tests)."""

    def state(self) -> dict[str, Any]:
        """The gateways, their servers and the waiting approvals, every string escaped."""
        ...

    def answer(self, message: dict[str, Any]) -> Answered:
        """Send an approve or deny (the control socket's message) to the gateway that holds it,
        or an `approve_catalog` to the gateway that runs its server."""
        ...


class Gateways:
    """The running gateways, through their control sockets (`serve/running.py`)."""

    def state(self) -> dict[str, Any]:
        try:
            paths = running()
        except ControlError as exc:
            return {"gateways": [], "approvals": [], "review": [], "errors": [visible(str(exc))]}
        gateways, approvals, errors = [], [], []
        review: dict[tuple[str, Any], dict[str, Any]] = {}
        now = time.time()
        for path in paths:
            try:
                gateways.append(_servers(path, request(path, {"op": "ps"})))
                approvals += _approvals(path, now)
                for item in _held(path):  # gateways of one state dir hold the same catalogs: once each
                    review.setdefault((item["server"], item.get("hash")), item)
            except ControlError as exc:  # gone between the listing and the question, or stuck
                errors.append(visible(str(exc)))
        return {"gateways": gateways, "approvals": approvals, "review": list(review.values()), "errors": errors}

    def answer(self, message: dict[str, Any]) -> Answered:
        return answer_pending(message)


def _servers(path: Path, reply: dict[str, Any]) -> dict[str, Any]:
    """One gateway's `ps` reply, as `cellblock ps --json` gives it, each string escaped."""
    if not reply["ok"]:
        return {"pid": pid_of(path), "error": visible(str(reply.get("error", "refused"))), "servers": []}
    servers = [s for s in reply.get("servers", []) if isinstance(s, dict)]
    return {
        "pid": visible(str(reply.get("pid", pid_of(path)))),
        "config": visible(str(reply.get("config", "?"))),
        "pending": _count(reply.get("pending")),
        "servers": [
            {
                "name": visible(str(s.get("name", "?"))),
                "state": visible(str(s.get("state", "?"))),
                "network": visible(network_text(s)),
                "tools": _count(s.get("tools")),
                "calls": _count(s.get("calls")),
                "fast_calls": _count(s.get("fast_calls")),
                "notes": [
                    visible(f"{label}: {value}")
                    for label, key in (("last stopped", "last_exit"), ("not running", "down"))
                    if (value := s.get(key))
                ]
                + [visible(f"not enforced: {gap}") for gap in s.get("not_enforced", []) if isinstance(gap, str)],
                # its lock, jail, package and last stderr lines (`dashboard/servers.py`)
                **server_details(s),
            }
            for s in servers
        ],
    }


def _approvals(path: Path, now: float) -> list[dict[str, Any]]:
    """The gateway's waiting approvals, each with every argument in full, as `pending --full` shows them."""
    listed = request(path, {"op": "pending"})
    idents = [str(i.get("id")) for i in listed.get("pending", []) if isinstance(i, dict)] if listed["ok"] else []
    shown = []
    for ident in idents[:MAX_SHOWN]:
        reply = request(path, {"op": "pending", "full": ident})
        items = [i for i in reply.get("pending", []) if isinstance(i, dict)] if reply["ok"] else []
        if not items:
            continue  # answered (or expired) since the listing
        item = items[0]
        kind = str(item.get("kind", "tool"))
        shown.append(
            {
                "id": visible(ident),
                "gateway": pid_of(path),
                "server": visible(str(item.get("server", "?"))),
                "kind": visible(kind),
                "tool": visible(str(item.get("tool", "?")).removeprefix(f"{kind}:")),
                "identity": visible(str(item.get("identity", ""))),
                "arguments": [visible(str(line)) for line in item.get("arguments", [])],
                "asks": visible(str(item["asks"])) if item.get("asks") else None,
                "left": time_left(item, now),
            }
        )
    return shown


def _held(path: Path) -> list[dict[str, Any]]:
    """The gateway's held catalogs, as `cellblock diff` shows them, each string escaped; the hash is
    kept as the gateway gave it (the page sends it back, and only a sha256 is accepted)."""
    reply = request(path, {"op": "held"})
    items = [i for i in reply.get("held", []) if isinstance(i, dict)] if reply["ok"] else []
    held: list[dict[str, Any]] = []
    for item in items:
        server = visible(str(item.get("server", "?")))
        if item.get("error") or not isinstance(item.get("hash"), str):
            held.append({"server": server, "error": visible(str(item.get("error", "no hash")))})
            continue
        tools = [t for t in item.get("tools", []) if isinstance(t, dict)]
        held.append(
            {
                "server": server,
                "gateway": pid_of(path),
                "first": item.get("first") is True,
                "hash": visible(item["hash"]),
                "diff": [visible(line) for line in str(item.get("diff", "")).split("\n")],
                "tools": [{"name": visible(str(t.get("name"))), "unasked": t.get("unasked") is True} for t in tools],
            }
        )
    return held


def catalog_answer_text(server: str, shown_hash: str, answered: Answered) -> str:
    """What the page says of an approval of a held catalog, in the words `cellblock approve SERVER` uses."""
    if answered.done:
        return f"approved the catalog of '{visible(server)}' (sha256 {visible(shown_hash[:12])}…)"
    if answered.refusals:
        return "; ".join(visible(f"gateway {why}") for why in answered.refusals)
    return "no running gateway" if not answered.gateways else f"no running gateway serves '{visible(server)}'"


def answer_text(message: dict[str, Any], answered: Answered) -> str:
    """What the page says of an answer, in the words `cellblock approve|deny` uses."""
    ident = visible(str(message.get("id")))
    if answered.done:
        scope = SCOPE_TEXT.get(str(message.get("scope")), "")
        return f"approved '{ident}' {scope}" if message["op"] == "approve" else f"denied '{ident}'"
    if answered.refusals:
        return "; ".join(visible(f"gateway {why}") for why in answered.refusals)
    if not answered.gateways:
        return "no running gateway"
    return f"no pending approval '{ident}' (answered, expired, or its gateway stopped)"


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
