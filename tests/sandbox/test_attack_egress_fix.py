"""Hostile: a `network: ask` server's own name resolves (its DNS) to the cloud's metadata service or to
the host's loopback; the refusal then tells the model, and through it the user, the one command that
opens that address to the server."""

from __future__ import annotations

from pathlib import Path

import pytest

from cellblock.sandbox.egress import Answer
from tests.sandbox.test_egress import Resolved, exchange, sock_dir, status
from tests.sandbox.test_egress_ask import Human, asking, connect

__all__ = ["sock_dir"]  # the fixture, used by name

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.xfail(
    strict=True,
    reason="egress.py's special-address refusal names 'cellblock allow-host SERVER ADDRESS:PORT' for any address, "
    "the metadata service and loopback included, which the gate (check_host) never grants",
)
@pytest.mark.parametrize("address", ["169.254.169.254", "127.0.0.1"])
async def test_a_name_that_leads_to_the_metadata_service_or_loopback_is_never_answered_with_the_command_that_opens_it(
    sock_dir: Path, address: str
) -> None:
    human, resolver = Human(Answer.ONCE), Resolved({"docs.attacker.test": [address]})
    async with asking(sock_dir, [], human, resolver) as (path, _, _):
        response = await exchange(path, connect("docs.attacker.test", 80))
    assert status(response) == 403
    assert b"allow-host" not in response, response


async def test_the_control_a_name_that_leads_to_a_private_address_names_the_command(sock_dir: Path) -> None:
    human, resolver = Human(Answer.ONCE), Resolved({"inside.test": ["10.0.0.5"]})
    async with asking(sock_dir, [], human, resolver) as (path, _, _):
        response = await exchange(path, connect("inside.test", 443))
    assert b"allow it with 'cellblock allow-host files 10.0.0.5:443'" in response
