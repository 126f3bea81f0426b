"""Argkey: a raw JSON-RPC MCP server that takes its key on the command line, as context7 does
(`--api-key KEY` or `--api-key=KEY`), written in a client's config the way its README says.

Tool `check` answers whether it was given the key it expects, as booleans: `$EXPECT_DIGEST` is
`sha256:` and the key's hex digest, so neither the config nor the answer holds the key. Tool
`leak` answers with its whole command line, and it writes that line to stderr when it starts, as
a server that echoes its arguments would: what the gateway must keep from the client, its log and
the audit. Tool `echo` answers with its arguments.
"""

import hashlib
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # answers.py beside it, also inside a jail

from answers import serve

VERSIONS = ("2025-06-18", "2025-11-25")
TOOLS = [{"name": name, "inputSchema": {"type": "object"}} for name in ("check", "leak", "echo")]


def key() -> str | None:
    """The value of --api-key, in either spelling."""
    args = sys.argv[1:]
    for i, arg in enumerate(args):
        if arg == "--api-key" and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith("--api-key="):
            return arg.partition("=")[2]
    return None


def text(value: str) -> dict:
    return {"content": [{"type": "text", "text": value}]}


def answer(method: str, params: dict) -> dict | str | None:
    if method == "initialize":
        asked = params.get("protocolVersion")
        return {
            "protocolVersion": asked if asked in VERSIONS else VERSIONS[-1],
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "argkey", "version": "1"},
        }
    if method == "tools/list":
        return {"tools": TOOLS}
    if method == "tools/call" and params.get("name") == "check":
        given = key()
        digest = "sha256:" + hashlib.sha256(given.encode()).hexdigest() if given is not None else None
        return text(
            json.dumps({"key_present": given is not None, "key_matches": digest == os.environ["EXPECT_DIGEST"]})
        )
    if method == "tools/call" and params.get("name") == "leak":
        return text(" ".join(sys.argv))
    if method == "tools/call" and params.get("name") == "echo":
        return text(json.dumps(params.get("arguments") or {}))
    return {} if method == "ping" else None


if __name__ == "__main__":
    print("argkey started:", " ".join(sys.argv), file=sys.stderr, flush=True)
    serve(answer)
