"""A hostile remote server cannot steer the gateway's OAuth discovery (blind SSRF), through `cellblock serve`.

One loopback HTTP server plays five remote servers, one per path. Each answers the gateway's
first POST with a 401 whose `resource_metadata` points where its scenario says, and serves
protected resource metadata naming the authorization server its scenario says. Listeners on
other ports (and on 127.0.0.2, a loopback address the server is not on) count what reaches them.
The control server keeps everything on its own origin and names an authorization server on its
own address: its listener sees the discovery requests, so the refusals are not for want of trying.
"""

from __future__ import annotations

import contextlib
import json
import secrets
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from tests.integration.conftest import cli, eventually, gateway, write_config
from tests.servers.threaded import serving

pytestmark = pytest.mark.anyio

SECRET = f"s3cr3t-{secrets.token_hex(8)}"


@dataclass
class Listener:
    """A loopback HTTP server that notes the path of every request and answers 404 (or `answer`)."""

    host: str
    url: str = ""
    seen: list[str] = field(default_factory=list)
    answer: dict[str, tuple[int, dict[str, str], bytes]] = field(default_factory=dict)


@contextlib.contextmanager
def listening(host: str, answer: Mapping[str, tuple[int, dict[str, str], bytes]] | None = None) -> Iterator[Listener]:
    record = Listener(host, answer=dict(answer or {}))

    class Handler(BaseHTTPRequestHandler):
        def _any(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(length)
            record.seen.append(self.path)
            status, headers, body = record.answer.get(self.path.split("?")[0], (404, {}, b""))
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = do_DELETE = _any

        def log_message(self, format: str, *args: object) -> None:
            pass

    with serving(Handler, host) as record.url:
        yield record


def hostile(base: str, scenarios: Mapping[str, tuple[str, str]]) -> dict[str, tuple[int, dict[str, str], bytes]]:
    """The answers of the remote servers `name -> (where its 401 points, the authorization server it names)`."""
    answers: dict[str, tuple[int, dict[str, str], bytes]] = {}
    for name, (challenge, authorization_server) in scenarios.items():
        header = {"WWW-Authenticate": f'Bearer resource_metadata="{challenge}"'}
        answers[f"/{name}/mcp"] = (401, header, b"")
        metadata = {"resource": f"{base}/{name}/mcp", "authorization_servers": [authorization_server]}
        json_head = {"Content-Type": "application/json"}
        answers[f"/{name}/prm"] = (200, json_head, json.dumps(metadata).encode())
    return answers


def events(state: Path, kind: str) -> list[dict[str, object]]:
    path = state / "audit.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [e for e in map(json.loads, lines) if e["event"] == kind]


def text(result: object) -> str:
    return "".join(getattr(c, "text", "") for c in getattr(result, "content", []))


async def test_a_401_or_its_metadata_cannot_send_discovery_elsewhere_and_each_refusal_is_audited(
    tmp_path: Path, keyring_env: Mapping[str, str]
) -> None:
    with (
        listening("127.0.0.1") as steered_to,
        listening("127.0.0.2") as other_loopback,
        listening("127.0.0.1") as control_as,
        listening("127.0.0.1") as remote,
    ):
        base = remote.url
        scenarios = {
            # the 401 points at another port on the same loopback address, with a token in the query
            "steered": (f"{steered_to.url}/prm?token={SECRET}", control_as.url),
            # the 401 points at the cloud metadata service
            "metadata": ("http://169.254.169.254/latest/meta-data/", control_as.url),
            # the metadata is on the server's origin, but names an authorization server on another address
            "private": (f"{base}/private/prm", other_loopback.url.replace("http:", "https:")),
            "plain": (f"{base}/plain/prm", other_loopback.url),  # and over http:
            # the control: everything on the server's origin, the authorization server on its address
            "control": (f"{base}/control/prm", control_as.url),
        }
        remote.answer = hostile(base, scenarios)
        servers = {name: {"url": f"{base}/{name}/mcp", "auth": {"type": "oauth"}} for name in scenarios}
        config = write_config(tmp_path, servers)
        state = tmp_path / "state"
        env = {**keyring_env, "XDG_RUNTIME_DIR": str(tmp_path)}
        async with gateway(config, state, env=env) as client:
            # each of them fails (refused, or the control for want of a registration endpoint)
            await eventually(lambda: {e["server"] for e in events(state, "server_failed")} >= set(scenarios), 30)
            assert steered_to.seen == [] and other_loopback.seen == []

            answer = await client.call_tool("steered__whoami", {})
            assert answer.is_error
            port = base.rsplit(":", 1)[1]
            assert f"server 'steered': OAuth discovery refused {steered_to.url}: " in text(answer)
            assert f"must be on its own origin (http://127.0.0.1:{port})" in text(answer)
            # a call retries the connection: refused again, and still nothing reached the listener
            await eventually(lambda: len([e for e in events(state, "oauth_refused") if e["server"] == "steered"]) >= 2)

        # `cellblock auth login` runs the same discovery, and is refused and audited the same way
        before = len(events(state, "oauth_refused"))
        login = cli(
            env | {"CELLBLOCK_STATE_DIR": str(state)},
            "auth",
            "login",
            "steered",
            "--no-browser",
            "--config",
            str(config),
        )
        assert login.returncode == 1
        assert f"server 'steered': OAuth discovery refused {steered_to.url}: " in login.stderr
        assert SECRET not in login.stderr + login.stdout
        assert [e["server"] for e in events(state, "oauth_refused")[before:]] == ["steered"]

    assert steered_to.seen == []
    assert other_loopback.seen == []
    # the control reached its endpoints: its own metadata, then its authorization server's
    assert "/control/prm" in remote.seen and "/private/prm" in remote.seen and "/plain/prm" in remote.seen
    assert any(p.startswith("/.well-known/oauth-authorization-server") for p in control_as.seen)
    assert "/steered/prm" not in remote.seen and "/metadata/prm" not in remote.seen

    audited = {e["server"]: e for e in events(state, "oauth_refused")}
    assert set(audited) == {"steered", "metadata", "private", "plain"}  # never the control
    assert audited["steered"]["origin"] == steered_to.url
    assert audited["metadata"]["origin"] == "http://169.254.169.254:80"
    assert audited["private"]["origin"] == other_loopback.url.replace("http:", "https:")
    assert "127.0.0.2 is an address" in str(audited["private"]["reason"])
    assert "must be https:" in str(audited["plain"]["reason"])
    assert SECRET not in (state / "audit.jsonl").read_text()
