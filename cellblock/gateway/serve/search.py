"""Tool search (`catalog.search: on`): the client lists a few tools, and finds the rest in words.

With search on, the catalog's list holds `cellblock<sep>find_tools`, `cellblock<sep>call_tool`,
the pinned tools and the gateway's other own tools. `find_tools` answers a request in words with
the best matches among the tools the client may call, each with its exposed name, its full
schema and a line on why; `call_tool` calls one by its exposed name.

Nothing here decides what may run. Only the catalog's tools are searched, and the catalog holds
no tool that the policy denies or the lock holds back. A call through `call_tool` enters the
gateway as a call of that tool, and passes the same route, lock, policy, approval and audit as a
listed tool (serve/gateway.py). Each search is audited (`tool_search`).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import anyio.to_thread
import mcp.types as types

from cellblock.gateway.audit.log import Audit
from cellblock.gateway.config.base import ConfigError
from cellblock.gateway.config.catalog import CatalogConfig
from cellblock.gateway.search.index import Entry, Index, MissingExtra
from cellblock.gateway.serve.catalog import Catalog
from cellblock.gateway.serve.status import CALL, FIND, NAMESPACE, tool_name

__all__ = ["Search", "entry_of"]

MAX_QUERY = 1000  # a request in words; anything longer is not one


class Search:
    """The two tools of search, and the index of the catalog they search (built on first use)."""

    def __init__(self, config: CatalogConfig, separator: str, max_length: int, audit: Audit) -> None:
        self.on = config.search == "on"
        self.config = config
        self.find_name = tool_name(separator, max_length, FIND)
        self.call_name = tool_name(separator, max_length, CALL)
        self.own_prefix = f"{NAMESPACE}{separator}"
        self.audit = audit
        self._catalog: Catalog | None = None
        self._index: Index | None = None
        if self.on:
            try:
                Index(())  # refused at start, not at the first search: the extra is missing
            except MissingExtra as exc:
                raise ConfigError(f"catalog.search: {exc}") from None

    def offer(self, catalog: Catalog) -> Catalog:
        """`catalog` as the client lists it: with search on, only the search tools, the pinned
        tools and the gateway's own; every tool still routes (`tool_routes`) and is searched."""
        if not self.on:
            return catalog
        pinned = set(self.config.pinned)
        listed = [t for t in catalog.tools if t.name not in catalog.tool_routes or t.name in pinned]
        searched = tuple(t for t in catalog.tools if t.name in catalog.tool_routes)
        offered = dataclasses.replace(catalog, tools=(self._find_tool(), self._call_tool(), *listed))
        self._catalog, self._index = dataclasses.replace(catalog, tools=searched), None
        return offered

    def owns(self, name: str) -> bool:
        return self.on and name in (self.find_name, self.call_name)

    async def find(self, arguments: dict[str, Any] | None) -> types.CallToolResult:
        """`find_tools`: the best matches for the request, best first, each whole."""
        query, server = (arguments or {}).get("query"), (arguments or {}).get("server")
        if not isinstance(query, str) or not query.strip() or len(query) > MAX_QUERY:
            return _error(f"{self.find_name} takes 'query': what you want done, in words (at most {MAX_QUERY})")
        if server is not None and not isinstance(server, str):
            return _error(f"{self.find_name}'s 'server' is a server's name")
        catalog, index = self._catalog or Catalog(), self._index
        if index is None:
            # built off the event loop: 2,000 tools take a tenth of a second
            index = await anyio.to_thread.run_sync(Index, [entry_of(t, catalog) for t in catalog.tools])
            if self._catalog is catalog:  # else the catalog changed meanwhile: the next search builds anew
                self._index = index
        matches = index.find(query, self.config.results, server)
        tools = {t.name: t for t in catalog.tools}
        found = [
            {**tools[m.name].model_dump(by_alias=True, mode="json", exclude_none=True), "why": m.why} for m in matches
        ]
        self.audit.write("tool_search", NAMESPACE, query=query, scope=server, found=[m.name for m in matches])
        said = {
            "tools": found,
            "how": f"call one with {self.call_name} {{'name': NAME, 'arguments': {{...}}}}"
            if found
            else "nothing matched: ask in other words, or name the server",
        }
        return types.CallToolResult(content=[types.TextContent(type="text", text=json.dumps(said, ensure_ascii=False))])

    def inner(self, params: types.CallToolRequestParams) -> types.CallToolRequestParams | types.CallToolResult:
        """`call_tool`'s call, as the call of the tool it names (which then passes every stage of
        a listed tool's call); or the refusal of a call of the gateway's own tools through it."""
        arguments = params.arguments or {}
        name, inner = arguments.get("name"), arguments.get("arguments", {})
        if not isinstance(name, str) or not isinstance(inner, dict):
            why = f"{self.call_name} takes 'name' (a tool {self.find_name} found) and 'arguments' (an object)"
            return self._refused(name if isinstance(name, str) else self.call_name, arguments, why)
        if name.startswith(self.own_prefix):  # the gateway's own are called by their names: no call of a call
            why = f"'{name}' is Cellblock's own tool: call it by its name, not through {self.call_name}"
            return self._refused(name, arguments, why)
        # any other name goes on as a call of it: a tool that is denied, held or unknown is refused
        # there, and audited, exactly as its direct call is
        return params.model_copy(update={"name": name, "arguments": inner})

    def _refused(self, name: str, arguments: dict[str, Any], why: str) -> types.CallToolResult:
        """A call through `call_tool` refused before it is any tool's call: audited as a call that
        routes nowhere, as a direct call of an unknown name is."""
        self.audit.write("call", NAMESPACE, tool=name, decision="deny", rule="route", reason=why, arguments=arguments)
        return _error(f"refused: route: {why}")

    def _find_tool(self) -> types.Tool:
        return types.Tool(
            name=self.find_name,
            title="Cellblock: find the tools for a task",
            description=(
                "The tools of this workspace are found here rather than listed. Say what you want done in "
                "words (and, if you know it, the server); the answer holds the best-matching tools, best "
                f"first, each with its name and input schema. Call one with {self.call_name}."
            ),
            input_schema={
                "type": "object",
                "properties": {
                    "query": {"type": "string", "description": "what you want done, in words"},
                    "server": {"type": "string", "description": "only this server's tools"},
                },
                "required": ["query"],
                "additionalProperties": False,
            },
            annotations=types.ToolAnnotations(read_only_hint=True, open_world_hint=False),
        )

    def _call_tool(self) -> types.Tool:
        return types.Tool(
            name=self.call_name,
            title="Cellblock: call a tool that was found",
            description=(
                f"Calls a tool {self.find_name} found, by its name, with its arguments. The call is "
                "checked and approved exactly as if the tool had been listed."
            ),
            input_schema={
                "type": "object",
                "properties": {
                    "name": {"type": "string", "description": f"the tool's name, as {self.find_name} gave it"},
                    "arguments": {"type": "object", "description": "the tool's arguments, as its schema asks"},
                },
                "required": ["name"],
                "additionalProperties": False,
            },
        )


def entry_of(tool: types.Tool, catalog: Catalog) -> Entry:
    schema = tool.input_schema if isinstance(tool.input_schema, dict) else {}
    properties = schema.get("properties")
    hints = tool.annotations
    words = [
        word
        for flag, word in (
            (hints and hints.read_only_hint, "read only"),
            (hints and hints.destructive_hint, "destructive delete"),
        )
        if flag
    ]
    return Entry(
        name=tool.name,
        server=catalog.tool_routes[tool.name][0],
        title=tool.title or (hints.title if hints and hints.title else "") or "",
        description=tool.description or "",
        parameters=tuple(properties) if isinstance(properties, dict) else (),
        hints=tuple(words),
    )


def _error(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=True)
