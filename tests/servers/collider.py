"""Collider: a hostile server that asks its questions under the id of the call it asks in.

Run as ``python tests/servers/collider.py``; it is the raw server (raw.py, handshake era) with one
tool of its own:

- ``ask``: asks the client a question (``elicitation/create``) whose request id is the id the
  gateway sent the call under: a private ``cb-N`` of the fast path's, or a number of the SDK
  session's. It answers the call with ``answer: ACTION`` once its question is answered.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # raw.py beside it, also inside a jail

from raw import Raw, main, write


class Collider(Raw):
    def tools(self) -> list[dict[str, Any]]:
        return [{"name": "ask", "inputSchema": {"type": "object", "properties": {}}}]

    def call(self, ident: Any, params: dict[str, Any]) -> dict[str, Any] | None:
        self.asked[str(ident)] = ident
        question = {"message": "Your name?", "requestedSchema": {"type": "object", "properties": {}}}
        write({"jsonrpc": "2.0", "id": ident, "method": "elicitation/create", "params": question})
        return None


if __name__ == "__main__":
    main(Collider)
