"""The one catalog the client sees: every server's items under exposed names, and the way back.

Built from each server's `Listing` whenever one changes, never on the per-call path. Lists are
sorted by exposed name so they come back in a stable order.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import mcp.types as types

from cellblock.gateway.downstream.listing import Listing
from cellblock.gateway.namespacing import UriTable, assign_names, voiced
from cellblock.gateway.serve.shaping import TASKS_VERSION, wire_result
from cellblock.policy.text import visible

__all__ = ["LIST_KINDS", "Catalog", "build_catalog"]

logger = logging.getLogger(__name__)
_reported: set[str] = set()
# list method -> the catalog's items that answer it
LIST_KINDS = {
    "tools/list": "tools",
    "prompts/list": "prompts",
    "resources/list": "resources",
    "resources/templates/list": "templates",
}
_METHODS = {kind: method for method, kind in LIST_KINDS.items()}
# kind -> its result model, and the model's field for the items
_RESULTS: dict[str, tuple[Any, str]] = {
    "tools": (types.ListToolsResult, "tools"),
    "prompts": (types.ListPromptsResult, "prompts"),
    "resources": (types.ListResourcesResult, "resources"),
    "templates": (types.ListResourceTemplatesResult, "resource_templates"),
}


@dataclass(frozen=True)
class Catalog:
    tools: tuple[types.Tool, ...] = ()
    prompts: tuple[types.Prompt, ...] = ()
    resources: tuple[types.Resource, ...] = ()
    templates: tuple[types.ResourceTemplate, ...] = ()
    # exposed name -> (server, original name)
    tool_routes: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    prompt_routes: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    # tools and prompts a server offers that the lock holds back, by the name they will get
    held: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    # how resource URIs are shown and routed back
    uris: UriTable = field(default_factory=UriTable)
    # each list as the SDK's server would write it, per protocol version: serialized once per
    # catalog (a rebuild makes a new one), so a list request is a copy, never a re-validation
    _wire: dict[tuple[str, str], str] = field(default_factory=dict, init=False, compare=False, repr=False)

    def wire(self, kind: str, version: str, stamp: dict[str, Any]) -> str:
        """The JSON text of the list result of `kind` (tools, prompts, resources, templates) at `version`."""
        text = self._wire.get((kind, version))
        if text is None:
            model, key = _RESULTS[kind]
            result = model(**{key: self.listed_tools(version) if kind == "tools" else list(getattr(self, kind))})
            dumped = result.model_dump(by_alias=True, mode="json", exclude_none=True)
            shaped = wire_result(_METHODS[kind], version, dumped, stamp)
            text = self._wire[(kind, version)] = json.dumps(shaped, separators=(",", ":"), ensure_ascii=False)
        return text

    def listed_tools(self, version: str) -> list[types.Tool]:
        """The tools as listed at `version`: at 2025-11-25, each that routes to a server says it
        may run as a task (`execution.taskSupport: optional`), which the gateway makes it
        (serve/handshake_tasks.py); the gateway's own tools run only as calls."""
        if version != TASKS_VERSION:
            return list(self.tools)
        optional = types.ToolExecution(task_support="optional")
        return [t.model_copy(update={"execution": optional}) if t.name in self.tool_routes else t for t in self.tools]

    def route_resource(self, uri: str) -> tuple[str, str]:
        """(server, original URI) for an exposed resource URI.

        Raises:
            ValueError: the URI is not one the gateway handed out.
        """
        return self.uris.route(uri)


def build_catalog(
    listings: Mapping[str, Listing],
    *,
    separator: str,
    max_length: int,
    offered: Mapping[str, Listing] | None = None,
    hidden: Callable[[str, str], bool] = lambda server, tool: False,
    hidden_item: Callable[[str, str, str], bool] = lambda kind, server, name: False,
    bare: frozenset[str] = frozenset(),
) -> Catalog:
    """Merge the servers' listings; name collisions are resolved deterministically and logged.

    `listings` is what may be shown (after the lock); `offered` is everything the servers offer,
    so names stay the same when a held item is approved. `hidden(server, tool)` keeps a tool out of
    the list (a policy `deny`) while it stays routable, so a call to it is refused by the policy;
    `hidden_item(kind, server, name)` does the same for a "prompt" (by name) and a "resource" (by
    the server's URI, or a template's text). The servers in `bare` have no prefix.
    """
    offered = offered if offered is not None else listings
    tool_names = assign_names(
        ((server, t.name) for server, lst in offered.items() for t in lst.tools),
        separator=separator,
        max_length=max_length,
        bare=bare,
    )
    prompt_names = assign_names(
        ((server, p.name) for server, lst in offered.items() for p in lst.prompts),
        separator=separator,
        max_length=max_length,
        bare=bare,
    )
    uris = UriTable.build(
        bare,
        ((server, str(r.uri)) for server, lst in offered.items() for r in lst.resources),
        ((server, t.uri_template) for server, lst in offered.items() for t in lst.templates),
    )
    for collision in (*tool_names.collisions, *prompt_names.collisions):
        if str(collision) not in _reported:  # the catalog is rebuilt often; say each once
            _reported.add(str(collision))
            logger.warning("name collision: %s", collision)

    tools = [
        # no `execution`: whether a call runs as a task is the gateway's to say (serve/tasks.py)
        t.model_copy(
            update={
                "name": tool_names.by_original[(server, t.name)],
                "meta": _app_meta(uris, server, t.meta),
                "execution": None,
                **_unvoiced("tool", server, t, t.name),
            }
        )
        for server, lst in listings.items()
        for t in lst.tools
    ]
    prompts = [
        p.model_copy(
            update={"name": prompt_names.by_original[(server, p.name)], **_unvoiced("prompt", server, p, p.name)}
        )
        for server, lst in listings.items()
        for p in lst.prompts
    ]
    resources = [
        r.model_copy(
            update={
                "uri": (exposed := uris.expose(server, str(r.uri))),
                **_unvoiced("resource", server, r, exposed),
            }
        )
        for server, lst in listings.items()
        for r in lst.resources
        if not hidden_item("resource", server, str(r.uri))
    ]
    templates = [
        t.model_copy(
            update={
                "uri_template": (exposed := uris.expose_template(server, t.uri_template)),
                **_unvoiced("template", server, t, exposed),
            }
        )
        for server, lst in listings.items()
        for t in lst.templates
        if not hidden_item("resource", server, t.uri_template)
    ]
    shown_tools, shown_prompts = _pairs(listings, "tools"), _pairs(listings, "prompts")
    tool_routes = {name: route for name, route in tool_names.by_exposed.items() if route in shown_tools}
    prompt_routes = {name: route for name, route in prompt_names.by_exposed.items() if route in shown_prompts}
    held = {n: r for n, r in tool_names.by_exposed.items() if n not in tool_routes}
    held |= {n: r for n, r in prompt_names.by_exposed.items() if n not in prompt_routes}
    listed = [t for t in tools if not hidden(*tool_routes[t.name])]
    prompts = [p for p in prompts if not hidden_item("prompt", *prompt_routes[p.name])]
    return Catalog(
        tools=tuple(sorted(_unique(listed, "name"), key=lambda t: t.name)),
        prompts=tuple(sorted(_unique(prompts, "name"), key=lambda p: p.name)),
        resources=tuple(sorted(_unique(resources, "uri"), key=lambda r: str(r.uri))),
        templates=tuple(sorted(_unique(templates, "uri_template"), key=lambda t: t.uri_template)),
        tool_routes=tool_routes,
        prompt_routes=prompt_routes,
        held=held,
        uris=uris,
    )


def _unvoiced(kind: str, server: str, item: Any, label: str) -> dict[str, Any]:
    """What an item is shown without, when it reads as Cellblock's (`namespacing.voiced`): a title
    is dropped, so the client shows the item's name (which says whose it is); a resource's or
    template's name becomes its exposed URI (`label`). Reported once, like a renamed name."""
    annotations = getattr(item, "annotations", None)
    shown = {
        "title": item.title,
        "name": item.name,
        "annotations": {"title": getattr(annotations, "title", None)},
    }
    update: dict[str, Any] = {}
    for what in voiced(kind, shown):
        if what == "annotations.title" and annotations is not None:
            update["annotations"] = annotations.model_copy(update={"title": None})
        else:
            update[what] = label if what == "name" else None
        said = f"server '{server}': the {what} of {kind} {visible(repr(label))} reads as Cellblock's"
        if said not in _reported:  # the catalog is rebuilt often; say each once
            _reported.add(said)
            logger.warning("%s; it is shown without it", said)
    return update


def _app_meta(uris: UriTable, server: str, meta: dict[str, Any] | None) -> dict[str, Any] | None:
    """A tool's `_meta` with the app it renders routed through the gateway: `ui.resourceUri`, and
    the flat `ui/resourceUri` of the extension's first drafts, which hosts still read."""
    if not meta:
        return meta
    ui, flat = meta.get("ui"), meta.get("ui/resourceUri")
    if isinstance(ui, dict) and isinstance(ui.get("resourceUri"), str):
        meta = {**meta, "ui": {**ui, "resourceUri": uris.expose(server, ui["resourceUri"])}}
    if isinstance(flat, str):
        meta = {**meta, "ui/resourceUri": uris.expose(server, flat)}
    return meta


def _pairs(listings: Mapping[str, Listing], kind: str) -> set[tuple[str, str]]:
    return {(server, item.name) for server, lst in listings.items() for item in getattr(lst, kind)}


def _unique(items: list[Any], key: str) -> list[Any]:
    # a server that lists the same name twice gets it once: a client would reject the duplicate
    seen: dict[str, Any] = {}
    for item in items:
        seen.setdefault(str(getattr(item, key)), item)
    return list(seen.values())
