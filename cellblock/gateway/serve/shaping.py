"""Results as the SDK's server writes them, for the answers the gateway writes itself.

The fast path (`gateway/serve/fastpath.py`) and the serialized lists (`Catalog.wire`) skip the SDK's
server, so they shape their results here the way its `ServerRunner` does: sieved to the
version's schema, and in 2026-07-28 marked complete and stamped with the gateway's `serverInfo`.
`tests/gateway/serve/test_shaping.py` holds the two side by side, so an SDK upgrade that changes the
shape fails a test instead of drifting.
"""

from __future__ import annotations

from typing import Any

from mcp_types import SERVER_INFO_META_KEY
from mcp_types import methods as _methods
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from cellblock.gateway.namespacing import UriTable

__all__ = ["TASKS_VERSION", "exposed_result", "unstamped", "wire_result"]

# the handshake-era version with tasks (experimental): serve/handshake_tasks.py
TASKS_VERSION = "2025-11-25"

_LINKS = ("resource_link", "resource")


def wire_result(method: str, version: str, result: dict[str, Any], stamp: dict[str, Any]) -> dict[str, Any]:
    """`result` as the SDK's server writes it at `version`: sieved to that version's schema and,
    in 2026-07-28, marked complete and stamped with the gateway's `serverInfo`.

    Raises:
        ValueError: `result` does not validate as the method's result (pydantic's ValidationError).
    """
    modern = version in MODERN_PROTOCOL_VERSIONS
    if modern and "resultType" not in result:
        # required in 2026-07-28; a handshake-era server's result is complete by definition
        result = {**result, "resultType": "complete"}
    dumped = _methods.serialize_server_result(method, version, result)
    if modern:
        meta = dumped.get("_meta")
        if not isinstance(meta, dict) or meta.get(SERVER_INFO_META_KEY) is None:
            dumped["_meta"] = {**(meta if isinstance(meta, dict) else {}), SERVER_INFO_META_KEY: stamp}
    return dumped


def exposed_result(uris: UriTable, server: str, result: dict[str, Any]) -> dict[str, Any]:
    """A downstream call result as the client may see it: resource URIs routed back through the
    gateway (`uris`: the catalog's), and the server's own `serverInfo` stamp dropped (the gateway stamps its own).
    `isError` is made explicit, as the SDK's model of the result does on the other path."""
    out = {"isError": False, **result}
    meta = out.get("_meta")
    if isinstance(meta, dict) and SERVER_INFO_META_KEY in meta:
        kept = unstamped(meta)
        if kept:
            out["_meta"] = kept
        else:
            del out["_meta"]
    content = out.get("content")
    if isinstance(content, list) and any(isinstance(c, dict) and c.get("type") in _LINKS for c in content):
        out["content"] = [_exposed_item(uris, server, c) for c in content]
    return out


def unstamped(meta: dict[str, Any]) -> dict[str, Any] | None:
    """A downstream result's `_meta` without the server's own `serverInfo` stamp (None when nothing
    else is left): the gateway answers under its own, which the SDK stamps in 2026-07-28 only where none is."""
    kept = {k: v for k, v in meta.items() if k != SERVER_INFO_META_KEY}
    return kept or None


def _exposed_item(uris: UriTable, server: str, item: Any) -> Any:
    if not isinstance(item, dict):
        return item
    if item.get("type") == "resource_link" and isinstance(item.get("uri"), str):
        return {**item, "uri": uris.expose(server, item["uri"])}
    inner = item.get("resource")
    if item.get("type") == "resource" and isinstance(inner, dict) and isinstance(inner.get("uri"), str):
        return {**item, "resource": {**inner, "uri": uris.expose(server, inner["uri"])}}
    return item
