"""Tool search (`catalog.search`): the client lists a few tools, and finds the rest in words.

With search on for a client, its list holds `cellblock<sep>find_tools`, `cellblock<sep>call_tool`,
the pinned tools and the gateway's other own tools. `find_tools` answers a request in words with
the best matches among the tools the client may call, each with its exposed name, its full
schema and a line on why; `call_tool` calls one by its exposed name. A client known to list again
when told that the tools changed (search/clients.json) also gets the found tools added to its
list. `auto` turns search on for a client that takes fewer tools than the catalog has, or for
every client when the list is over the token budget (`Search.searching`).

Nothing here decides what may run. Only the catalog's tools are searched, and the catalog holds
no tool that the policy denies or the lock holds back. A call through `call_tool` enters the
gateway as a call of that tool, and passes the same route, lock, policy, approval and audit as a
listed tool (serve/callhandler.py). Each search is audited (`tool_search`).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import anyio.to_thread
import mcp.types as types
from mcp.server.context import ServerRequestContext
from mcp_types import CLIENT_INFO_META_KEY
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from cellblock.gateway.audit.log import Audit
from cellblock.gateway.config.base import ConfigError
from cellblock.gateway.config.catalog import CatalogConfig
from cellblock.gateway.search.clients import known
from cellblock.gateway.search.index import Entry, Index, MissingExtra, require
from cellblock.gateway.serve.catalog import Catalog
from cellblock.gateway.serve.status import CALL, FIND, NAMESPACE, tool_name

__all__ = ["MAX_ADDED", "MAX_CLIENTS", "Client", "Search", "client_of", "entry_of"]

MAX_QUERY = 1000  # a request in words; anything longer is not one
MAX_ADDED = 30  # found tools added to one client's list, the latest kept: the list is to stay short
# clients (HTTP sessions) whose found tools are kept, the latest to find kept: the gateway is not
# told when a session ends, and each kept one holds its list of names and its list's view
MAX_CLIENTS = 256


@dataclass(frozen=True)
class Client:
    """Who lists or searches: the name it gave (clientInfo), and its connection's key: "" for the
    stdio client, an HTTP session's id; None where its requests cannot be told from another
    client's (2026-07-28 over HTTP has no session), so nothing is kept for it."""

    name: str | None = None
    key: str | None = None


async def _untold(client: Client) -> None:
    """No client to tell (a Search without a gateway: the benchmark's, the tests')."""


def client_of(ctx: ServerRequestContext[Any, Any]) -> Client:
    params = ctx.session.client_params
    name = params.client_info.name if params is not None else None
    if name is None:  # 2026-07-28 may send its name without capabilities: then from the envelope
        meta = (ctx.params or {}).get("_meta")
        info = meta.get(CLIENT_INFO_META_KEY) if isinstance(meta, Mapping) else None
        named = info.get("name") if isinstance(info, Mapping) else None
        name = named if isinstance(named, str) else None
    headers = getattr(ctx.request, "headers", None)
    if headers is None:
        return Client(name, "")
    sid = headers.get("mcp-session-id")
    return Client(name, str(sid) if sid and ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS else None)


class Search:
    """The two tools of search, and the index of the catalog they search (built on first use)."""

    def __init__(
        self,
        config: CatalogConfig,
        separator: str,
        max_length: int,
        audit: Audit,
        tell: Callable[[Client], Awaitable[None]] = _untold,
    ) -> None:
        self.mode = config.search
        self.on = self.mode != "off"  # offered to some client, or to all
        self.config = config
        self.find_name = tool_name(separator, max_length, FIND)
        self.call_name = tool_name(separator, max_length, CALL)
        self.own_prefix = f"{NAMESPACE}{separator}"
        self.audit = audit
        self.tell = tell  # tells one client that its tool list changed
        self._full = Catalog()  # the whole catalog, as a client without search lists it
        self._offered = Catalog()  # what a client with search lists
        self._searched = Catalog()  # what it finds: the tools that route to a server
        self._index: Index | None = None
        self._tokens: int | None = None
        self._found: dict[str, list[str]] = {}  # by client key: the found tools added to its list
        # by client key: its list as its found tools last made it (one each: each finds anew)
        self._views: dict[str, tuple[tuple[str, ...], Catalog]] = {}
        if self.on:
            try:
                require()  # refused at start, not at the first search: the extra is missing
            except MissingExtra as exc:
                raise ConfigError(f"catalog.search: {exc}") from None

    def offer(self, catalog: Catalog) -> None:
        """Take the catalog as it now is: every tool still routes (`tool_routes`) and is searched;
        a client with search lists only the search tools, the pinned tools and the gateway's own."""
        self._full, self._tokens, self._views = catalog, None, {}
        if not self.on:
            return
        pinned = set(self.config.pinned)
        listed = [t for t in catalog.tools if t.name not in catalog.tool_routes or t.name in pinned]
        searched = tuple(t for t in catalog.tools if t.name in catalog.tool_routes)
        self._offered = dataclasses.replace(catalog, tools=(self._find_tool(), self._call_tool(), *listed))
        self._searched, self._index = dataclasses.replace(catalog, tools=searched), None

    def searching(self, client: Client) -> bool:
        """Whether `client` lists the search tools in place of the catalog's."""
        if self.mode != "auto":
            return self.on
        limit = known(client.name).tools
        return (limit is not None and len(self._full.tools) > limit) or self.tokens() > self.config.budget

    def tokens(self) -> int:
        """The whole tool list's tokens, as its JSON's characters / 4."""
        if self._tokens is None:
            dumped = [t.model_dump(by_alias=True, mode="json", exclude_none=True) for t in self._full.tools]
            self._tokens = len(json.dumps(dumped, separators=(",", ":"), ensure_ascii=False)) // 4
        return self._tokens

    def view(self, catalog: Catalog, client: Client) -> Catalog:
        """`catalog` as `client` lists it: whole, or with search, plus what its searches added."""
        if catalog is not self._full or not self.searching(client):
            return catalog
        added = tuple(self._found.get(client.key, ())) if client.key is not None else ()
        if not added:
            return self._offered
        cached = self._views.get(client.key or "")
        if cached is not None and cached[0] == added:
            return cached[1]
        listed = {t.name for t in self._offered.tools}
        searched = {t.name: t for t in self._searched.tools}
        # a tool held or denied since it was found is no longer in the searched catalog
        more = tuple(searched[name] for name in added if name in searched and name not in listed)
        view = dataclasses.replace(self._offered, tools=(*self._offered.tools, *more))
        self._views[client.key or ""] = (added, view)
        return view

    @property
    def added(self) -> bool:
        """Whether some client's list holds tools its searches added."""
        return any(self._found.values())

    def owns(self, name: str) -> bool:
        return self.on and name in (self.find_name, self.call_name)

    async def find(self, arguments: dict[str, Any] | None, client: Client, version: str) -> types.CallToolResult:
        """`find_tools`: the best matches for the request, best first, each whole as `version`
        lists it; a client whose list they join is told that it changed."""
        query, server = (arguments or {}).get("query"), (arguments or {}).get("server")
        if not isinstance(query, str) or not query.strip() or len(query) > MAX_QUERY:
            why = f"{self.find_name} takes 'query': what you want done, in words (at most {MAX_QUERY})"
            return _error(why)
        if server is not None and not isinstance(server, str):
            return _error(f"{self.find_name}'s 'server' is a server's name")
        catalog, index = self._searched, self._index
        if index is None:
            # built off the event loop: 2,000 tools take a few tenths of a second
            index = await anyio.to_thread.run_sync(Index, [entry_of(t, catalog) for t in catalog.tools])
            if self._searched is catalog:  # else the catalog changed meanwhile: the next search builds anew
                self._index = index
        matches = index.find(query, self.config.results, server)
        tools = {t.name: t for t in catalog.listed_tools(version)}
        found = [
            {**tools[m.name].model_dump(by_alias=True, mode="json", exclude_none=True), "why": m.why} for m in matches
        ]
        self.audit.note("tool_search", NAMESPACE, query=query, scope=server, found=[m.name for m in matches])
        added = self._add(client, [m.name for m in matches])
        how = f"call one with {self.call_name} {{'name': NAME, 'arguments': {{...}}}}"
        if added:
            how += ", or by its name: they are now in your list of tools"
            await self.tell(client)
        said = {"tools": found, "how": how if found else "nothing matched: ask in other words, or name the server"}
        text = json.dumps(said, ensure_ascii=False)
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)])

    def _add(self, client: Client, names: list[str]) -> bool:
        """Add what a search found to the list of a client known to list again when told to."""
        if client.key is None or not names or not known(client.name).list_changed or not self.searching(client):
            return False
        before = self._found.pop(client.key, [])  # put back last: the latest to find
        after = [name for name in before if name not in names] + names
        self._found[client.key] = after = after[-MAX_ADDED:]
        for gone in list(self._found)[:-MAX_CLIENTS]:  # the longest without a find: most likely ended
            del self._found[gone]
            self._views.pop(gone, None)
        return set(after) != set(before)

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
        self.audit.note("call", NAMESPACE, tool=name, decision="deny", rule="route", reason=why, arguments=arguments)
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
