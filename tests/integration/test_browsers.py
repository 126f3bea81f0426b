"""A server that drives a browser, as a user has it: Claude Desktop's `npx -y @playwright/mcp@…`,
`cellblock wrap`, the client started with only HOME, USER and PATH, and a call that renders a page
in Debian's Chromium inside the jail and answers with its text. The control is the entry as wrap
wrote it before it knew of browsers (no browser named, none of its files shared): the same call
cannot start a browser. And Chromium's own sandbox being off, the jail is what keeps a page from
the user's files: a `file://` URL of one shows nothing in the jail, and all of it unjailed.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
import mcp.types as types
import pytest
import yaml
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from cellblock.gateway.config.browsers import FONTS
from cellblock.sandbox.installer import REGISTRY_ENV
from cellblock.sandbox.landlock import landlock_abi
from tests import peers
from tests.integration.conftest import NO_USERNS, bus_at_the_standard_path, run_as_user
from tests.integration.test_from_wrap_to_calls import _text, allow_once, anyio_backend  # noqa: F401 (a fixture)

CHROMIUM = "/usr/bin/chromium"
pytestmark = [
    *(pytest.mark.anyio, pytest.mark.peers, pytest.mark.jail, pytest.mark.slow),
    pytest.mark.skipif(os.getuid() != 0, reason="placing a bus at /run/user/<uid> needs a mount namespace (root)"),
    pytest.mark.skipif(not os.access(CHROMIUM, os.X_OK), reason="Debian's chromium is not installed (.ci/run does)"),
]
# the title only a browser that ran the page's script can give (the URL does not hold it)
PAGE = "data:text/html,<script>document.title = ['Rendered', 'in', 'the', 'jail'].join(' ')</script>"
RENDERED = "Page Title: Rendered in the jail"


Navigate = Callable[[str], Awaitable[types.CallToolResult]]


async def _wrapped(
    home: Path, keyring_env: dict[str, str], *args: str, prefix: Sequence[str] = ()
) -> tuple[anyio.Path, dict[str, Any], Navigate]:
    """Claude Desktop's `npx -y @playwright/mcp@… ARGS` wrapped and approved: the config file, its
    contents, and a call of its browser_navigate from a client started with HOME, USER and PATH;
    every command under `prefix` (`NO_USERNS`: where `auto` chooses Landlock)."""
    client_config = home / ".config" / "Claude" / "claude_desktop_config.json"
    client_config.parent.mkdir(parents=True)
    servers = {"playwright": {"command": "npx", "args": ["-y", peers.PLAYWRIGHT_MCP, *args]}}
    client_config.write_text(json.dumps({"mcpServers": servers}, indent=2))

    npm = shutil.which("npm")
    assert npm is not None, "npm is needed: ./dev installs it"
    client = {"HOME": str(home), "USER": "root", "PATH": f"{os.path.dirname(npm)}:/usr/local/bin:/usr/bin:/bin"}
    shell = {**client, **keyring_env, **{k: os.environ[k] for k in REGISTRY_ENV if k in os.environ}}
    wrapped = run_as_user(shell, "wrap", str(client_config), prefix=prefix)
    assert wrapped.returncode == 0, wrapped.stderr
    entry = json.loads(client_config.read_text())["mcpServers"]["cellblock"]
    config_file = anyio.Path(entry["args"][entry["args"].index("--config") + 1])
    written = await config_file.read_text()
    assert f"drives a browser: it runs {CHROMIUM}, headless" in written  # wrap's note

    bus_dir = str(Path(keyring_env["DBUS_SESSION_BUS_ADDRESS"].removeprefix("unix:path=").split(",")[0]).parent)
    started = [*prefix, *bus_at_the_standard_path(bus_dir), entry["command"], *entry["args"]]
    # the client's folder: unjailed, Playwright writes .playwright-mcp/ there
    params = StdioServerParameters(command=started[0], args=started[1:], env=client, cwd=home)

    async def navigate(url: str) -> types.CallToolResult:
        async with Client(params, elicitation_callback=allow_once, cache=None) as session:
            with anyio.fail_after(120):
                return await session.call_tool("playwright__browser_navigate", {"url": url})

    async with Client(params, elicitation_callback=allow_once, cache=None) as session:
        await session.list_tools()  # first contact: the catalog is held for approval
    approved = run_as_user(client, "approve", "--all", prefix=prefix)
    assert approved.returncode == 0, approved.stderr
    return config_file, yaml.safe_load(written), navigate


@pytest.mark.parametrize("backend", ["bwrap", "landlock"])
async def test_a_wrapped_playwright_server_renders_a_page_in_the_system_chromium_inside_its_jail(
    tmp_path: Path, keyring_env: dict[str, str], backend: str
) -> None:
    if backend == "landlock" and landlock_abi() < 4:
        pytest.skip("needs Landlock ABI 4 (Linux 6.7) for the jail's network: none")
    prefix = NO_USERNS if backend == "landlock" else ()
    config_file, config, navigate = await _wrapped(tmp_path / "home", keyring_env, prefix=prefix)
    server = config["servers"]["playwright"]
    assert server["jail"]["read_only"] == ["/etc/chromium.d", FONTS]
    assert server["args"][-4:] == ["--headless", "--no-sandbox", "--executable-path", CHROMIUM]
    told = "cannot start its browser on this machine" in await config_file.read_text()
    if backend == "landlock":
        # where namespaces are refused, Chromium cannot run in its jail (it makes Unix sockets of
        # its own), and wrap's note says so and names the fix; the call fails in Chromium's words
        assert told
        refused = await navigate(PAGE)
        assert refused.is_error and "socket() failed" in _text(refused), _text(refused)
        return
    assert not told

    rendered = await navigate(PAGE)
    assert not rendered.is_error, _text(rendered)
    assert RENDERED in _text(rendered)

    # controls: Debian's chromium without /etc/chromium.d (its wrapper script cannot start), and
    # the entry as wrap wrote it before (Playwright looks for Chrome in /opt, which no jail shows)
    del server["jail"]["read_only"]
    await config_file.write_text(yaml.safe_dump(config, sort_keys=False))
    refused = await navigate(PAGE)
    assert refused.is_error and RENDERED not in _text(refused), _text(refused)
    server["args"] = server["args"][:-4]
    await config_file.write_text(yaml.safe_dump(config, sort_keys=False))
    refused = await navigate(PAGE)
    assert refused.is_error and RENDERED not in _text(refused), _text(refused)
    assert "'chrome' is not found at /opt/google/chrome/chrome" in _text(refused)


async def test_a_page_in_the_jailed_browser_cannot_read_the_users_files(
    tmp_path: Path, keyring_env: dict[str, str]
) -> None:
    home = tmp_path / "home"
    private = home / "private.html"
    private.parent.mkdir(parents=True)
    private.write_text("<title>hunter2 in the user's files</title>")
    # Playwright's own check of file:// URLs is off, so only the jail stands between page and file
    config_file, config, navigate = await _wrapped(home, keyring_env, "--allow-unrestricted-file-access")
    # by default the share stage asks before a call naming a file in the home runs (a form this
    # client answers as for a call, which shares nothing): the URL never reaches the server
    asked = _text(await navigate(private.as_uri()))
    assert "hunter2" not in asked and f"share: {private.as_uri()} (argument url) is not shared" in asked, asked
    # with the question off, the page reaches the browser, and only the jail stands in its way
    config["servers"]["playwright"]["jail"]["call_paths"] = "private"
    await config_file.write_text(yaml.safe_dump(config, sort_keys=False))

    jailed = _text(await navigate(private.as_uri()))
    assert "hunter2" not in jailed, jailed
    assert "ERR_FILE_NOT_FOUND" in jailed, jailed

    # control: the same server unjailed reads it
    config["servers"]["playwright"]["jail"] = False
    await config_file.write_text(yaml.safe_dump(config, sort_keys=False))
    assert "Page Title: hunter2 in the user's files" in _text(await navigate(private.as_uri()))
