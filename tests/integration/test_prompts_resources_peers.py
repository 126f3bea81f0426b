"""Prompt and resource policy on a real server: npm server-everything behind `cellblock serve`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from mcp.shared.exceptions import MCPError

from tests import peers
from tests.integration.conftest import gateway, write_config

pytestmark = [pytest.mark.anyio, pytest.mark.peers]


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


def everything(**policy: Any) -> dict[str, Any]:
    argv = peers.everything()
    jail = {"read_only": [str(peers.NODE_MODULES)]}
    return {"command": argv[0], "args": argv[1:], "timeout": 30, "jail": jail, "tools": {"default": "deny"}, **policy}


async def test_server_everythings_prompts_and_resources_pass_only_the_rules_that_allow_them(tmp_path: Path) -> None:
    # the control first: rules that allow them, and what the server offers
    allowed = everything(prompts={"default": "allow"}, resources={"default": "allow"})
    async with gateway(write_config(tmp_path, {"e": allowed}), tmp_path / "open") as client:
        resources = (await client.list_resources()).resources
        prompts = [p for p in (await client.list_prompts()).prompts if not any(a.required for a in p.arguments or [])]
        assert resources and prompts, "server-everything offers resources and a prompt without required arguments"
        uri, prompt = str(resources[0].uri), prompts[0].name
        assert (await client.read_resource(uri)).contents
        assert (await client.get_prompt(prompt)).messages
    # the same server under tools: {default: deny} alone: nothing listed, nothing got or read
    (tmp_path / "deny").mkdir()
    async with gateway(write_config(tmp_path / "deny", {"e": everything()}), tmp_path / "denied") as client:
        assert not (await client.list_resources()).resources and not (await client.list_prompts()).prompts
        for attempt in (client.read_resource(uri), client.get_prompt(prompt)):
            with pytest.raises(MCPError, match=r"^denied by policy: default: (prompt|resource) '"):
                await attempt
