"""The egress proxy and the in-jail relay, against a local HTTP destination on 127.0.0.1 only."""

from __future__ import annotations

import os
import shutil
import signal
import stat
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import anyio.abc
import pytest
from anyio.abc import SocketAttribute
from anyio.streams.buffered import BufferedByteReceiveStream

from cellblock.policy.hosts import parse_rule
from cellblock.sandbox import egress, httphead
from cellblock.sandbox.egress import Decision, EgressProxy, Resolver

pytestmark = pytest.mark.anyio

RELAY = Path(egress.__file__).with_name("relay.py")


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    # tmp_path can exceed the 108-byte limit of a Unix socket path; this stays short
    path = Path(tempfile.mkdtemp(prefix="cb-egress-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


# -- a destination that counts what reaches it -----------------------------------------------


@dataclass
class Destination:
    port: int = 0
    connections: int = 0
    heads: list[bytes] = field(default_factory=list)

    async def handle(self, stream: anyio.abc.SocketStream) -> None:
        self.connections += 1
        async with stream:
            reader = BufferedByteReceiveStream(stream)
            try:
                head = await reader.receive_until(b"\r\n\r\n", 65536)
            except (anyio.IncompleteRead, anyio.DelimiterNotFound):
                return
            self.heads.append(head)
            path = head.split(b" ")[1]
            body = b"hello from " + path
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.lower() == b"content-length":
                    body += b" got " + await reader.receive_exactly(int(value))
            await stream.send(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
                % (len(body), body)
            )


@asynccontextmanager
async def destination() -> AsyncIterator[Destination]:
    dest = Destination()
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    dest.port = listener.extra(SocketAttribute.local_port)
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, dest.handle)
        try:
            yield dest
        finally:
            tg.cancel_scope.cancel()


@asynccontextmanager
async def proxy(
    sock_dir: Path,
    rules: Sequence[str],
    resolver: Resolver | None = None,
    on_decision: object = None,
) -> AsyncIterator[tuple[str, list[Decision]]]:
    decisions: list[Decision] = []
    path = str(sock_dir / "egress.sock")
    record = on_decision if callable(on_decision) else decisions.append
    server = EgressProxy("files", [parse_rule(r) for r in rules], path, record, resolver)
    async with anyio.create_task_group() as tg:
        await tg.start(server.serve)
        try:
            yield path, decisions
        finally:
            tg.cancel_scope.cancel()


class Resolved:
    """A fake resolver that answers from a table and remembers what it was asked."""

    def __init__(self, table: dict[str, list[str]]) -> None:
        self.table = table
        self.asked: list[str] = []

    async def __call__(self, host: str, port: int) -> list[str]:
        self.asked.append(host)
        if host not in self.table:
            raise OSError(f"no such host {host}")
        return self.table[host]


async def exchange(path: str, data: bytes, *, eof: bool = False) -> bytes:
    """Send `data` to the proxy and read until it closes."""
    with anyio.fail_after(5):
        async with await anyio.connect_unix(path) as stream:
            await stream.send(data)
            if eof:
                await stream.send_eof()
            chunks: list[bytes] = []
            while True:
                try:
                    chunks.append(await stream.receive())
                except (anyio.EndOfStream, anyio.BrokenResourceError):
                    return b"".join(chunks)


def status(response: bytes) -> int:
    return int(response.split(b" ", 2)[1])


# -- CONNECT ---------------------------------------------------------------------------------


async def test_connect_to_a_listed_ip_and_port_is_tunnelled(sock_dir: Path) -> None:
    async with destination() as dest, proxy(sock_dir, [f"127.0.0.1:{dest.port}"]) as (path, decisions):
        with anyio.fail_after(5):
            async with await anyio.connect_unix(path) as stream:
                await stream.send(f"CONNECT 127.0.0.1:{dest.port} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
                reader = BufferedByteReceiveStream(stream)
                established = await reader.receive_until(b"\r\n\r\n", 1024)
                assert established == b"HTTP/1.1 200 Connection established"
                await stream.send(b"GET /tunnel HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                response = b""
                while True:
                    try:
                        response += await reader.receive()
                    except anyio.EndOfStream:
                        break
    assert response.startswith(b"HTTP/1.1 200 OK")
    assert response.endswith(b"hello from /tunnel")
    assert dest.connections == 1
    assert decisions == [
        Decision(
            "files",
            "127.0.0.1",
            dest.port,
            allowed=True,
            reason=f"allowed by '127.0.0.1:{dest.port}'",
            address="127.0.0.1",
            rule=f"127.0.0.1:{dest.port}",
        )
    ]


async def test_an_unlisted_host_is_refused_before_any_lookup_or_connection(sock_dir: Path) -> None:
    resolver = Resolved({"evil.test": ["127.0.0.1"]})
    async with destination() as dest, proxy(sock_dir, ["api.example.test"], resolver) as (path, decisions):
        response = await exchange(path, f"CONNECT evil.test:{dest.port} HTTP/1.1\r\n\r\n".encode())
    assert status(response) == 403
    assert f"evil.test:{dest.port} is not in allow_hosts".encode() in response
    assert dest.connections == 0
    assert resolver.asked == []
    assert [(d.host, d.port, d.allowed) for d in decisions] == [("evil.test", dest.port, False)]


async def test_a_listed_ip_on_another_port_is_refused(sock_dir: Path) -> None:
    async with destination() as dest, proxy(sock_dir, [f"127.0.0.1:{dest.port + 1}"]) as (path, decisions):
        response = await exchange(path, f"CONNECT 127.0.0.1:{dest.port} HTTP/1.1\r\n\r\n".encode())
    assert status(response) == 403
    assert dest.connections == 0
    assert [d.allowed for d in decisions] == [False]


async def test_a_listed_name_that_resolves_to_a_clouds_metadata_service_is_refused(sock_dir: Path) -> None:
    """Azure's WireServer reads as a public address; a name the server's owner resolves there is
    no way to it (nor to AWS's metadata over IPv6)."""
    resolver = Resolved({"api.example.test": ["168.63.129.16"], "v6.example.test": ["fd00:ec2::254"]})
    async with proxy(sock_dir, ["api.example.test", "v6.example.test"], resolver) as (path, decisions):
        for name in ("api.example.test", "v6.example.test"):
            response = await exchange(path, f"CONNECT {name}:443 HTTP/1.1\r\n\r\n".encode())
            assert status(response) == 403 and b"resolves to" in response
    assert [(d.host, d.allowed, d.address) for d in decisions] == [
        ("api.example.test", False, "168.63.129.16"),
        ("v6.example.test", False, "fd00:ec2::254"),
    ]


async def test_a_listed_name_that_resolves_to_loopback_is_refused(sock_dir: Path) -> None:
    resolver = Resolved({"localhost": ["127.0.0.1"]})
    async with destination() as dest, proxy(sock_dir, [f"localhost:{dest.port}"], resolver) as (path, decisions):
        response = await exchange(path, f"CONNECT localhost:{dest.port} HTTP/1.1\r\n\r\n".encode())
    assert status(response) == 403
    assert b"localhost resolves to 127.0.0.1" in response
    assert dest.connections == 0
    assert len(decisions) == 1
    decision = decisions[0]
    assert (decision.host, decision.allowed, decision.address) == ("localhost", False, "127.0.0.1")
    assert decision.rule == f"localhost:{dest.port}"
    assert "no IP rule lists" in decision.reason


async def test_a_listed_name_reaches_loopback_when_an_ip_rule_names_it(sock_dir: Path) -> None:
    """Honest control for the refusal above: the same name, with the address listed too."""
    resolver = Resolved({"localhost": ["127.0.0.1"]})
    async with destination() as dest:
        rules = [f"localhost:{dest.port}", f"127.0.0.1:{dest.port}"]
        async with proxy(sock_dir, rules, resolver) as (path, decisions):
            response = await exchange(
                path, f"GET http://localhost:{dest.port}/named HTTP/1.1\r\nHost: localhost\r\n\r\n".encode()
            )
    assert status(response) == 200
    assert response.endswith(b"hello from /named")
    assert dest.connections == 1
    assert [(d.allowed, d.address, d.rule) for d in decisions] == [(True, "127.0.0.1", f"localhost:{dest.port}")]


async def test_a_name_with_any_special_address_among_its_answers_is_refused(sock_dir: Path) -> None:
    resolver = Resolved({"mixed.test": ["93.184.216.34", "127.0.0.1"]})
    async with destination() as dest, proxy(sock_dir, [f"mixed.test:{dest.port}"], resolver) as (path, decisions):
        response = await exchange(path, f"CONNECT mixed.test:{dest.port} HTTP/1.1\r\n\r\n".encode())
    assert status(response) == 403
    assert dest.connections == 0
    assert [(d.allowed, d.address) for d in decisions] == [(False, "127.0.0.1")]


async def test_a_name_that_does_not_resolve_is_a_bad_gateway(sock_dir: Path) -> None:
    resolver = Resolved({})
    async with proxy(sock_dir, ["nowhere.test:8080"], resolver) as (path, decisions):
        response = await exchange(path, b"CONNECT nowhere.test:8080 HTTP/1.1\r\n\r\n")
    assert status(response) == 502
    assert [(d.host, d.allowed) for d in decisions] == [("nowhere.test", False)]
    assert "cannot resolve" in decisions[0].reason


# -- absolute-URI requests -------------------------------------------------------------------


async def test_an_absolute_uri_get_is_forwarded_in_origin_form(sock_dir: Path) -> None:
    async with destination() as dest, proxy(sock_dir, [f"127.0.0.1:{dest.port}"]) as (path, decisions):
        request = (
            f"GET http://127.0.0.1:{dest.port}/path?q=1#frag HTTP/1.1\r\n"
            "Host: internal.example\r\n"
            "Proxy-Connection: keep-alive\r\n"
            "Proxy-Authorization: Basic c2VjcmV0\r\n"
            "Connection: keep-alive, X-Drop\r\n"
            "X-Drop: 1\r\n"
            "X-Keep: yes\r\n\r\n"
        )
        response = await exchange(path, request.encode())
    assert status(response) == 200
    assert response.endswith(b"hello from /path?q=1")
    [head] = dest.heads
    lines = head.split(b"\r\n")
    assert lines[0] == b"GET /path?q=1 HTTP/1.1"
    assert f"Host: 127.0.0.1:{dest.port}".encode() in lines
    assert b"X-Keep: yes" in lines
    assert b"Connection: close" in lines
    assert not [line for line in lines if line.lower().startswith((b"proxy-", b"x-drop", b"host: internal"))]
    assert [d.allowed for d in decisions] == [True]


async def test_a_request_body_is_forwarded_with_the_request(sock_dir: Path) -> None:
    async with destination() as dest, proxy(sock_dir, [f"127.0.0.1:{dest.port}"]) as (path, _):
        request = f"POST http://127.0.0.1:{dest.port}/echo HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello"
        response = await exchange(path, request.encode())
    assert response.endswith(b"hello from /echo got hello")


async def test_userinfo_in_the_uri_does_not_disguise_the_host(sock_dir: Path) -> None:
    resolver = Resolved({})
    async with destination() as dest, proxy(sock_dir, [f"127.0.0.1:{dest.port}"], resolver) as (path, decisions):
        response = await exchange(path, f"GET http://127.0.0.1:{dest.port}@evil.test/ HTTP/1.1\r\n\r\n".encode())
    assert status(response) == 403
    assert dest.connections == 0
    assert resolver.asked == []
    assert [(d.host, d.allowed) for d in decisions] == [("evil.test", False)]


# -- malformed and oversized requests --------------------------------------------------------


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"hello\r\n\r\n",
        b"\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",  # origin-form: not a proxy request
        b"OPTIONS * HTTP/1.1\r\n\r\n",
        b"CONNECT 127.0.0.1 HTTP/1.1\r\n\r\n",  # no port
        b"CONNECT 127.0.0.1: HTTP/1.1\r\n\r\n",
        b"CONNECT 127.0.0.1:99999 HTTP/1.1\r\n\r\n",
        b"CONNECT 127.0.0.1:0x50 HTTP/1.1\r\n\r\n",
        b"CONNECT :443 HTTP/1.1\r\n\r\n",
        b"CONNECT [::1 HTTP/1.1\r\n\r\n",
        b"CONNECT ::1:443 HTTP/1.1\r\n\r\n",
        b"CONNECT 127.1:443 HTTP/1.1\r\n\r\n",
        b"CONNECT 0x7f000001:443 HTTP/1.1\r\n\r\n",
        b"CONNECT 0177.0.0.1:443 HTTP/1.1\r\n\r\n",
        b"GET https://127.0.0.1/ HTTP/1.1\r\n\r\n",
        b"GET ftp://127.0.0.1/ HTTP/1.1\r\n\r\n",
        b"GET http://127.0.0.1/ HTTP/2.0\r\n\r\n",
        b"GET  http://127.0.0.1/ HTTP/1.1\r\n\r\n",
        b"GET http://127.0.0.1/\xff HTTP/1.1\r\n\r\n",
        b"GET http://ex%61mple.com/ HTTP/1.1\r\n\r\n",
        b"GET http://127.0.0.1/ HTTP/1.1\r\nBad Header\r\n\r\n",
        b"GET http://127.0.0.1/ HTTP/1.1\r\nX: 1\r\n folded\r\n\r\n",
        b"GET http://127.0.0.1/ HTTP/1.1\nHost: x\r\n\r\n",
        b"GET http://127.0.0.1/ HTTP/1.1\r\nX: a\rb\r\n\r\n",
        b"GET http://127.0.0.1/ HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"GET http://127.0.0.1/ HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
    ],
)
async def test_garbage_is_a_bad_request_and_is_recorded(sock_dir: Path, request_bytes: bytes) -> None:
    resolver = Resolved({})
    async with proxy(sock_dir, ["127.0.0.1", "[::1]:443", "example.com"], resolver) as (path, decisions):
        response = await exchange(path, request_bytes)
    assert status(response) == 400
    assert response.startswith(b"HTTP/1.1 400 Bad Request\r\n")
    assert resolver.asked == []
    assert len(decisions) == 1
    assert decisions[0].allowed is False


async def test_a_head_cut_short_by_eof_is_a_bad_request(sock_dir: Path) -> None:
    async with proxy(sock_dir, ["127.0.0.1"]) as (path, decisions):
        response = await exchange(path, b"CONNECT 127.0.0.1:80 HTTP/1.1\r\n", eof=True)
    assert status(response) == 400
    assert [d.allowed for d in decisions] == [False]


async def test_oversized_headers_are_refused(sock_dir: Path) -> None:
    async with destination() as dest, proxy(sock_dir, [f"127.0.0.1:{dest.port}"]) as (path, decisions):
        big = b"X-Big: " + b"a" * (egress.MAX_HEADER_BYTES + 1024) + b"\r\n"
        request = f"GET http://127.0.0.1:{dest.port}/ HTTP/1.1\r\n".encode() + big + b"\r\n"
        response = await exchange(path, request)
    assert status(response) == 431
    assert dest.connections == 0
    assert [d.allowed for d in decisions] == [False]


async def test_a_slow_request_head_times_out(sock_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(httphead, "HEADER_TIMEOUT", 0.2)
    async with proxy(sock_dir, ["127.0.0.1"]) as (path, decisions):
        response = await exchange(path, b"CONNECT 127.0.0.1:80 HTTP/1.1\r\n")
    assert status(response) == 408
    assert [d.allowed for d in decisions] == [False]


async def test_connections_over_the_limit_get_503(sock_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(egress, "MAX_CONNECTIONS", 1)
    async with proxy(sock_dir, ["127.0.0.1"]) as (path, decisions):
        with anyio.fail_after(5):
            async with await anyio.connect_unix(path) as idle:
                await idle.send(b"CONNECT")  # holds the only slot, head unfinished
                response = await exchange(path, b"CONNECT 127.0.0.1:80 HTTP/1.1\r\n\r\n")
    assert status(response) == 503
    assert [(d.allowed, d.reason) for d in decisions][:1] == [(False, "too many concurrent connections (limit 1)")]


async def test_a_failing_decision_record_means_no_connection(sock_dir: Path) -> None:
    def broken_audit(decision: Decision) -> None:
        raise OSError("audit log is full")

    async with (
        destination() as dest,
        proxy(sock_dir, [f"127.0.0.1:{dest.port}"], on_decision=broken_audit) as (path, _),
    ):
        response = await exchange(path, f"CONNECT 127.0.0.1:{dest.port} HTTP/1.1\r\n\r\n".encode())
    assert response == b""
    assert dest.connections == 0


async def test_the_socket_is_private_and_removed_on_exit(sock_dir: Path) -> None:
    async with proxy(sock_dir, ["127.0.0.1"]) as (path, _):
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert not await anyio.Path(path).exists()


# -- the relay -------------------------------------------------------------------------------

FETCH = "import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())"


def relay_argv(socket_path: str, *command: str) -> list[str]:
    return [
        sys.executable,
        str(RELAY),
        "--listen",
        "127.0.0.1:0",
        "--socket",
        socket_path,
        "--set-proxy-env",
        "--",
        *command,
    ]


async def test_a_jailed_style_client_fetches_through_relay_and_proxy(sock_dir: Path) -> None:
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    env["no_proxy"] = "127.0.0.1,localhost"  # the relay must clear it, or urllib would go direct
    async with destination() as dest, proxy(sock_dir, [f"127.0.0.1:{dest.port}"]) as (path, decisions):
        url = f"http://127.0.0.1:{dest.port}/via-relay"
        with anyio.fail_after(20):
            result = await anyio.run_process(relay_argv(path, sys.executable, "-c", FETCH, url), env=env, check=False)
    assert result.returncode == 0, result.stderr.decode()
    assert result.stdout.decode().strip() == "hello from /via-relay"
    assert dest.connections == 1
    assert [(d.host, d.allowed) for d in decisions] == [("127.0.0.1", True)]


async def test_a_refused_fetch_through_the_relay_gets_the_403(sock_dir: Path) -> None:
    code = (
        "import sys, urllib.request, urllib.error\n"
        "try:\n    urllib.request.urlopen(sys.argv[1], timeout=5)\n"
        "except urllib.error.HTTPError as e:\n    print(e.code, e.read().decode().strip())\n"
    )
    async with destination() as dest, proxy(sock_dir, ["api.example.test"]) as (path, decisions):
        url = f"http://127.0.0.1:{dest.port}/nope"
        with anyio.fail_after(20):
            result = await anyio.run_process(relay_argv(path, sys.executable, "-c", code, url), check=False)
    assert result.stdout.decode().startswith("403 cellblock: egress to 127.0.0.1:")
    assert dest.connections == 0
    assert [d.allowed for d in decisions] == [False]


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("import sys; sys.exit(3)", 3),
        ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", 128 + signal.SIGKILL),
    ],
)
async def test_the_relay_exits_with_the_childs_status(sock_dir: Path, code: str, expected: int) -> None:
    with anyio.fail_after(20):
        result = await anyio.run_process(
            relay_argv(str(sock_dir / "none.sock"), sys.executable, "-c", code), check=False
        )
    assert result.returncode == expected


async def test_the_relay_forwards_sigterm_to_the_child(sock_dir: Path) -> None:
    code = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *a: sys.exit(7))\n"
        "print('ready', flush=True)\n"
        "time.sleep(30)\n"
    )
    with anyio.fail_after(20):
        async with await anyio.open_process(
            relay_argv(str(sock_dir / "none.sock"), sys.executable, "-c", code)
        ) as process:
            assert process.stdout is not None
            assert (await process.stdout.receive()).strip() == b"ready"
            process.send_signal(signal.SIGTERM)
            assert await process.wait() == 7
