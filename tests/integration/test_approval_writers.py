"""approvals.json with several writers at once: gateways answering "always", and `cellblock revoke`.

Before, each writer changed the copy it had read earlier and wrote it back whole: two gateways
granting "always" at once kept about two thirds of the grants, and a revoke beside a gateway that
was writing was undone now and then. Now every change is made under one lock, from the file as it
is under it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import mcp.types as types
import pytest

from tests.integration.conftest import cli, gateway, probe_server, write_config

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

ASK = {"default": "ask"}
TOOLS = 60  # "always" grants each gateway writes at once
VICTIMS = 12  # revokes run beside a gateway that writes: trials of the race


async def always(ctx: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
    return types.ElicitResult(action="accept", content={"decision": "allow_always"})


def config(directory: Path, server: str) -> Path:
    directory.mkdir(exist_ok=True)
    servers = {server: probe_server("--name", server, "--extra-tools", str(TOOLS), tools=ASK)}
    return write_config(directory, servers, approvals={"timeout": 60})


async def grant_each(client: Any, server: str) -> None:
    """Call every extra tool of `server` at once; each is asked, and answered "always"."""

    async def call(i: int) -> None:
        result = await client.call_tool(f"{server}__t{i}", {})
        assert not result.is_error, result

    async with anyio.create_task_group() as tg:
        for i in range(TOOLS):
            tg.start_soon(call, i)


def stored(state: Path) -> dict[str, list[str]]:
    data: dict[str, list[str]] = json.loads((state / "approvals.json").read_text())["always"]
    return data


async def test_two_gateways_granting_always_at_once_keep_every_grant(tmp_path: Path) -> None:
    state = tmp_path / "state"
    first, second = config(tmp_path / "a", "a"), config(tmp_path / "b", "b")
    async with (
        gateway(first, state, mode="legacy", elicitation_callback=always) as a,
        gateway(second, state, mode="legacy", elicitation_callback=always) as b,
        anyio.create_task_group() as tg,
    ):
        tg.start_soon(grant_each, a, "a")
        tg.start_soon(grant_each, b, "b")
    kept = stored(state)
    assert {server: len(names) for server, names in kept.items()} == {"a": TOOLS, "b": TOOLS}


async def test_a_revoke_beside_a_gateway_that_is_writing_stays_revoked(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    victims = [f"v{i}" for i in range(VICTIMS)]
    (state / "approvals.json").write_text(json.dumps({"version": 2, "always": {"p": victims}}))
    path = config(tmp_path / "p", "p")
    env = {"CELLBLOCK_STATE_DIR": str(state), "XDG_RUNTIME_DIR": str(tmp_path / "run")}
    (tmp_path / "run").mkdir(mode=0o700)
    said: list[Any] = []

    async def revoke(victim: str) -> None:
        said.append(await anyio.to_thread.run_sync(lambda: cli(env, "revoke", f"p:{victim}", "--config", str(path))))

    async with (
        gateway(path, state, mode="legacy", elicitation_callback=always, env=env) as client,
        anyio.create_task_group() as tg,
    ):
        tg.start_soon(grant_each, client, "p")
        for victim in victims:  # each revoke a trial: it says OK, and must stay done
            tg.start_soon(revoke, victim)
    assert all(done.returncode == 0 and "OK: revoked" in done.stderr for done in said), [d.stderr for d in said]
    kept = stored(state)["p"]
    assert not set(kept) & set(victims), sorted(set(kept) & set(victims))  # no revoke undone
    assert len(kept) == TOOLS  # and no grant lost to a revoke
