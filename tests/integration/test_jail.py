"""The jail seen through the gateway: what happens when it cannot be built, and what gets out of it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mcp.types as types
import pytest

from tests.integration.conftest import gateway, probe_server, write_config

pytestmark = [pytest.mark.anyio, pytest.mark.jail]


def text(result: types.CallToolResult) -> str:
    return " ".join(c.text for c in result.content if isinstance(c, types.TextContent))


async def test_without_bwrap_a_jailed_server_does_not_start_and_says_what_to_install(tmp_path: Path) -> None:
    unjailed: dict[str, Any] = probe_server("--name", "plain") | {"jail": False}
    config = write_config(tmp_path, {"boxed": probe_server("--name", "boxed"), "plain": unjailed})
    # a PATH without bwrap on it, as on a machine where bubblewrap is not installed
    async with gateway(config, tmp_path / "state", env={"PATH": str(tmp_path)}) as client:
        names = [t.name for t in (await client.list_tools()).tools]
        assert "plain__echo" in names and not any(n.startswith("boxed__") for n in names)
        refused = await client.call_tool("boxed__echo", {"message": "hi"})
        assert refused.is_error
        assert "'boxed'" in text(refused) and "apt-get install bubblewrap" in text(refused)
        # never a silent fallback: the explicit jail: false server is the only one that runs
        assert text(await client.call_tool("plain__echo", {"message": "hi"})) == "hi"
