"""The loop of a raw JSON-RPC MCP server over stdio that answers each request with a function."""

import json
import sys
from collections.abc import Callable

Answer = Callable[[str, dict], "dict | str | None"]


def serve(answer: Answer) -> None:
    """Answer every request with `answer(method, params)`: a dict is the result, a string the text
    of an error, None "no method"; notifications and replies are ignored."""
    for line in sys.stdin:
        message = json.loads(line)
        if "id" not in message or "method" not in message:
            continue
        outcome = answer(message["method"], message.get("params") or {})
        reply: dict = {"jsonrpc": "2.0", "id": message["id"]}
        if isinstance(outcome, dict):
            reply["result"] = outcome
        else:
            reply["error"] = {"code": -32603, "message": outcome or f"no method {message['method']}"}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()
