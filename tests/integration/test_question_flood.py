"""A server floods one call with questions (sampling requests, forms) through the real `cellblock
serve`, with a small audit log: the client sees at most `MAX_QUESTIONS` of them, the call's own
record stays in the kept log, and `audit --verify` says what the chain does not hold. The control
runs the same gateway with the cap and the budget for sampling taken out: the client is asked
every time, and the call's record is rotated out of every kept file."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import mcp.types as types
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from cellblock.gateway.audit.log import rotated_paths
from cellblock.gateway.downstream.questions import MAX_QUESTIONS
from tests.integration.conftest import ROOT, cli, write_config

pytestmark = [pytest.mark.anyio, pytest.mark.jail]

QUESTIONER = ROOT / "tests" / "servers" / "questioner.py"
FLOOD = 400  # questions in one call: over ten times the cap, and more than the control's log keeps
SMALL = {"max_bytes": "16KiB", "keep": 1}
SERVE = ["-m", "cellblock.gateway.cli.main"]
# The gateway as it was: no cap on questions, and sampling (with its approvals) written whatever
# the budget says, as decisions are.
UNGUARDED = [
    "-c",
    "import sys\n"
    "import cellblock.gateway.audit.log as log\n"
    "import cellblock.gateway.downstream.questions as questions\n"
    "from cellblock.gateway.cli.main import main\n"
    "questions.MAX_QUESTIONS = 10**9\n"
    "budgeted = log.kind_of\n"
    "log.kind_of = lambda e, f: None if e == 'sampling' or f.get('kind') == 'sampling' else budgeted(e, f)\n"
    "sys.exit(main(sys.argv[1:]))\n",
]


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


def questioner(era: str, sampling: str = "deny") -> dict[str, Any]:
    """The questioner test server as a handshake (`legacy`) or a 2026-07-28 (`modern`) server."""
    server = {
        "command": sys.executable,
        "args": [str(QUESTIONER), "--era", era],
        "jail": {"read_only": [str(QUESTIONER.parent)]},
        "sampling": sampling,
    }
    return server | {"protocol": "legacy"} if era == "legacy" else server


class ClientSide:
    """The upstream client: a user who allows every form, and a model that answers."""

    def __init__(self) -> None:
        self.forms: list[str] = []
        self.sampled = 0

    async def elicit(self, ctx: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        self.forms.append(params.message)
        return types.ElicitResult(action="accept", content={"decision": "allow_once"})

    async def sample(self, ctx: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
        self.sampled += 1
        return types.CreateMessageResult(
            role="assistant", content=types.TextContent(type="text", text="hi"), model="test-model"
        )


@asynccontextmanager
async def served(config: Path, state: Path, mode: str, side: ClientSide, python: list[str]) -> AsyncIterator[Client]:
    """`cellblock serve` on `config` as `python` runs it, its client `side` speaking in `mode`."""
    params = StdioServerParameters(
        command=sys.executable,
        args=[*python, "serve", "--config", str(config)],
        env={"CELLBLOCK_STATE_DIR": str(state)},
    )
    client = Client(
        params,
        mode=mode,
        cache=None,
        elicitation_callback=side.elicit,
        sampling_callback=side.sample,
        input_required_max_rounds=10 * FLOOD,  # a patient client: the gateway, not the client, stops the flood
    )
    async with client:
        yield client


def events(state: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for f in rotated_paths(state / "audit.jsonl") for line in f.read_text().splitlines()]


def text(result: types.CallToolResult) -> str:
    return " ".join(c.text for c in result.content if isinstance(c, types.TextContent))


def flood(what: str, server: str) -> dict[str, Any]:
    return {"count": FLOOD, "what": what, "marker": f"flood-of-{server}"}


def recorded(found: list[dict[str, Any]], server: str, what: str) -> bool:
    """The flood call's own `call` record is in the kept log."""
    return any(e["event"] == "call" and e.get("arguments") == flood(what, server) for e in found)


def verified(state: Path, config: Path) -> str:
    done = cli({"CELLBLOCK_STATE_DIR": str(state)}, "audit", "--verify", "--config", str(config))
    assert done.returncode == 0, done.stderr
    return done.stdout


def rotated_away(state: Path) -> bool:
    """Whether the oldest kept file follows one rotation dropped (its first line names a `prev`)."""
    oldest = rotated_paths(state / "audit.jsonl")[0]
    return bool(json.loads(oldest.read_text().splitlines()[0]).get("prev"))


# each server floods one call: sampling allowed or asked about, or forms, in each server era
FLOODS = {
    "sa": ("sampling", questioner("legacy", "ask")),
    "sl": ("sampling", questioner("legacy", "allow")),
    "ma": ("sampling", questioner("modern", "ask")),
    "ml": ("sampling", questioner("modern", "allow")),
    "ea": ("elicitation", questioner("legacy")),
    "em": ("elicitation", questioner("modern")),
}


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_a_flood_of_questions_in_one_call_is_capped_and_the_calls_record_stays(tmp_path: Path, mode: str) -> None:
    state = tmp_path / "state"
    config = write_config(tmp_path, {name: server for name, (_, server) in FLOODS.items()}, audit=SMALL)
    results: dict[str, types.CallToolResult] = {}
    asked: dict[str, int] = {}
    side = ClientSide()
    async with served(config, state, mode, side, SERVE) as client:
        for name, (what, _) in FLOODS.items():
            before = len(side.forms) + side.sampled
            results[name] = await client.call_tool(f"{name}__flood", flood(what, name))
            asked[name] = len(side.forms) + side.sampled - before
    found = events(state)
    for name, (what, server) in FLOODS.items():
        result = text(results[name])
        if server["args"][-1] == "legacy":  # refused one by one, it answers its call
            assert result == f"asked {FLOOD}: {MAX_QUESTIONS} answered, {FLOOD - MAX_QUESTIONS} refused", result
        else:  # its round is refused: the call ends with why
            assert results[name].is_error and f"may ask at most {MAX_QUESTIONS} questions" in result, result
        # a form and a sampling request for each allowed under `ask`, else one of them
        per_question = 2 if server.get("sampling") == "ask" else 1
        assert asked[name] == per_question * MAX_QUESTIONS, (name, asked[name])
        assert recorded(found, name, what), f"the record of {name}'s call was rotated out"
        ends = [e for e in found if e["event"] == "call_end" and e["server"] == name]
        assert len(ends) == 1, name
        (capped,) = [e for e in found if e["event"] == "questions_capped" and e["server"] == name]
        assert capped["limit"] == MAX_QUESTIONS and capped["what"] == what
    left_out = sum(e["count"] for e in found if e["event"] == "suppressed")
    assert any(e["event"] == "suppressed" and e["kind"] == "sampling_granted" for e in found)
    assert left_out > 0
    said = verified(state, config)
    assert f"{left_out} event(s) servers triggered were counted, not written" in said, said
    # whole, or it says what rotation took: the truth either way
    assert ("rotated away" in said) == rotated_away(state) and ("audit chain whole" in said) != rotated_away(state)


async def test_control_without_the_cap_and_the_budget_the_flood_asks_every_time_and_rotates_the_call_out(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    config = write_config(tmp_path, {"sa": FLOODS["sa"][1]}, audit=SMALL)
    side = ClientSide()
    async with served(config, state, "legacy", side, UNGUARDED) as client:
        result = await client.call_tool("sa__flood", flood("sampling", "sa"))
    assert text(result) == f"asked {FLOOD}: {FLOOD} answered, 0 refused"
    assert len(side.forms) == side.sampled == FLOOD  # a form for every request, for one call
    assert not recorded(events(state), "sa", "sampling")  # the call's record is gone from every kept file
    said = verified(state, config)
    # what the chain cannot vouch for is said, not "whole" (as it was said before)
    assert "rotated away" in said and "audit chain whole" not in said, said
