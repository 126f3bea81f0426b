"""What the client can answer is what the servers behind the gateway are offered.

server-everything (pinned, npm) lists a tool for each question a client can answer: one that asks
the user (elicitation), one that asks the client's model (sampling), one that asks for roots. Over
stdio the gateway offers a server elicitation and sampling only when its client declared them, so
a client that cannot answer a question lists no tool that asks it; roots always, as the gateway
answers them itself. The control is the same server behind the same gateway for a client that
declares both: it lists the tools, and they work. The gateway runs in memory (tests/harness.py),
on its wire as on stdio.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mcp.types as types
import pytest

from tests import peers
from tests.harness import build, connected
from tests.integration.conftest import write_config

pytestmark = [pytest.mark.anyio, pytest.mark.peers]

ASKS_USER = "everything__trigger-elicitation-request"
ASKS_MODEL = "everything__trigger-sampling-request"
ASKS_ROOTS = "everything__get-roots-list"


async def _elicit(ctx: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
    return types.ElicitResult(action="accept", content={"name": "Ada", "check": True, "integer": 7})


async def _sample(ctx: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
    return types.CreateMessageResult(
        role="assistant", content=types.TextContent(type="text", text="sampled answer"), model="test-model"
    )


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("offer")
    argv = peers.everything()
    config = write_config(
        tmp,
        {
            "everything": {
                "command": argv[0],
                "args": argv[1:],
                "timeout": 30,
                "sampling": "allow",  # the gateway lets it sample: whether it may is then the client's
                "jail": {"read_only": [str(peers.NODE_MODULES)]},
            }
        },
    )
    return config, tmp / "state"


def _offered(state: Path) -> list[list[str]]:
    """What the server was offered at each of its starts, as the audit log tells it."""
    lines = [json.loads(line) for line in (state / "audit.jsonl").read_text().splitlines()]
    return [e["offered"] for e in lines if e["event"] == "server_ready" and e["server"] == "everything"]


# what the client declares (by the callbacks it has) -> what its servers are offered
CLIENTS = {
    "none, as Claude Desktop": ({}, ["roots"]),
    "forms only": ({"elicitation_callback": _elicit}, ["roots", "elicitation"]),
    "forms and a model (the control)": (
        {"elicitation_callback": _elicit, "sampling_callback": _sample},
        ["roots", "elicitation", "sampling"],
    ),
}


@pytest.mark.parametrize("mode", ["legacy", "auto"])
@pytest.mark.parametrize(("callbacks", "offered"), CLIENTS.values(), ids=CLIENTS.keys())
async def test_a_server_lists_only_the_tools_whose_questions_the_client_answers(
    setup: tuple[Path, Path], mode: str, callbacks: dict[str, Any], offered: list[str], tmp_path: Path
) -> None:
    config, _ = setup
    state = tmp_path / "state"
    async with connected(build(config, state), mode=mode, **callbacks) as c:
        names = {t.name for t in (await c.list_tools()).tools}
        assert "everything__echo" in names
        assert (ASKS_USER in names) == ("elicitation" in offered)
        assert (ASKS_MODEL in names) == ("sampling" in offered)
        assert ASKS_ROOTS in names  # the gateway answers roots itself
        assert "the roots" in str((await c.call_tool(ASKS_ROOTS, {})).content).lower()
        if "elicitation" in offered:
            assert "Ada" in str((await c.call_tool(ASKS_USER, {})).content)
        if "sampling" in offered:
            sampled = await c.call_tool(ASKS_MODEL, {"prompt": "hello", "maxTokens": 5})
            assert "sampled answer" in str(sampled.content)
    assert _offered(state) == [offered]
