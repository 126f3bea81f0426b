"""`serve --http`'s bind parsing, its Guard (Host, Origin, token), driven as a bare ASGI app, and
which of its servers can reach it (so that it needs a token)."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import yaml

from cellblock.gateway.config.loading import parse_config
from cellblock.gateway.serve.http import Bind, Guard, parse_bind, reaching

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize(
    ("text", "bind", "loopback"),
    [
        ("8080", Bind("127.0.0.1", 8080), True),
        ("localhost:0", Bind("localhost", 0), True),
        ("[::1]:9", Bind("::1", 9), True),
        ("127.0.0.2:1", Bind("127.0.0.2", 1), True),
        ("0.0.0.0:8080", Bind("0.0.0.0", 8080), False),
        ("[::]:8080", Bind("::", 8080), False),
        ("192.168.1.5:80", Bind("192.168.1.5", 80), False),
    ],
)
def test_binds_parse_and_know_whether_they_are_loopback(text: str, bind: Bind, loopback: bool) -> None:
    assert parse_bind(text) == bind and bind.loopback is loopback


@pytest.mark.parametrize(
    "text",
    ["", "host:80", "127.0.0.1:", "127.0.0.1:65536", "1:2:3", "[::1]", "-1", "127.0.0.1:\u0668\u0660", "\uff18\uff10"],
)
def test_a_bind_not_of_the_form_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="--http"):
        parse_bind(text)


async def ask(guard: Guard, headers: dict[str, str]) -> int:
    """The status `guard` answers a request with `headers`; 200 when it passes it to the app."""
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/mcp",
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
    }
    await guard(scope, receive, send)
    return int(sent[0]["status"]) if sent else 200


async def passed(scope: Any, receive: Any, send: Any) -> None:
    pass  # the app behind the guard: reaching it is the 200


async def test_beyond_loopback_the_host_is_free_but_an_origin_must_be_the_host_itself() -> None:
    guard = Guard(passed, Bind("0.0.0.0", 8080), 8080, "s3cret")
    ok = {"Host": "gw.example:8080", "Authorization": "Bearer s3cret"}
    assert await ask(guard, ok) == 200
    assert await ask(guard, {**ok, "Origin": "https://gw.example:8080"}) == 200
    assert await ask(guard, {**ok, "Origin": "https://other.example"}) == 403
    assert await ask(guard, {**ok, "Origin": "http://localhost:8080"}) == 403  # not the host it was sent to


async def test_the_token_is_compared_whole() -> None:
    guard = Guard(passed, Bind("127.0.0.1", 80), 80, "s3cret")
    base = {"Host": "localhost"}  # port 80: the Host header carries none
    for given in ("", "Bearer ", "Bearer s3cre", "Bearer s3cretX", "bearer s3cret", "s3cret", "Basic s3cret"):
        assert await ask(guard, {**base, "Authorization": given}) == 401, given
    assert await ask(guard, {**base, "Authorization": "Bearer s3cret"}) == 200


async def test_on_loopback_only_loopback_names_with_the_port_pass() -> None:
    guard = Guard(passed, Bind("127.0.0.1", 0), 4567, None)
    for host in ("127.0.0.1:4567", "localhost:4567", "[::1]:4567"):
        assert await ask(guard, {"Host": host}) == 200
    for host in ("127.0.0.1:4568", "127.0.0.1", "evil.example:4567", "", "127.0.0.1:4567.evil.example"):
        assert await ask(guard, {"Host": host}) == 421, host
    assert await ask(guard, {"Host": "localhost:4567", "Origin": "http://127.0.0.1:3000"}) == 200
    for origin in (
        "http://evil.example",
        "null",
        "file://",
        "http://localhost.evil.example:3000",
        "http://localhost:1@evil.example",  # userinfo: the host is evil.example
        "http://[::1]@evil.example",  # which some Python releases cannot even split
        "http://[::1",  # nor this one, which none can
    ):
        assert await ask(guard, {"Host": "localhost:4567", "Origin": origin}) == 403, origin


async def test_on_another_loopback_address_its_own_name_passes_too() -> None:
    guard = Guard(passed, Bind("127.0.0.2", 0), 4567, None)
    assert await ask(guard, {"Host": "127.0.0.2:4567"}) == 200
    assert await ask(guard, {"Host": "127.0.0.3:4567"}) == 421  # another loopback address is not its own
    six = Guard(passed, Bind("::1", 0), 4567, None)
    assert await ask(six, {"Host": "[::1]:4567"}) == 200 and await ask(six, {"Host": "::1:4567"}) == 421


async def test_a_websocket_is_closed_before_any_check_could_be_skipped() -> None:
    reached: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        reached.append(scope["type"])

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    guard = Guard(app, Bind("127.0.0.1", 0), 4567, "s3cret")
    await guard({"type": "websocket", "path": "/mcp", "headers": []}, None, send)  # type: ignore[arg-type]
    assert sent == [{"type": "websocket.close", "code": 1008}] and reached == []
    await guard({"type": "lifespan"}, None, send)  # type: ignore[arg-type]
    assert reached == ["lifespan"]  # control: the lifespan still reaches the app


def servers(**jails: Any) -> Any:
    """A config whose local servers have these jails (a `url` makes a remote one)."""
    entries = {
        name: {"url": jail["url"]} if "url" in jail else {"command": "/bin/true", "jail": jail["jail"]}
        for name, jail in jails.items()
    }
    return parse_config(yaml.safe_dump({"version": 1, "servers": entries}))


def allowlist(*hosts: str) -> dict[str, Any]:
    return {"jail": {"network": "allowlist", "allow_hosts": list(hosts)}}


@pytest.mark.parametrize(
    ("jail", "why"),
    [
        ({"jail": {"network": "open"}}, "network: open"),
        ({"jail": False}, "jail: false"),
        (allowlist("api.github.com", "127.0.0.1:8080"), "allow_hosts: 127.0.0.1:8080"),
        (allowlist("127.0.0.0/8:8080"), "allow_hosts: 127.0.0.0/8:8080"),
        (allowlist("0.0.0.0/0:8080"), "allow_hosts: 0.0.0.0/0:8080"),
        (allowlist("0.0.0.0:8080"), "allow_hosts: 0.0.0.0:8080"),  # Linux connects 0.0.0.0 to loopback
    ],
)
def test_a_server_that_can_connect_to_the_gateways_port_is_named_with_why(jail: dict[str, Any], why: str) -> None:
    assert reaching(servers(x=jail), Bind("127.0.0.1", 0), 8080) == [f"'x' ({why})"]
    assert reaching(servers(x=jail), Bind("localhost", 8080), 8080) == [f"'x' ({why})"]


@pytest.mark.parametrize(
    "jail",
    [
        {"jail": {"network": "none"}},
        allowlist("api.github.com", "localhost:8080"),  # a name never leads to loopback (the proxy checks)
        allowlist("127.0.0.1"),  # ports 80 and 443 only
        allowlist("127.0.0.1:8081"),
        allowlist("127.0.0.2:8080"),  # another address than the one it listens on
        allowlist("10.0.0.0/8:8080", "[::1]:8080"),
        {"url": "http://127.0.0.1:9000/mcp"},  # remote: a program of the user's, no jail of ours
    ],
)
def test_a_server_that_cannot_connect_to_it_is_not(jail: dict[str, Any]) -> None:
    assert reaching(servers(x=jail), Bind("127.0.0.1", 8080), 8080) == []


def test_on_ipv6_loopback_its_own_address_and_the_unspecified_one_reach_it() -> None:
    config = servers(a=allowlist("[::1]:8080"), b=allowlist("[::]:8080"), c=allowlist("127.0.0.1:8080"))
    found = reaching(config, Bind("::1", 8080), 8080)
    assert found == ["'a' (allow_hosts: [::1]:8080)", "'b' (allow_hosts: [::]:8080)"]


async def test_what_a_client_makes_the_guard_log_is_budgeted(caplog: pytest.LogCaptureFixture) -> None:
    guard = Guard(passed, Bind("127.0.0.1", 0), 4567, None)
    with caplog.at_level(logging.WARNING, logger="cellblock.gateway.serve.http"):
        for _ in range(500):
            assert await ask(guard, {"Host": "evil.example:4567"}) == 421  # every one refused
            assert await ask(guard, {"Host": "localhost:4567", "Origin": "http://evil.example"}) == 403
    assert 1 <= len(caplog.records) <= 21  # not a line each: a client would grow the log at will


async def test_the_guards_refusals_and_uvicorns_lines_share_one_budget(caplog: pytest.LogCaptureFixture) -> None:
    guard = Guard(passed, Bind("127.0.0.1", 0), 4567, None)
    bad_lines = [logging.makeLogRecord({"msg": "Invalid HTTP request received."}) for _ in range(500)]
    assert 1 <= sum(guard.told.filter(record) for record in bad_lines) <= 21  # uvicorn's, through the filter
    with caplog.at_level(logging.WARNING, logger="cellblock.gateway.serve.http"):
        for _ in range(50):
            assert await ask(guard, {"Host": "evil.example:4567"}) == 421
    assert len(caplog.records) <= 1  # spent by the other: not twice the lines for two ways in
