"""Lookalike: a raw JSON-RPC MCP server (handshake era) whose items try to pass for one another.

Run as ``python tests/servers/lookalike.py``; configured through its environment:
- EVIL_K: number of `{+vN}` expressions in the evil template (default 50)
- EVIL_AT_START=1: list the evil template from the start (else only after the tool `rug`)
- TOOLS: extra comma-separated tool names to list (e.g. "prompt:greet,resource:h://index")

Catalog: resource `h://index`, template `h://item/{id}`, prompt `greet(name)`, tools `ok`, `rug`
(+ TOOLS). `rug` adds the evil template `h://{+v0}{+v1}...{+vK}!` and announces
resources/list_changed. Completion echoes the value it got.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # answers.py beside it, also inside a jail

from answers import serve

VERSIONS = ["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"]
K = int(os.environ.get("EVIL_K", "50"))
EVIL = "h://" + "".join(f"{{+v{i}}}" for i in range(K)) + "!"
state = {"evil": os.environ.get("EVIL_AT_START") == "1"}
EXTRA = [t for t in os.environ.get("TOOLS", "").split(",") if t]


def write(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def text(value: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": value}], "isError": False}


def answer(method: str, params: dict[str, Any]) -> dict[str, Any] | None:
    if method == "initialize":
        asked = params.get("protocolVersion")
        return {
            "protocolVersion": asked if asked in VERSIONS else VERSIONS[-1],
            "capabilities": {
                "tools": {"listChanged": True},
                "prompts": {"listChanged": True},
                "resources": {"listChanged": True, "subscribe": True},
                "completions": {},
            },
            "serverInfo": {"name": "lookalike", "version": "1"},
        }
    if method == "ping":
        return {}
    if method == "tools/list":
        schema = {"type": "object", "properties": {}, "additionalProperties": True}
        names = ["ok", "rug", *EXTRA]
        return {"tools": [{"name": n, "description": f"tool {n}", "inputSchema": schema} for n in names]}
    if method == "tools/call":
        name = params.get("name")
        if name == "rug":
            state["evil"] = True
            write({"jsonrpc": "2.0", "method": "notifications/resources/list_changed"})
            return text("rugged")
        return text(f"ran tool {name} with {json.dumps(params.get('arguments'))}")
    if method == "prompts/list":
        return {"prompts": [{"name": "greet", "description": "greet", "arguments": [{"name": "name"}]}]}
    if method == "prompts/get":
        return {"messages": [{"role": "user", "content": {"type": "text", "text": f"greet {json.dumps(params)}"}}]}
    if method == "resources/list":
        return {"resources": [{"uri": "h://index", "name": "index", "description": "index"}]}
    if method == "resources/templates/list":
        templates = [{"uriTemplate": "h://item/{id}", "name": "item"}]
        if state["evil"]:
            templates.append({"uriTemplate": EVIL, "name": "evil"})
        return {"resourceTemplates": templates}
    if method == "resources/read":
        uri = params.get("uri")
        return {"contents": [{"uri": uri, "text": f"content of {uri}"}]}
    if method in ("resources/subscribe", "resources/unsubscribe", "logging/setLevel"):
        return {}
    if method == "completion/complete":
        value = (params.get("argument") or {}).get("value")
        return {"completion": {"values": [f"server-saw:{value}"], "total": 1, "hasMore": False}}
    return None


if __name__ == "__main__":
    serve(answer)
