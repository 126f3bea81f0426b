"""`cellblock approve ID`, `deny`, `pending` and `revoke`: the approvals of calls, asked of the running gateways."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from cellblock.gateway.ask.forms import share_answers
from cellblock.gateway.cli.gateways import ask_all
from cellblock.gateway.cli.options import EXIT_FINDING, EXIT_OK, EXIT_USAGE, optional_config
from cellblock.gateway.serve.control import ControlError, request
from cellblock.gateway.serve.running import SCOPE_TEXT, answer_pending, duration, pid_of, running, time_left
from cellblock.gateway.terminal import printable
from cellblock.policy.text import visible

__all__ = ["approve", "deny", "pending", "pending_full", "revoke"]

_TOOL_WIDTH = 80  # a tool name is the server's: bounded in the table, whole in `pending --full`


def approve(config_path: str | None, target: str, scope: str | None, shown_hash: str | None = None) -> int:
    """Allow the pending call `target`, or accept the held catalog of the server `target` (only if
    its hash is `shown_hash`, when given)."""
    # approving a pending call needs no config, only a gateway
    config = optional_config(config_path, say=False)
    servers = set(config.servers) if config is not None else set()
    if target in servers:
        if scope is not None:
            print(
                f"cellblock: --{scope} applies to a pending call's ID; '{target}' is a server, "
                f"whose held catalog is approved as a whole: run 'cellblock approve {target}'",
                file=sys.stderr,
            )
            return EXIT_USAGE
        from cellblock.gateway.cli.lock import approve_command

        return approve_command(config_path, target, shown_hash)
    if shown_hash is not None:
        print(f"cellblock: --hash applies to a server's held catalog; '{printable(target)}' is none", file=sys.stderr)
        return EXIT_USAGE
    scope = scope or "once"
    return _answer_pending(
        {"op": "approve", "id": target, "scope": scope}, f"approved '{printable(target)}' {SCOPE_TEXT[scope]}"
    )


def deny(ident: str) -> int:
    return _answer_pending({"op": "deny", "id": ident}, f"denied '{printable(ident)}'")


def _answer_pending(message: dict[str, Any], done: str) -> int:
    """Send an approve/deny to each gateway until one holds the id."""
    answered = answer_pending(message)
    if not answered.gateways:
        print("cellblock: no running gateway", file=sys.stderr)
    for why in answered.unreachable:
        print(f"cellblock: {why}", file=sys.stderr)
    if answered.done:
        print(f"cellblock: OK: {done}", file=sys.stderr)
        return EXIT_OK
    for refusal in answered.refusals:
        print(f"cellblock: gateway {printable(refusal)}", file=sys.stderr)
    if not answered.refusals:
        print(f"cellblock: no pending approval '{printable(message['id'])}' (see 'cellblock pending')", file=sys.stderr)
    return EXIT_FINDING


def pending(as_json: bool) -> int:
    replies = ask_all({"op": "pending"})
    items = [item for _, reply in replies if reply["ok"] for item in reply.get("pending", []) if isinstance(item, dict)]
    for path, reply in replies:
        if not reply["ok"]:
            print(f"cellblock: gateway {pid_of(path)}: {printable(str(reply.get('error')))}", file=sys.stderr)
    if as_json:
        print(json.dumps(items, indent=1))
    elif items:
        now = time.time()
        print("id\tserver\ttool\tage\tleft\targuments")
        for item in items:
            # while the call waits, its time is what counts; after, what is left to let its retry through
            left = time_left(item, now)
            fields = [printable(str(item.get(key, "?"))) for key in ("id", "server")]
            created = item.get("created")
            age = duration(now - created if isinstance(created, int | float) else 0)
            # the gateway escaped what the model and the server sent; escaping again costs nothing
            arguments = ", ".join(visible(str(line)) for line in item.get("arguments", []))
            tool = printable(str(item.get("tool", "?")))
            kind = str(item.get("kind", "tool"))
            if kind in ("prompt", "resource"):  # a get or a read: "prompt greet", never "prompt:greet"
                tool = f"{kind} {tool.removeprefix(kind + ':')}"
            elif kind == "egress":  # a connection of a `network: ask` server: "connect to host:port"
                tool = f"connect to {tool}"
            elif kind == "share":  # a path to share with the server: "share read_write:/home/u/notes"
                tool = f"share {tool}"
            tool = tool if len(tool) <= _TOOL_WIDTH else f"{tool[:_TOOL_WIDTH]}…"
            print("\t".join([*fields, tool, age, left, arguments]))
        for item in items:
            if item.get("asks"):  # a share: its path, and what approving it does (never the call's approval)
                ident = printable(str(item.get("id")))
                print(f"cellblock: {ident}: {visible(str(item['asks']))}: {share_answers(ident)}", file=sys.stderr)
            if item.get("cut"):
                ident = printable(str(item.get("id")))
                print(
                    f"cellblock: {ident}: {item['cut']} argument(s) cut above; "
                    f"read every one in full with 'cellblock pending --full {ident}'",
                    file=sys.stderr,
                )
        print(
            "cellblock: allow with 'cellblock approve ID' (--session, --always); refuse with 'cellblock deny ID'",
            file=sys.stderr,
        )
    if not items:
        if not replies:
            print("cellblock: no running gateway", file=sys.stderr)
        print("cellblock: no pending approvals", file=sys.stderr)
    return EXIT_OK


def pending_full(ident: str, as_json: bool) -> int:
    """One pending call with every argument in full, escaped; exit 1 if no gateway holds it."""
    replies = ask_all({"op": "pending", "full": ident})
    items = [item for _, reply in replies if reply["ok"] for item in reply.get("pending", []) if isinstance(item, dict)]
    if not items:
        print(f"cellblock: no pending approval '{printable(ident)}' (see 'cellblock pending')", file=sys.stderr)
        return EXIT_FINDING
    item = items[0]
    if as_json:
        print(json.dumps(item, indent=1))
        return EXIT_OK
    print(visible(str(item.get("identity", ""))))
    lines = [visible(str(line)) for line in item.get("arguments", [])]
    print(f"arguments ({len(lines)}), in full, as escaped JSON; only values Cellblock knows are secrets are hidden:")
    print("\n".join(f"  {line}" for line in lines) or "  (no arguments)")
    if item.get("asks"):
        print(f"cellblock: {visible(str(item['asks']))}: {share_answers(printable(ident))}", file=sys.stderr)
        return EXIT_OK
    print(
        f"cellblock: allow this call with 'cellblock approve {printable(ident)}'; --session or --always allow "
        f"the whole tool with any arguments; refuse with 'cellblock deny {printable(ident)}'",
        file=sys.stderr,
    )
    return EXIT_OK


def revoke(config_path: str | None, target: str, kind: str = "tool") -> int:
    """Forget the "always" approval of `target` (SERVER or SERVER:TOOL) in approvals.json, and tell
    each running gateway to drop its session approvals of the same; exit 1 if there was none, or
    a running gateway could not be told."""
    from cellblock.gateway.config.loading import load_config
    from cellblock.gateway.serve.approvals import Approvals, describe
    from cellblock.gateway.state import StateWriteError, state_dir

    config, _ = load_config(config_path)
    server, _, tool = target.partition(":")
    state = state_dir()
    try:
        stored = Approvals(state, config.audit_log(state), config.approvals.timeout).revoke(server, tool or None, kind)
    except StateWriteError as exc:
        print(f"cellblock: FAIL: nothing was revoked: {exc}", file=sys.stderr)
        return EXIT_FINDING
    gone = [f"{printable(describe(k, t, server))} (always)" for k, t in stored]
    if kind == "tool":
        gone += [
            f"tool {printable(name)} of '{printable(server)}' (runs without asking)"
            for name in _unasked(state, server, tool)
        ]
    # what a running gateway holds for this session is in its memory: each is told, over its socket
    missed = []
    try:
        paths = running()
    except ControlError as exc:
        paths, missed = [], [f"the running gateways could not be found ({exc})"]
    for path in paths:
        try:
            reply = request(path, {"op": "revoke", "server": server, "tool": tool or None, "kind": kind})
        except ControlError as exc:
            reply = {"ok": False, "error": str(exc)}
        if not reply["ok"]:
            missed.append(f"gateway {pid_of(path)} was not told ({printable(str(reply.get('error', 'refused')))})")
            continue
        for item in reply.get("revoked", []) if isinstance(reply.get("revoked"), list) else []:
            if isinstance(item, dict):
                what = describe(str(item.get("kind")), str(item.get("tool")), server)
                scope = "for this session" if item.get("scope") == "session" else "a retry after a late approval"
                gone.append(f"{printable(what)} ({scope}, in gateway {pid_of(path)})")
    if gone:
        print(f"cellblock: OK: revoked {', '.join(gone)}", file=sys.stderr)
    else:
        what = f"{kind} {target}" if tool and kind != "tool" else target
        print(f"cellblock: no 'always' or session approval for {printable(what)}", file=sys.stderr)
        item, sep, name = tool.partition(":")
        if kind == "tool" and sep and item in ("prompt", "resource"):  # the spelling before kinds were kept apart
            hint = f"{server}:{name} --kind {item}"
            print(f"cellblock: for the {item}, run 'cellblock revoke {printable(hint)}'", file=sys.stderr)
    for why in missed:
        # its "always" approvals went with the file, which every gateway reads again before its next question
        print(
            f"cellblock: FAIL: {why}: what it allowed for this session of {printable(target)} stays allowed "
            "until it restarts; run this again, or restart the client that runs it",
            file=sys.stderr,
        )
    return EXIT_OK if gone and not missed else EXIT_FINDING


def _unasked(state: Path, server: str, tool: str) -> list[str]:
    """Take back the grants to run `server`'s tools (or `tool`) without asking; the names revoked."""
    from cellblock.gateway.serve.locking import revoke_unasked
    from cellblock.policy.lock import LockError

    try:
        return revoke_unasked(state, server, tool or None)
    except LockError as exc:
        print(f"cellblock: FAIL: {exc}", file=sys.stderr)
        return []
