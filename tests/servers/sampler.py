"""Sampler: a server that asks the client's model twice in one call, one request after the other.

Run as ``python tests/servers/sampler.py [--era legacy|modern]``; it is the raw server (raw.py)
with one tool instead of its own, ``twice`` (``message``), which answers ``sampled: A, B``: the
text of each completion in the order asked (an error or a result without text counts as
``none``). Handshake era: one ``sampling/createMessage`` request after the other; 2026-07-28:
an ``input_required`` round each.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # raw.py beside it, also inside a jail

from raw import Raw, main, text, write


def _request(message: str, n: int) -> dict[str, Any]:
    content = {"type": "text", "text": f"{message} #{n + 1}"}
    return {"messages": [{"role": "user", "content": content}], "maxTokens": 10}


def _said(result: Any) -> str:
    content = result.get("content") if isinstance(result, dict) else None
    return str(content.get("text") or "none") if isinstance(content, dict) else "none"


class Sampler(Raw):
    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.calls: dict[str, dict[str, Any]] = {}  # a call's id -> its message and the completions so far

    def tools(self) -> list[dict[str, Any]]:
        schema = {"type": "object", "properties": {"message": {"type": "string"}}}
        return [{"name": "twice", "inputSchema": schema}]

    def handle(self, message: dict[str, Any]) -> None:
        if "method" in message:
            return super().handle(message)
        ident = str(message.get("id"))  # our request's: "s<n>:<the call's id as JSON>"
        n, _, call = ident[1:].partition(":")
        waiting = self.calls.get(call)
        if not ident.startswith("s") or waiting is None:
            return None
        waiting["said"].append(_said(message.get("result")))
        if int(n) == 0:
            write(
                {
                    "jsonrpc": "2.0",
                    "id": f"s1:{call}",
                    "method": "sampling/createMessage",
                    "params": _request(waiting["message"], 1),
                }
            )
        else:
            del self.calls[call]
            write({"jsonrpc": "2.0", "id": waiting["id"], "result": text("sampled: " + ", ".join(waiting["said"]))})
        return None

    def call(self, ident: Any, params: dict[str, Any]) -> dict[str, Any] | None:
        message = str((params.get("arguments") or {}).get("message", "hi"))
        if self.era == "modern":
            said: list[str] = json.loads(params.get("requestState") or "[]")
            responses = params.get("inputResponses") or {}
            if "s" in responses:
                said.append(_said(responses["s"]))
            if len(said) == 2:
                return text("sampled: " + ", ".join(said))
            return {
                "resultType": "input_required",
                "inputRequests": {"s": {"method": "sampling/createMessage", "params": _request(message, len(said))}},
                "requestState": json.dumps(said),
            }
        call = json.dumps(ident)
        self.calls[call] = {"id": ident, "message": message, "said": []}
        write(
            {"jsonrpc": "2.0", "id": f"s0:{call}", "method": "sampling/createMessage", "params": _request(message, 0)}
        )
        return None


if __name__ == "__main__":
    main(Sampler)
