"""`cellblock ps`, and asking the running gateways through their control sockets."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from cellblock.gateway.cli.options import EXIT_OK
from cellblock.gateway.serve.control import ControlError
from cellblock.gateway.serve.running import ask_each, network_text, pid_of, running
from cellblock.gateway.terminal import printable

__all__ = ["ask_all", "pid_of", "ps", "running"]


def ask_all(message: dict[str, Any]) -> list[tuple[Path, dict[str, Any]]]:
    """Each running gateway's reply to `message`; one that fails to answer is named on stderr."""
    replies = []
    for path, reply in ask_each(message):
        if isinstance(reply, ControlError):
            print(f"cellblock: {reply}", file=sys.stderr)
        else:
            replies.append((path, reply))
    return replies


def ps(as_json: bool) -> int:
    replies = ask_all({"op": "ps"})
    if as_json:
        listed = [{key: value for key, value in reply.items() if key != "ok"} for _, reply in replies if reply["ok"]]
        print(json.dumps(listed, indent=1))
    for path, reply in replies:
        if not reply["ok"]:
            print(f"cellblock: gateway {pid_of(path)}: {printable(str(reply.get('error')))}", file=sys.stderr)
        elif not as_json:
            pid, config = reply.get("pid", pid_of(path)), printable(str(reply.get("config", "?")))
            print(f"gateway {pid}\tconfig {config}\tpending {reply.get('pending', 0)}")
            for server in reply.get("servers", []):
                jail_text = printable(network_text(server))
                name, state = printable(str(server.get("name", "?"))), printable(str(server.get("state", "?")))
                calls = f"{server.get('calls', 0)} calls ({server.get('fast_calls', 0)} on the fast path)"
                print(f"  {name}\t{state}\t{jail_text}\t{server.get('tools', 0)} tools\t{calls}")
                if server.get("last_exit"):
                    print(f"    last stopped: {printable(str(server['last_exit']))}")
                if server.get("down"):
                    print(f"    not running: {printable(str(server['down']))}")
                for gap in server.get("not_enforced", []):
                    print(f"    not enforced: {printable(str(gap))}")
    if not replies:
        print("cellblock: no running gateway", file=sys.stderr)
    return EXIT_OK
