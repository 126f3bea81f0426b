"""The egress proxy's `network: ask` path, with a fake asker, against a local destination."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest

from cellblock.policy.hosts import parse_rule
from cellblock.sandbox.egress import Answer, Asked, Decision, EgressProxy
from tests.sandbox.test_egress import Resolved, destination, exchange, sock_dir, status

pytestmark = pytest.mark.anyio
__all__ = ["sock_dir"]  # the fixture, used by name

FIX = "allow it with 'cellblock allow-host files {}'"


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


class Human:
    """A fake asker: answers each question with `answer`, once `go` is set; counts the questions."""

    def __init__(self, answer: Answer, how: str = "") -> None:
        self.answer = answer
        self.how = how or answer.value
        self.questions: list[tuple[str, int]] = []
        self.go = anyio.Event()
        self.go.set()

    async def __call__(self, host: str, port: int) -> Asked:
        self.questions.append((host, port))
        await self.go.wait()
        return Asked(self.answer, self.how)


@asynccontextmanager
async def asking(
    sock_dir: Path, rules: Sequence[str], human: Human, resolver: Resolved
) -> AsyncIterator[tuple[str, list[Decision], EgressProxy]]:
    decisions: list[Decision] = []
    path = str(sock_dir / "egress.sock")
    server = EgressProxy(
        "files", [parse_rule(r) for r in rules], path, decisions.append, resolver, ask=human, fix=FIX.format
    )
    async with anyio.create_task_group() as tg:
        await tg.start(server.serve)
        try:
            yield path, decisions, server
        finally:
            tg.cancel_scope.cancel()


def connect(host: str, port: int) -> bytes:
    return f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode()


def get(host: str, port: int) -> bytes:
    return f"GET http://{host}:{port}/asked HTTP/1.1\r\nHost: x\r\n\r\n".encode()


async def test_a_host_allowed_once_goes_through_and_is_not_asked_again_in_this_run(sock_dir: Path) -> None:
    human, resolver = Human(Answer.ONCE), Resolved({"site.test": ["127.0.0.1"]})
    # the IP rule opens the loopback destination, as the special-address check wants
    async with destination() as dest, asking(sock_dir, [f"127.0.0.1:{dest.port}"], human, resolver) as opened:
        path, decisions, _ = opened
        first = await exchange(path, get("site.test", dest.port))
        second = await exchange(path, get("site.test", dest.port))
    assert first.endswith(b"hello from /asked") and second.endswith(b"hello from /asked")
    assert human.questions == [("site.test", dest.port)]
    assert dest.connections == 2
    assert [(d.allowed, d.asked) for d in decisions] == [(True, "once"), (True, "once (asked before)")]


async def test_a_denied_host_is_refused_naming_the_host_and_the_command_without_any_lookup(sock_dir: Path) -> None:
    human, resolver = Human(Answer.DENY, "denied from the CLI (ab12)"), Resolved({"site.test": ["127.0.0.1"]})
    async with destination() as dest, asking(sock_dir, [f"127.0.0.1:{dest.port}"], human, resolver) as opened:
        path, decisions, _ = opened
        response = await exchange(path, connect("site.test", dest.port))
    assert status(response) == 403
    target = f"site.test:{dest.port}"
    assert f"{target} is not in allow_hosts".encode() in response
    assert f"allow it with 'cellblock allow-host files {target}'".encode() in response
    assert dest.connections == 0
    assert resolver.asked == []  # nothing left the machine for the name before a yes
    assert [(d.allowed, d.asked) for d in decisions] == [(False, "denied from the CLI (ab12)")]


async def test_a_host_allowed_always_joins_the_rules_at_once(sock_dir: Path) -> None:
    human, resolver = Human(Answer.ALWAYS), Resolved({"site.test": ["127.0.0.1"]})
    async with destination() as dest, asking(sock_dir, [f"127.0.0.1:{dest.port}"], human, resolver) as opened:
        path, decisions, server = opened
        await exchange(path, get("site.test", dest.port))
        await exchange(path, get("site.test", dest.port))
        rules = [r.text for r in server.rules]
    assert f"site.test:{dest.port}" in rules
    assert human.questions == [("site.test", dest.port)]
    assert [d.asked for d in decisions] == ["always", None]  # the second is allowed by the rule


async def test_connections_to_the_same_host_wait_for_one_question(sock_dir: Path) -> None:
    """A "deny" is not kept by the proxy, so a connection that came after the answer would ask again."""
    human, resolver = Human(Answer.DENY), Resolved({"site.test": ["127.0.0.1"]})
    human.go = anyio.Event()
    answers: list[bytes] = []
    async with asking(sock_dir, ["api.example.test"], human, resolver) as (path, _, server):

        async def one() -> None:
            answers.append(await exchange(path, connect("site.test", 443)))

        async with anyio.create_task_group() as tg:
            for _ in range(3):
                tg.start_soon(one)
            with anyio.fail_after(5):
                while server.waiting < 3:
                    await anyio.wait_all_tasks_blocked()
            human.go.set()
    assert len(human.questions) == 1
    assert [status(a) for a in answers] == [403, 403, 403]


async def test_a_yes_does_not_open_a_name_that_resolves_to_a_private_address(sock_dir: Path) -> None:
    human, resolver = Human(Answer.ONCE), Resolved({"inside.test": ["10.0.0.5"]})
    async with asking(sock_dir, ["api.example.test"], human, resolver) as (path, decisions, _):
        response = await exchange(path, connect("inside.test", 443))
    assert status(response) == 403
    assert b"resolves to 10.0.0.5" in response
    assert [(d.allowed, d.asked) for d in decisions] == [(False, "once")]


async def test_a_private_address_is_never_asked_about(sock_dir: Path) -> None:
    human, resolver = Human(Answer.ONCE), Resolved({})
    async with asking(sock_dir, ["api.example.test"], human, resolver) as (path, decisions, _):
        response = await exchange(path, connect("192.168.1.1", 80))
    assert status(response) == 403
    assert b"allow it with 'cellblock allow-host files 192.168.1.1:80'" in response
    assert human.questions == []
    assert [d.allowed for d in decisions] == [False]


async def test_without_an_asker_an_unlisted_host_is_refused_naming_the_command(sock_dir: Path) -> None:
    decisions: list[Decision] = []
    path = str(sock_dir / "egress.sock")
    server = EgressProxy("files", [parse_rule("api.example.test")], path, decisions.append, fix=FIX.format)
    async with anyio.create_task_group() as tg:
        await tg.start(server.serve)
        response = await exchange(path, connect("elsewhere.test", 443))
        tg.cancel_scope.cancel()
    assert status(response) == 403
    assert b"allow it with 'cellblock allow-host files elsewhere.test:443'" in response
    assert decisions[0].reason.endswith("allow it with 'cellblock allow-host files elsewhere.test:443'")


@pytest.mark.parametrize("address", ["169.254.169.254", "127.0.0.1", "fd00:ec2::254"])
async def test_a_name_that_leads_to_the_metadata_service_or_loopback_is_never_answered_with_the_command_that_opens_it(
    sock_dir: Path, address: str
) -> None:
    """A hostile server's own DNS points its name there: the refusal, which the model relays to the
    user as the fix, says why it is refused and names no command that would open it."""
    human, resolver = Human(Answer.ONCE), Resolved({"docs.attacker.test": [address]})
    async with asking(sock_dir, [], human, resolver) as (path, _, _):
        response = await exchange(path, connect("docs.attacker.test", 80))
    assert status(response) == 403
    assert b"allow-host" not in response and (b"never let reach" in response or b"only if you open it" in response)


async def test_a_metadata_address_named_directly_is_refused_without_the_command(sock_dir: Path) -> None:
    human = Human(Answer.ONCE)
    async with asking(sock_dir, [], human, Resolved({})) as (path, _, _):
        response = await exchange(path, connect("169.254.169.254", 80))
    assert status(response) == 403 and b"allow-host" not in response and b"metadata" in response, response


async def test_control_a_name_that_leads_to_a_private_address_names_the_command(sock_dir: Path) -> None:
    human, resolver = Human(Answer.ONCE), Resolved({"inside.test": ["10.0.0.5"]})
    async with asking(sock_dir, [], human, resolver) as (path, _, _):
        response = await exchange(path, connect("inside.test", 443))
    assert b"allow it with 'cellblock allow-host files 10.0.0.5:443'" in response
