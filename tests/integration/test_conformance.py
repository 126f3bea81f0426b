"""The official MCP conformance suite (`@modelcontextprotocol/conformance`): every server scenario that
passes against tests/servers/conformance.py directly passes through `cellblock serve --http` too, and
every client scenario that the SDK's own client passes, Cellblock as the client passes too.

The same runs as ``python -m tests.conformance`` (which writes the tables in docs/protocol.md): the server
once over its own Streamable HTTP, once as a local server of the gateway (stdio, in its jail, no prefix);
the client scenarios once with the SDK's client, once with `cellblock auth login` and `cellblock serve`
(tests/conformance_client.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import peers
from tests.conformance import (
    Outcome,
    client_scenarios,
    direct,
    gateway_config,
    run_all,
    run_clients,
    server_scenarios,
)
from tests.integration.test_http import serving

pytestmark = pytest.mark.peers

# Scenarios that pass directly and not through the gateway, each with its reason; docs/protocol.md
# ("The conformance suite") gives the same list. None today.
DIFFERENCES: dict[str, str] = {}

# Client scenarios the SDK's own client (tests/conformance_client.py direct) does not pass, with why.
SDK_CLIENT_FAILS = {
    "auth/2025-03-26-oauth-metadata-backcompat": "the metadata at the server's root names the issuer "
    "ROOT/oauth; the SDK checks the issuer against where it fetched it (RFC 8414 section 3.3) and stops",
}
# Client scenarios the SDK's client passes and Cellblock as the client does not, each with its reason;
# docs/protocol.md ("Cellblock as the client") gives the same list.
CLIENT_DIFFERENCES: dict[str, str] = {}  # none today


@pytest.fixture(scope="module")
def outcomes(served_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Outcome], ...]:
    peers.conformance()  # skips (or fails under CELLBLOCK_REQUIRE_PEERS=1) when the suite is not installed
    scenarios = server_scenarios()
    with direct() as url:
        straight = run_all(url, scenarios)
    config = gateway_config(Path(tmp_path_factory.mktemp("conformance-config")))
    with serving(config, served_env) as url:
        gated = run_all(url, scenarios)
    return straight, gated


def test_the_server_passes_the_suite_directly(outcomes: tuple[dict[str, Outcome], ...]) -> None:
    straight, _ = outcomes
    # Everything but server-sse-polling, which gives only warnings (see docs/protocol.md).
    failing = {name: outcome.errors for name, outcome in straight.items() if not outcome.ok}
    assert set(failing) <= {"server-sse-polling"}, failing
    assert len(straight) >= 30


def test_what_passes_directly_passes_through_cellblock(outcomes: tuple[dict[str, Outcome], ...]) -> None:
    straight, gated = outcomes
    lost = {
        name: gated[name].errors
        for name, outcome in straight.items()
        if outcome.ok and name not in DIFFERENCES and (not gated[name].ok or gated[name].passed != outcome.passed)
    }
    assert lost == {}


def test_each_listed_difference_still_differs(outcomes: tuple[dict[str, Outcome], ...]) -> None:
    """A difference the gateway has fixed is taken off the list (and off docs/protocol.md)."""
    straight, gated = outcomes
    fixed = [name for name in DIFFERENCES if straight[name].ok and gated[name].ok]
    assert fixed == []


def test_warnings_are_the_same_through_cellblock(outcomes: tuple[dict[str, Outcome], ...]) -> None:
    straight, gated = outcomes
    assert {name: o.warnings for name, o in gated.items()} == {name: o.warnings for name, o in straight.items()}


@pytest.fixture(scope="module")
def client_outcomes(served_env: dict[str, str]) -> tuple[dict[str, Outcome], ...]:
    peers.conformance()
    scenarios = client_scenarios()
    return run_clients("direct", scenarios, {}), run_clients("cellblock", scenarios, served_env)


@pytest.mark.slow
def test_the_sdk_client_passes_the_client_scenarios(client_outcomes: tuple[dict[str, Outcome], ...]) -> None:
    straight, _ = client_outcomes
    failing = {name: outcome.errors for name, outcome in straight.items() if not outcome.ok}
    assert set(failing) == set(SDK_CLIENT_FAILS), failing
    assert len(straight) >= 20


@pytest.mark.slow
def test_what_the_sdk_client_passes_cellblock_as_the_client_passes(
    client_outcomes: tuple[dict[str, Outcome], ...],
) -> None:
    straight, gated = client_outcomes
    lost = {
        name: gated[name].errors
        for name, outcome in straight.items()
        if outcome.ok and name not in CLIENT_DIFFERENCES and not gated[name].ok
    }
    assert lost == {}


@pytest.mark.slow
def test_each_listed_client_difference_still_differs(client_outcomes: tuple[dict[str, Outcome], ...]) -> None:
    """A difference the gateway has fixed is taken off the list (and off docs/protocol.md)."""
    straight, gated = client_outcomes
    fixed = [name for name in CLIENT_DIFFERENCES if straight[name].ok and gated[name].ok]
    assert fixed == []
