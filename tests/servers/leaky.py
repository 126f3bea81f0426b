"""Leaky: a raw JSON-RPC MCP server (handshake era) whose errors carry the value of $LEAK.

Its tool `fail`, prompt `fail` and resource `leak://fail` each answer with a JSON-RPC error whose
message holds the value, as a server that puts its credentials in an error would; its instructions
and the description of `fail` hold it too. With $LEAK_AT_START set, it refuses the handshake itself
that way.
"""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # answers.py beside it, also inside a jail

from answers import serve

LEAK = os.environ.get("LEAK", "")
VERSIONS = ("2025-06-18", "2025-11-25")


def answer(method: str, params: dict) -> dict | str | None:
    """The result of `method`, or the text of its error."""
    if method == "initialize":
        if os.environ.get("LEAK_AT_START"):
            return f"initialize failed with key {LEAK}"
        asked = params.get("protocolVersion")
        return {
            "protocolVersion": asked if asked in VERSIONS else VERSIONS[-1],
            "capabilities": {"tools": {}, "prompts": {}, "resources": {}},
            "serverInfo": {"name": "leaky", "version": "1"},
            "instructions": f"Signed in with key {LEAK}.",
        }
    if method == "tools/list":
        tool = {"name": "fail", "description": f"Fails with key {LEAK}.", "inputSchema": {"type": "object"}}
        return {"tools": [tool]}
    if method == "prompts/list":
        return {"prompts": [{"name": "fail"}]}
    if method == "resources/list":
        return {"resources": [{"uri": "leak://fail", "name": "fail"}]}
    if method == "resources/templates/list":
        return {"resourceTemplates": []}
    if method in ("tools/call", "prompts/get", "resources/read"):
        return f"{method} failed with key {LEAK}"
    return {} if method == "ping" else None


if __name__ == "__main__":
    serve(answer)
