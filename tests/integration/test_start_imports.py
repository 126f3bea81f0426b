"""What a start of `cellblock serve` imports: a gateway with only local servers loads no remote-server code.

The gateway runs in a fresh interpreter that writes its `sys.modules` to a file at exit, after a
real session: the handshake and one call to a local server.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.conftest import PROBE, write_config
from tests.integration.raw import open_session, raw_gateway

pytestmark = pytest.mark.anyio

# `cellblock serve` as `python -m` runs it, its modules written to argv[1] when it exits
SERVE = (
    "import atexit, sys\n"
    "from cellblock.gateway.cli.main import main\n"
    "atexit.register(lambda: open(sys.argv[1], 'w').write('\\n'.join(sorted(sys.modules))))\n"
    "sys.exit(main(sys.argv[2:]))\n"
)
# Cellblock's remote-server code and the SDK's OAuth client (with their submodules): imported when
# a remote server needs them
REMOTE_ONLY = (
    "cellblock.gateway.downstream.remote",
    "cellblock.gateway.downstream.oauth",
    "cellblock.gateway.downstream.callback",
    "cellblock.gateway.downstream.discovery",
    "mcp.client.auth",
)
# The HTTP server and client stack
HTTP = ("httpx2", "httpcore2", "h11", "starlette", "uvicorn", "sse_starlette", "python_multipart")


def under(modules: set[str], packages: tuple[str, ...]) -> set[str]:
    return {m for m in modules if any(m == p or m.startswith(f"{p}.") for p in packages)}


def modules_of_import_mcp() -> set[str]:
    found = subprocess.run(
        [sys.executable, "-c", "import sys, mcp; print('\\n'.join(sys.modules))"],
        capture_output=True,
        text=True,
        check=True,
    )
    return set(found.stdout.split())


async def modules_of_a_serve(config: Path, state: Path) -> set[str]:
    out = state.parent / "modules.txt"
    async with raw_gateway(config, state, python=("-c", SERVE, str(out))) as raw:
        await open_session(raw, "legacy")
        answer = await raw.request("tools/call", {"name": "probe__echo", "arguments": {"message": "hi"}})
        assert answer["result"]["content"][0]["text"] == "hi", answer
    # leaving closed the gateway's stdin and waited for it: it wrote the file as it exited
    return set(out.read_text().split())


async def test_a_start_with_only_local_servers_imports_no_remote_server_code(tmp_path: Path) -> None:
    probe = {"command": sys.executable, "args": [str(PROBE)], "jail": False}
    config = write_config(tmp_path, {"probe": probe})
    loaded = await modules_of_a_serve(config, tmp_path / "state")
    assert "cellblock.gateway.downstream.supervisor" in loaded  # the control: the servers' code ran
    assert not under(loaded, REMOTE_ONLY)
    # what of the HTTP stack is loaded, the SDK's package loads by itself (see the GAP below)
    assert not under(loaded, HTTP) - under(modules_of_import_mcp(), HTTP)


def test_importing_the_sdk_loads_its_http_stack() -> None:
    """GAP: `import mcp` alone loads the HTTP server and client stack, whatever the gateway defers.

    Every `import mcp.<module>` runs the SDK's `mcp/__init__.py` first, which imports
    `mcp.client.client`; that imports `mcp.client.streamable_http` (httpx2) and `mcp.server`,
    whose `lowlevel/server.py` imports starlette and `streamable_http_manager` (sse-starlette,
    uvicorn) at module level. So a gateway with only local servers carries them (about 20 MB of
    its RSS, docs/performance.md). The test pins that so a change in the SDK shows up here: then
    the test above can say the HTTP stack is not loaded at all.
    """
    loaded = {m.split(".")[0] for m in under(modules_of_import_mcp(), HTTP)}
    assert {"httpx2", "starlette", "uvicorn", "sse_starlette"} <= loaded
