"""Asker: a server that asks the user two things in one call, one after the other or both at once.

Run as ``python tests/servers/asker.py [--era legacy|modern]``; it is the raw server (raw.py) with
these tools instead of its own, each answering with ``answers: A, B``, the ``name`` the user gave
to each question in the order asked (an answer without one counts as its action):

- ``twice``: asks ``first?``, and once that is answered, ``second?``. Handshake era: one
  ``elicitation/create`` after the other; 2026-07-28: an ``input_required`` round each.
- ``both``: asks ``first?`` and ``second?`` at once. Handshake era: both requests before either
  answer; 2026-07-28: one round with both questions.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # raw.py beside it, also inside a jail

from raw import Raw, main, text, write

QUESTIONS = ("first?", "second?")


def _question(message: str) -> dict[str, Any]:
    return {"mode": "form", "message": message, "requestedSchema": {"type": "object", "properties": {}}}


def _named(answer: Any) -> str:
    answer = answer if isinstance(answer, dict) else {}
    content = answer.get("content") if isinstance(answer.get("content"), dict) else {}
    return str(content.get("name") or answer.get("action", "none"))


class Asker(Raw):
    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.calls: dict[Any, dict[str, Any]] = {}  # a call's id -> what it asked and was answered

    def tools(self) -> list[dict[str, Any]]:
        schema = {"type": "object", "properties": {}}
        return [{"name": name, "inputSchema": schema} for name in ("twice", "both")]

    def handle(self, message: dict[str, Any]) -> None:
        if "method" in message:
            return super().handle(message)
        ident = str(message.get("id"))  # our question's: "q<n>:<the call's id as JSON>"
        n, _, call = ident[1:].partition(":")
        waiting = self.calls.get(call)
        if not ident.startswith("q") or waiting is None:
            return None
        waiting["answers"][int(n)] = _named(message.get("result"))
        if waiting["twice"] and int(n) == 0:
            self._ask(call, 1)
        elif len(waiting["answers"]) == len(QUESTIONS):
            del self.calls[call]
            names = [waiting["answers"][i] for i in range(len(QUESTIONS))]
            write({"jsonrpc": "2.0", "id": waiting["id"], "result": text("answers: " + ", ".join(names))})
        return None

    def _ask(self, call: str, n: int) -> None:
        question = _question(QUESTIONS[n])
        write({"jsonrpc": "2.0", "id": f"q{n}:{call}", "method": "elicitation/create", "params": question})

    def call(self, ident: Any, params: dict[str, Any]) -> dict[str, Any] | None:
        name = params.get("name")
        if self.era == "modern":
            return self.rounds(name == "twice", params)
        call = json.dumps(ident)
        self.calls[call] = {"id": ident, "twice": name == "twice", "answers": {}}
        for n in (0,) if name == "twice" else range(len(QUESTIONS)):
            self._ask(call, n)
        return None

    def rounds(self, twice: bool, params: dict[str, Any]) -> dict[str, Any]:
        """2026-07-28: what was answered so far travels in the request state, as JSON."""
        answered: list[str] = json.loads(params.get("requestState") or "[]")
        responses = params.get("inputResponses") or {}
        answered += [_named(responses[q]) for q in QUESTIONS if q in responses]
        if len(answered) == len(QUESTIONS):
            return text("answers: " + ", ".join(answered))
        asked = QUESTIONS[len(answered) : len(answered) + 1] if twice else QUESTIONS
        requests = {q: {"method": "elicitation/create", "params": _question(q)} for q in asked}
        return {"resultType": "input_required", "inputRequests": requests, "requestState": json.dumps(answered)}


if __name__ == "__main__":
    main(Asker)
