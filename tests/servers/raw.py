"""Raw: a hostile MCP server written without the SDK, so it can send what the SDK never would.

Run as ``python tests/servers/raw.py [--era legacy|modern] [--surrogates]``. It reads JSON-RPC lines
on stdin and writes them on stdout with `json.dumps` (ASCII escapes), so a Python string holding a
lone surrogate goes out as a valid `"\\ud800"` escape that no UTF-8 encoder can write back.

- ``--era legacy`` answers ``initialize`` only (``server/discover`` is an unknown method);
  ``--era modern`` answers ``server/discover`` too, and asks for input with an `input_required`
  round instead of an ``elicitation/create`` request.
- ``--no-handshake`` (with ``--era modern``) refuses ``initialize`` ("no method"): a server that
  speaks 2026-07-28 only.
- ``--surrogates`` puts a lone surrogate in its instructions, a tool's name and description,
  its prompt's text and its resource's text.
- ``--meta-file PATH``: the ``ok`` tool's ``_meta`` is the JSON object in that file, read at start.
- ``--exit-when PATH``: exits (status 3) once PATH exists, unless it existed at start: the test
  decides when it restarts, and the restarted one stays.

Tools (all answer with text):

- ``say``: a result whose text holds a lone surrogate.
- ``log`` / ``progress``: a log message or a progress message (to the call's progress token)
  holding one, then a plain result.
- ``ask``: asks the client a question whose message holds one; answers with the reply's action.
- ``flood`` (``count``, ``kind``): that many log notifications (or ``tools/list_changed`` ones, with
  ``kind`` "list_changed"), then a result.
- ``listed``: how many ``tools/list`` requests it has answered.
- ``nan``: a result for this call holding ``NaN``, which is not JSON.
- ``garbage`` (``count``): that many lines that are not JSON, then a result.
- ``invalid`` (``count``): a result of that many content items of a type MCP does not have.
- ``huge`` (``size``, ``newline``, ``done_file``): a result line of ``size`` bytes for this call;
  without ``newline`` the line never ends and nothing more is written. ``done_file`` is created
  once the pipe has taken it all.
- ``ok``: "ok".
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

LONE = "\ud800"
VERSIONS = ["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"]
MODERN = "2026-07-28"


def write(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def text(value: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": value}], "isError": False}


class Raw:
    def __init__(self, era: str, surrogates: bool, meta: dict[str, Any] | None = None) -> None:
        self.era = era
        self.meta = meta
        self.mark = LONE if surrogates else ""
        self.asked: dict[str, Any] = {}  # our question's id -> the call waiting for its answer
        self.serial = 0
        self.listed = 0
        self.handshake = True  # answers `initialize` (--no-handshake: it does not)

    def tools(self) -> list[dict[str, Any]]:
        names = ["say", "log", "progress", "ask", "flood", "huge", "listed", "nan", "garbage", "invalid", "ok"]
        schema = {"type": "object", "properties": {}, "additionalProperties": True}
        tools = [{"name": name, "description": f"raw {name}", "inputSchema": schema} for name in names]
        if self.meta is not None:
            tools[names.index("ok")]["_meta"] = self.meta
        if self.mark:
            tools.append({"name": f"odd{self.mark}", "description": f"odd {self.mark}", "inputSchema": schema})
        return tools

    def capabilities(self) -> dict[str, Any]:
        return {"tools": {"listChanged": True}, "prompts": {}, "resources": {}, "logging": {}}

    def handle(self, message: dict[str, Any]) -> None:
        method, ident, params = message.get("method"), message.get("id"), message.get("params") or {}
        if method is None:
            waiting = self.asked.pop(str(ident), None)
            if waiting is not None:
                action = (message.get("result") or {}).get("action", "none")
                write({"jsonrpc": "2.0", "id": waiting, "result": text(f"answer: {action}")})
            return
        if ident is None:
            return  # notifications: initialized, cancelled
        result = self.answer(method, ident, params)
        if result is not None:
            if self.era == "modern":  # required on the 2026-07-28 wire
                result.setdefault("resultType", "complete")
                if method.endswith("/list"):
                    result.update(ttlMs=0, cacheScope="private")
            write({"jsonrpc": "2.0", "id": ident, "result": result})

    def answer(self, method: str, ident: Any, params: dict[str, Any]) -> dict[str, Any] | None:
        info = {"name": "raw", "version": "1"}
        instructions = f"raw server {self.mark}"
        if method == "initialize" and self.handshake:
            asked = params.get("protocolVersion")
            version = asked if asked in VERSIONS else VERSIONS[-1]
            return {
                "protocolVersion": version,
                "capabilities": self.capabilities(),
                "serverInfo": info,
                "instructions": instructions,
            }
        if method == "server/discover" and self.era == "modern":
            return {
                "supportedVersions": [MODERN],
                "capabilities": self.capabilities(),
                "instructions": instructions,
                "resultType": "complete",
                "_meta": {"io.modelcontextprotocol/serverInfo": info},
            }
        if method == "ping":
            return {}
        if method == "tools/list":
            self.listed += 1
            return {"tools": self.tools()}
        if method == "prompts/list":
            return {"prompts": [{"name": "greet", "description": "greet"}]}
        if method == "prompts/get":
            message = {"role": "user", "content": {"type": "text", "text": f"hello {self.mark}"}}
            return {"messages": [message]}
        if method == "resources/list":
            return {"resources": [{"uri": "raw://note", "name": "note", "mimeType": "text/plain"}]}
        if method == "resources/templates/list":
            return {"resourceTemplates": []}
        if method == "resources/read":
            return {"contents": [{"uri": params.get("uri"), "mimeType": "text/plain", "text": f"note {self.mark}"}]}
        if method == "logging/setLevel":
            return {}
        if method == "tools/call":
            return self.call(ident, params)
        write({"jsonrpc": "2.0", "id": ident, "error": {"code": -32601, "message": f"no method {method}"}})
        return None

    def call(self, ident: Any, params: dict[str, Any]) -> dict[str, Any] | None:
        name, arguments = params.get("name"), params.get("arguments") or {}
        if name == "say":
            return text(f"said {LONE}")
        if name == "log":
            log = {"level": "warning", "logger": "raw", "data": f"logged {LONE}"}
            write({"jsonrpc": "2.0", "method": "notifications/message", "params": log})
            return text("logged")
        if name == "progress":
            token = (params.get("_meta") or {}).get("progressToken")
            if token is not None:
                report = {"progressToken": token, "progress": 1, "total": 2, "message": f"half {LONE}"}
                write({"jsonrpc": "2.0", "method": "notifications/progress", "params": report})
            return text("progressed")
        if name == "ask":
            return self.ask(ident, params)
        if name == "listed":
            return text(str(self.listed))
        if name == "nan":
            head = json.dumps({"jsonrpc": "2.0", "id": ident})[:-1]
            sys.stdout.write(head + ',"result":{"content":[{"type":"text","text":"x"}],"score":NaN}}\n')
            return None
        if name == "invalid":
            return {"content": [{"type": "bogus"}] * int(arguments.get("count", 1)), "isError": False}
        if name == "garbage":
            sys.stdout.write("x\n" * int(arguments.get("count", 10)))
            return text("wrote garbage")
        if name == "flood":
            notice = {"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info", "data": "x"}}
            if arguments.get("kind") == "list_changed":
                notice = {"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}
            line = json.dumps(notice)
            sys.stdout.write((line + "\n") * int(arguments.get("count", 1000)))
            return text("flooded")
        if name == "huge":
            head = json.dumps({"jsonrpc": "2.0", "id": ident})[:-1] + ',"result":{"content":[{"type":"text","text":"'
            size = int(arguments.get("size", 1 << 20))
            chunk = "x" * (1 << 20)
            sys.stdout.write(head)
            for _ in range(size // len(chunk)):
                sys.stdout.write(chunk)
            sys.stdout.write("x" * (size % len(chunk)))
            if arguments.get("newline", True):
                sys.stdout.write('"}]}}\n')
            sys.stdout.flush()
            if arguments.get("done_file"):  # the reader has taken (nearly) all of it
                Path(arguments["done_file"]).touch()
            return None
        return text("ok")

    def ask(
        self,
        ident: Any,
        params: dict[str, Any],
        question: dict[str, Any] | None = None,
        method: str = "elicitation/create",
    ) -> dict[str, Any] | None:
        """Ask the client `question` (elicitation params, a form with a lone surrogate by default;
        or the params of `method`, such as sampling/createMessage)."""
        question = question or {"message": f"allow {LONE}?", "requestedSchema": {"type": "object", "properties": {}}}
        if self.era == "modern":
            answers = params.get("inputResponses")
            if answers:
                return text(f"answer: {answers.get('q', {}).get('action', 'none')}")
            asked = {"mode": "form", **question} if method == "elicitation/create" else question
            return {
                "resultType": "input_required",
                "inputRequests": {"q": {"method": method, "params": asked}},
                "requestState": "raw-state",
            }
        self.serial += 1
        mine = f"raw-{self.serial}"
        self.asked[mine] = ident
        write({"jsonrpc": "2.0", "id": mine, "method": method, "params": question})
        return None


def exit_when(path: str) -> None:
    while not os.path.exists(path):  # the test's signal is a file: nothing else crosses the jail
        time.sleep(0.05)
    os._exit(3)


def main(kind: type[Raw] = Raw) -> None:
    """Serve stdio as `kind` (a subclass adds tools of its own)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--era", choices=["legacy", "modern"], default="legacy")
    parser.add_argument("--surrogates", action="store_true")
    parser.add_argument("--no-handshake", action="store_true")
    parser.add_argument("--meta-file")
    parser.add_argument("--exit-when")
    args = parser.parse_args()
    if args.exit_when and not os.path.exists(args.exit_when):
        threading.Thread(target=exit_when, args=(args.exit_when,), daemon=True).start()
    raw = kind(args.era, args.surrogates, json.loads(Path(args.meta_file).read_text()) if args.meta_file else None)
    raw.handshake = not args.no_handshake
    for line in sys.stdin:
        try:
            message = json.loads(line)
        except ValueError:
            continue
        if isinstance(message, dict):
            raw.handle(message)
        sys.stdout.flush()


if __name__ == "__main__":
    main()
