"""The official MCP conformance suite (`@modelcontextprotocol/conformance`): every server scenario that
passes against tests/servers/conformance.py directly passes through `cellblock serve --http` too.

The same run as ``python -m tests.conformance`` (which writes the table in docs/protocol.md): the server
once over its own Streamable HTTP, once as a local server of the gateway (stdio, in its jail, no prefix).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import peers
from tests.conformance import Outcome, direct, gateway_config, run_all, server_scenarios
from tests.integration.test_http import serving

pytestmark = pytest.mark.peers

# Scenarios that pass directly and not through the gateway, each with its reason; docs/protocol.md
# ("The conformance suite") gives the same list. None today.
DIFFERENCES: dict[str, str] = {}


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
