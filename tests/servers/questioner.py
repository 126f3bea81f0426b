"""Questioner: a hostile server that floods one call with questions for the user or the client's model.

Run as ``python tests/servers/questioner.py [--era legacy|modern]``; it is the raw server (raw.py)
with one tool instead of its own, ``flood`` (``count``, ``what``: ``sampling`` or
``elicitation``, ``marker``), which asks ``count`` times in the one call and answers ``asked N:
A answered, R refused`` (a refusal is an error answer; a declined form counts as answered).

- Handshake era: one ``sampling/createMessage`` (or ``elicitation/create``) request after the
  other, each sent once the one before is answered or refused, whatever the answer.
- 2026-07-28: one ``input_required`` round holding all ``count`` requests.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # raw.py beside it, also inside a jail

from raw import Raw, main, text, write


def _request(what: str, n: int) -> tuple[str, dict[str, Any]]:
    """The method and params of question `n`."""
    if what == "elicitation":
        schema = {"type": "object", "properties": {}}
        return "elicitation/create", {"mode": "form", "message": f"question #{n + 1}?", "requestedSchema": schema}
    content = {"type": "text", "text": f"request #{n + 1}"}
    return "sampling/createMessage", {"messages": [{"role": "user", "content": content}], "maxTokens": 10}


class Questioner(Raw):
    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.calls: dict[str, dict[str, Any]] = {}  # a call's id (as JSON) -> what it asked so far

    def tools(self) -> list[dict[str, Any]]:
        schema = {
            "type": "object",
            "properties": {"count": {"type": "integer"}, "what": {"type": "string"}, "marker": {"type": "string"}},
        }
        return [{"name": "flood", "inputSchema": schema}]

    def handle(self, message: dict[str, Any]) -> None:
        if "method" in message:
            return super().handle(message)
        ident = str(message.get("id"))  # our request's: "q<n>:<the call's id as JSON>"
        n, _, call = ident[1:].partition(":")
        waiting = self.calls.get(call)
        if not ident.startswith("q") or waiting is None:
            return None
        waiting["refused" if "error" in message else "answered"] += 1
        if int(n) + 1 < waiting["count"]:
            self._ask(call, int(n) + 1)
        else:
            del self.calls[call]
            write({"jsonrpc": "2.0", "id": waiting["id"], "result": text(_told(waiting))})
        return None

    def _ask(self, call: str, n: int) -> None:
        method, params = _request(self.calls[call]["what"], n)
        write({"jsonrpc": "2.0", "id": f"q{n}:{call}", "method": method, "params": params})

    def call(self, ident: Any, params: dict[str, Any]) -> dict[str, Any] | None:
        arguments = params.get("arguments") or {}
        count, what = int(arguments.get("count", 1)), str(arguments.get("what", "sampling"))
        if self.era == "modern":
            responses = params.get("inputResponses")
            if responses is not None:
                return text(_told({"count": count, "answered": len(responses), "refused": count - len(responses)}))
            requests = {}
            for n in range(count):
                method, asked = _request(what, n)
                requests[f"q{n}"] = {"method": method, "params": asked}
            return {"resultType": "input_required", "inputRequests": requests, "requestState": "flood"}
        call = json.dumps(ident)
        self.calls[call] = {"id": ident, "count": count, "what": what, "answered": 0, "refused": 0}
        self._ask(call, 0)
        return None


def _told(done: dict[str, Any]) -> str:
    return f"asked {done['count']}: {done['answered']} answered, {done['refused']} refused"


if __name__ == "__main__":
    main(Questioner)
