"""The fast path shapes its answers exactly as the SDK's server would, in both protocol eras.

Every call's result is exposed and scrubbed once, as JSON (`serve/calls.ToolCall`). A call the
SDK's handler answers hands it as a `CallToolResult` model to the SDK's `ServerRunner`, which
sieves it to the client's version and stamps it; the fast path does the same with `wire_result`.
Side by side, on the same downstream results, the two must agree byte for byte;
an SDK upgrade that changes the shape fails here instead of drifting.
"""

from __future__ import annotations

from typing import Any

import mcp.types as types
import pytest
from mcp.server.lowlevel import Server
from mcp.server.runner import ServerRunner
from mcp_types import SERVER_INFO_META_KEY

from cellblock.gateway.namespacing import UriTable
from cellblock.gateway.scrub import pattern_of, scrub_result
from cellblock.gateway.serve.shaping import exposed_result, wire_result

VERSIONS = ["2025-06-18", "2025-11-25", "2026-07-28"]
STAMP_OF_SERVER = {"name": "probe", "version": "0.1.0"}
SECRETS = pattern_of(("tok-5f1e9a2b77c4", "918273645546372819"))

RESULTS: dict[str, dict[str, Any]] = {
    "text": {"content": [{"type": "text", "text": "hi"}], "isError": False},
    "structured": {
        "content": [{"type": "text", "text": "{}"}],
        "structuredContent": {"message": "hi", "n": [1, 2]},
        "_meta": {SERVER_INFO_META_KEY: STAMP_OF_SERVER, "probe/x": 1},
        "resultType": "complete",
    },
    "links": {
        "content": [
            {"type": "resource_link", "uri": "file:///etc/hosts", "name": "hosts"},
            {"type": "resource", "resource": {"uri": "note://1", "text": "one", "mimeType": "text/plain"}},
            {"type": "image", "data": "aGk=", "mimeType": "image/png"},
        ]
    },
    "error": {"content": [{"type": "text", "text": "boom"}], "isError": True, "_meta": {SERVER_INFO_META_KEY: {}}},
    "unknown fields": {"content": [], "surprise": {"nested": True}, "isError": False},
    "secrets": {
        "content": [{"type": "text", "text": "authorization: Bearer tok-5f1e9a2b77c4"}],
        "structuredContent": {"key": 918273645546372819, "tok-5f1e9a2b77c4": 1},
        "_meta": {"probe/echo": "tok-5f1e9a2b77c4"},
    },
}


def sdk_answer(version: str, result: dict[str, Any]) -> dict[str, Any]:
    """What the SDK's handler writes: the result exposed and scrubbed, as a model, through the SDK's server."""
    model = types.CallToolResult.model_validate(
        scrub_result(exposed_result(UriTable(), "probe", result), SECRETS), by_name=False
    )
    server: Server[Any] = Server("cellblock", version="0.1.0")
    runner = ServerRunner(server, connection=None, lifespan_state=None)  # type: ignore[arg-type]  # reason: _serialize reads only the server
    return runner._serialize("tools/call", version, model)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("name", list(RESULTS))
def test_the_fast_path_answers_what_the_sdk_path_answers(version: str, name: str) -> None:
    stamp = Server("cellblock", version="0.1.0").server_info_stamp
    fast = wire_result(
        "tools/call", version, scrub_result(exposed_result(UriTable(), "probe", RESULTS[name]), SECRETS), stamp
    )
    assert fast == sdk_answer(version, RESULTS[name])
    assert "tok-5f1e9a2b77c4" not in str(fast) and "918273645546372819" not in str(fast)


def test_resource_uris_route_back_and_the_servers_stamp_is_replaced() -> None:
    shaped = exposed_result(UriTable(), "notes", RESULTS["links"])
    assert shaped["content"][0]["uri"] == "cellblock://notes/file:///etc/hosts"
    assert shaped["content"][1]["resource"]["uri"] == "cellblock://notes/note://1"
    modern = wire_result(
        "tools/call", "2026-07-28", exposed_result(UriTable(), "probe", RESULTS["structured"]), {"name": "cb"}
    )
    assert modern["_meta"] == {"probe/x": 1, SERVER_INFO_META_KEY: {"name": "cb"}}
    assert modern["resultType"] == "complete"
    legacy = wire_result(
        "tools/call", "2025-11-25", exposed_result(UriTable(), "probe", RESULTS["structured"]), {"name": "cb"}
    )
    assert legacy["_meta"] == {"probe/x": 1} and "resultType" not in legacy


@pytest.mark.parametrize("bad", [{"content": "not a list"}, {"content": [{"type": "text"}]}, {"isError": "yes"}])
def test_a_result_that_is_not_a_call_result_is_refused(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        wire_result("tools/call", "2025-11-25", exposed_result(UriTable(), "probe", bad), {})
