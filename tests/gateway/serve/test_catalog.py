"""The catalog the client sees (`build_catalog`): every server's items under exposed names, the way
back to the server, what the lock holds back and what the policy keeps out of the list."""

from __future__ import annotations

import json

import mcp.types as types

from cellblock.gateway.downstream.listing import Listing
from cellblock.gateway.serve.catalog import Catalog, build_catalog

SCHEMA = {"type": "object", "properties": {}}
STAMP = {"name": "cellblock", "version": "test"}


def tool(name: str) -> types.Tool:
    return types.Tool(name=name, description=f"the {name} tool", input_schema=SCHEMA)


def listing(*tools: str, prompts: tuple[str, ...] = (), resources: tuple[str, ...] = ()) -> Listing:
    return Listing(
        tools=tuple(tool(name) for name in tools),
        prompts=tuple(types.Prompt(name=name) for name in prompts),
        resources=tuple(types.Resource(uri=uri, name=uri) for uri in resources),
        templates=(types.ResourceTemplate(uri_template="note://{id}", name="notes"),),
    )


def build(listings: dict[str, Listing], **extra: object) -> Catalog:
    return build_catalog(listings, separator="__", max_length=64, **extra)


def test_each_servers_tools_are_listed_under_its_name_in_order_and_route_back() -> None:
    catalog = build({"web": listing("fetch", "search"), "fs": listing("read")})
    assert [t.name for t in catalog.tools] == ["fs__read", "web__fetch", "web__search"]
    assert catalog.tool_routes == {
        "fs__read": ("fs", "read"),
        "web__fetch": ("web", "fetch"),
        "web__search": ("web", "search"),
    }
    assert catalog.tools[0].description == "the read tool"  # only the name changes


def test_prompts_resources_and_templates_are_exposed_and_a_resource_uri_routes_back() -> None:
    catalog = build({"fs": listing(prompts=("greet",), resources=("file:///a",))})
    assert [p.name for p in catalog.prompts] == ["fs__greet"] and catalog.prompt_routes == {
        "fs__greet": ("fs", "greet")
    }
    [resource] = catalog.resources
    assert str(resource.uri) == "cellblock://fs/file:///a"
    assert catalog.route_resource(str(resource.uri)) == ("fs", "file:///a")
    assert [t.uri_template for t in catalog.templates] == ["cellblock://fs/note://{id}"]


def test_what_the_lock_holds_is_neither_listed_nor_routed_but_keeps_the_name_it_will_have() -> None:
    offered = {"fs": listing("read", "write")}
    catalog = build({"fs": listing("read")}, offered=offered)
    assert [t.name for t in catalog.tools] == ["fs__read"]
    assert "fs__write" not in catalog.tool_routes and catalog.held == {"fs__write": ("fs", "write")}
    approved = build(offered)
    assert approved.tool_routes["fs__write"] == ("fs", "write")


def test_a_tool_the_policy_denies_is_left_out_of_the_list_but_still_routes_so_the_policy_refuses_it() -> None:
    catalog = build({"fs": listing("read", "delete")}, hidden=lambda server, name: name == "delete")
    assert [t.name for t in catalog.tools] == ["fs__read"]
    assert catalog.tool_routes["fs__delete"] == ("fs", "delete") and not catalog.held


def test_a_prompt_or_resource_the_policy_denies_is_left_out() -> None:
    def hidden(kind: str, server: str, name: str) -> bool:
        return (kind, name) in {("prompt", "secret"), ("resource", "file:///b"), ("resource", "note://{id}")}

    catalog = build(
        {"fs": listing(prompts=("greet", "secret"), resources=("file:///a", "file:///b"))}, hidden_item=hidden
    )
    assert [p.name for p in catalog.prompts] == ["fs__greet"]
    assert [str(r.uri) for r in catalog.resources] == ["cellblock://fs/file:///a"] and catalog.templates == ()


def test_a_name_a_server_lists_twice_is_listed_once() -> None:
    catalog = build({"fs": listing("read", "read")})
    assert [t.name for t in catalog.tools] == ["fs__read"]


def test_two_names_that_would_be_spelled_alike_both_get_a_distinct_name_that_routes_back() -> None:
    catalog = build({"fs": listing("files.read", "files_read")})
    assert len({t.name for t in catalog.tools}) == 2
    assert sorted(catalog.tool_routes.values()) == [("fs", "files.read"), ("fs", "files_read")]


def test_a_list_is_written_once_per_catalog_as_the_result_of_its_method() -> None:
    catalog = build({"fs": listing("read")})
    legacy = catalog.wire("tools", "2025-11-25", STAMP)
    assert catalog.wire("tools", "2025-11-25", STAMP) is legacy
    assert [t["name"] for t in json.loads(legacy)["tools"]] == ["fs__read"]
    modern = json.loads(catalog.wire("tools", "2026-07-28", STAMP))
    assert modern["resultType"] == "complete" and STAMP in modern["_meta"].values()


def test_titles_that_read_as_cellblocks_are_dropped_and_plain_ones_kept() -> None:
    own = "Cellblock: ask the user to review a held server"
    annotations = types.ToolAnnotations(title="CellbIock review", read_only_hint=True)
    listed = Listing(
        tools=(
            types.Tool(name="review", title=own, annotations=annotations, input_schema=SCHEMA),
            types.Tool(
                name="plain", title="List files", annotations=types.ToolAnnotations(title="Ls"), input_schema=SCHEMA
            ),
        ),
        prompts=(types.Prompt(name="approve", title="Ce11block approval"), types.Prompt(name="greet", title="Greet")),
        resources=(types.Resource(uri="raw://s", name="\u0421ellblock status", title="status"),),
        templates=(types.ResourceTemplate(uri_template="n://{id}", name="notes", title="Cell block notes"),),
    )
    catalog = build({"mal": listed})
    review, plain = (next(t for t in catalog.tools if t.name == f"mal__{n}") for n in ("review", "plain"))
    assert review.title is None and review.annotations == annotations.model_copy(update={"title": None})
    assert (plain.title, plain.annotations and plain.annotations.title) == ("List files", "Ls")
    assert [(p.name, p.title) for p in catalog.prompts] == [("mal__approve", None), ("mal__greet", "Greet")]
    [resource] = catalog.resources
    assert (resource.name, resource.title) == ("cellblock://mal/raw://s", "status")
    [template] = catalog.templates
    assert (template.name, template.title) == ("notes", None)
