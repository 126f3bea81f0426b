"""What a server is offered (downstream/offer.py): the questions the gateway's client can answer."""

from __future__ import annotations

import mcp.types as types
import pytest

from cellblock.gateway.config.model import LocalServer, RemoteServer
from cellblock.gateway.downstream import offer as offer_module
from cellblock.gateway.downstream.offer import Offer

pytestmark = pytest.mark.anyio

EVERYTHING = ["roots", "elicitation", "sampling"]
FORMS = types.ClientCapabilities(elicitation=types.ElicitationCapability())
MODEL = types.ClientCapabilities(sampling=types.SamplingCapability())


async def test_with_no_client_expected_a_server_is_offered_everything_at_once() -> None:
    assert Offer.names(await Offer().client(), "allow") == EVERYTHING


async def test_the_client_that_introduces_itself_decides() -> None:
    offer = Offer()
    introduce = offer.expecting()
    introduce(FORMS, False)
    introduce(MODEL, False)  # a later request does not change what was offered
    assert Offer.names(await offer.client(), "allow") == ["roots", "elicitation"]


@pytest.mark.parametrize(
    ("caps", "sampling", "offered"),
    [
        (None, "deny", ["roots", "elicitation"]),  # a server that may not sample is never offered it
        (types.ClientCapabilities(), "allow", ["roots"]),
        (MODEL, "ask", ["roots", "sampling"]),
        (MODEL, "deny", ["roots"]),
    ],
)
def test_what_is_offered(caps: types.ClientCapabilities | None, sampling: str, offered: list[str]) -> None:
    assert Offer.names(caps, sampling) == offered


async def test_a_client_that_said_nothing_usable_is_offered_only_roots() -> None:
    offer = Offer()
    offer.expecting()(None, False)
    assert Offer.names(await offer.client(), "allow") == ["roots"]


async def test_a_client_that_says_nothing_in_time_leaves_its_servers_offered_everything(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(offer_module, "WAIT_SECONDS", 0.01)
    offer = Offer()
    offer.expecting()
    assert Offer.names(await offer.client(), "allow") == EVERYTHING


AUTO = LocalServer(command="srv")
LEGACY = LocalServer(command="srv", protocol="legacy")
REMOTE = RemoteServer(url="https://mcp.example.com/mcp")


async def test_a_local_server_is_spoken_to_in_the_era_its_client_opened_with() -> None:
    handshake, modern = Offer(), Offer()
    handshake.expecting()(FORMS, True)
    modern.expecting()(FORMS, False)
    await handshake.client()
    await modern.client()
    assert [handshake.spoken(s) for s in (AUTO, LEGACY, REMOTE)] == ["legacy", "legacy", "auto"]
    assert [modern.spoken(s) for s in (AUTO, LEGACY, REMOTE)] == ["auto", "legacy", "auto"]


async def test_without_a_client_expected_or_after_the_first_request_the_era_stays_the_configs() -> None:
    assert Offer().spoken(AUTO) == "auto"  # `--http` and `review`: clients of both eras share a server
    offer = Offer()
    introduce = offer.expecting()
    introduce(FORMS, False)
    introduce(FORMS, True)  # a later request does not change it
    assert offer.spoken(AUTO) == "auto"


async def test_a_start_that_gave_up_waiting_is_met_as_configured_and_a_later_one_follows_the_client(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(offer_module, "WAIT_SECONDS", 0.01)
    offer = Offer()
    introduce = offer.expecting()
    assert Offer.names(await offer.client(), "allow") == EVERYTHING and offer.spoken(AUTO) == "auto"
    introduce(FORMS, True)  # the client speaks at last: a restart follows it
    assert Offer.names(await offer.client(), "allow") == ["roots", "elicitation"] and offer.spoken(AUTO) == "legacy"
