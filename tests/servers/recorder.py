"""Recorder: a raw JSON-RPC MCP server (handshake era) that writes down every request it is sent.

Each request's method and params go, as one JSON line, to the file named by $RECORD (in a
directory its jail may write): what reached the server, judged on the host. It offers:

- the tool ``send``, which takes any arguments and answers "sent";
- the prompt ``say`` (argument ``text``), and resources under the template ``rec://{key}``.
"""

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # answers.py beside it, also inside a jail

from answers import serve

VERSIONS = ("2025-06-18", "2025-11-25")


def answer(method: str, params: dict) -> dict | str | None:
    with open(os.environ["RECORD"], "a") as record:
        record.write(json.dumps({"method": method, "params": params}) + "\n")
    if method == "initialize":
        asked = params.get("protocolVersion")
        return {
            "protocolVersion": asked if asked in VERSIONS else VERSIONS[-1],
            "capabilities": {"tools": {}, "prompts": {}, "resources": {}},
            "serverInfo": {"name": "recorder", "version": "1"},
        }
    if method == "tools/list":
        schema = {"type": "object", "additionalProperties": True}
        return {"tools": [{"name": "send", "description": "Sends what it is given.", "inputSchema": schema}]}
    if method == "tools/call":
        return {"content": [{"type": "text", "text": "sent"}], "isError": False}
    if method == "prompts/list":
        return {"prompts": [{"name": "say", "arguments": [{"name": "text", "required": True}]}]}
    if method == "prompts/get":
        text = (params.get("arguments") or {}).get("text", "")
        return {"messages": [{"role": "user", "content": {"type": "text", "text": f"said {len(text)}"}}]}
    if method == "resources/list":
        return {"resources": []}
    if method == "resources/templates/list":
        return {"resourceTemplates": [{"uriTemplate": "rec://{key}", "name": "records"}]}
    if method == "resources/read":
        return {"contents": [{"uri": params.get("uri"), "mimeType": "text/plain", "text": "read"}]}
    if method == "ping":
        return {}
    return None


if __name__ == "__main__":
    serve(answer)
