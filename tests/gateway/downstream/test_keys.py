"""A server's credentials told to the audit log (`downstream/keys.py`): what the `secrets` stage
of the pipeline knows no call may carry to another server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml

from cellblock.gateway.audit.log import Audit
from cellblock.gateway.config.loading import parse_config
from cellblock.gateway.config.model import LocalServer
from cellblock.gateway.downstream.keys import ServerKeys

pytestmark = pytest.mark.anyio

TOKEN = "ghp_" + "Kw7" * 12


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class HeldKeyring:
    """A keyring whose first read never answers until it is cancelled, as a locked one can."""

    def __init__(self, values: dict[str, str]) -> None:
        self.values = values
        self.reads = 0
        self.reading = anyio.Event()

    async def aget(self, entry: str) -> str | None:
        self.reads += 1
        if self.reads == 1:
            self.reading.set()
            await anyio.sleep_forever()
        return self.values.get(entry)


def server(secrets: dict[str, str]) -> LocalServer:
    config = parse_config(yaml.safe_dump({"version": 1, "servers": {"gh": {"command": "gh-mcp", "secrets": secrets}}}))
    found = config.servers["gh"]
    assert isinstance(found, LocalServer)
    return found


async def test_a_reading_cancelled_part_way_is_done_again_by_the_next(tmp_path: Path) -> None:
    audit = Audit(tmp_path / "audit.jsonl")
    store: Any = HeldKeyring({"gh-token": TOKEN})
    keys = ServerKeys("gh", server({"GITHUB_TOKEN": "gh-token"}), audit, _store=store)
    async with anyio.create_task_group() as tg:
        tg.start_soon(keys.register)
        await store.reading.wait()
        tg.cancel_scope.cancel()  # the call that started the reading went away
    assert not audit.held.carried("fs", {"path": TOKEN})  # not read yet
    await keys.register()
    assert [str(h) for h in audit.held.carried("fs", {"path": TOKEN})] == [
        "the secret GITHUB_TOKEN (keyring entry 'gh-token') of server 'gh'"
    ]
    await keys.register()
    assert store.reads == 2  # once read whole, never again
