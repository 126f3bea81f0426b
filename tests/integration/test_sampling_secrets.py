"""A model's answer to a server's sampling request carries no secret held for another server,
through the real `cellblock serve`.

The answer goes to the server that asked, as a call's arguments do: a model can be led to copy a
token from one tool's output into it. The sampler test server (tests/servers/sampler.py) asks
twice in one call and answers with what it got back, so its result shows what reached it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import keyring
import mcp.types as types
import pytest

from tests.integration.conftest import ROOT, gateway, write_config
from tests.integration.test_secret_arguments import audited, env, recorder, text

pytestmark = pytest.mark.anyio
__all__ = ["env"]  # the fixture, shared with the arguments' tests
SAMPLER = ROOT / "tests" / "servers" / "sampler.py"


@pytest.fixture
def token(keyring_env: dict[str, str]) -> Iterator[str]:
    """`a`'s token, in the keyring."""
    value = "tok-" + os.urandom(12).hex()
    keyring.set_password("cellblock", "a-token", value)
    try:
        yield value
    finally:
        keyring.delete_password("cellblock", "a-token")


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_a_models_answer_carrying_another_servers_secret_never_reaches_the_server_that_asked(
    tmp_path: Path, env: dict[str, str], token: str, mode: str
) -> None:
    # the answers the model gives, in turn: the ones after the first are the control
    answers = iter([f"the key is {token}", "nothing secret", "nothing secret", "still nothing"])

    async def model(ctx: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
        return types.CreateMessageResult(
            role="assistant", content=types.TextContent(type="text", text=next(answers)), model="m"
        )

    records, state = tmp_path / "records", tmp_path / "state"
    records.mkdir()
    era = ["--era", "modern"] if mode == "auto" else []
    servers = {
        "a": recorder(records, "a", secrets={"API_TOKEN": "a-token"}, start="lazy"),
        "s": {
            "command": sys.executable,
            "args": [str(SAMPLER), *era],
            "sampling": "allow",
            "jail": {"read_only": [str(SAMPLER.parent)]},
        },
    }
    async with gateway(write_config(tmp_path, servers), state, env=env, mode=mode, sampling_callback=model) as client:
        result = await client.call_tool("s__twice", {"message": "summarise"})
        said = text(result)
        assert token not in said
        if mode == "legacy":  # the request is refused to the server, which goes on with its call
            assert said == "sampled: none, nothing secret", said
        else:  # a 2026-07-28 round with a refused request ends the call with the refusal
            assert result.is_error and "carries secret API_TOKEN (keyring entry 'a-token')" in said, said
            control = await client.call_tool("s__twice", {"message": "summarise"})
            assert text(control) == "sampled: nothing secret, nothing secret"
    refused = [e for e in audited(state) if e["event"] == "sampling" and e["decision"] == "deny"]
    assert [e["carried"] for e in refused] == [["secret API_TOKEN (keyring entry 'a-token')"]]
    assert token not in (state / "audit.jsonl").read_text()
