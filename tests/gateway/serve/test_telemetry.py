"""Telemetry (`telemetry: {otlp: URL}`, gateway/serve/telemetry.py): the gateway in memory sends
spans and counters to a real OTLP/HTTP receiver in the test, decoded with OpenTelemetry's own
protobuf messages. What must never leave: a call's arguments, its result, a held secret."""

from __future__ import annotations

import os
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, ClassVar

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from cellblock.gateway.config.base import ConfigError
from cellblock.gateway.config.loading import parse_config
from cellblock.gateway.config.telemetry import TelemetryConfig
from cellblock.gateway.serve import telemetry
from tests.gateway.serve.test_gateway import POLICY, Human
from tests.harness import build, connected
from tests.integration.conftest import probe_server, write_config
from tests.servers.threaded import serving

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Receiver(BaseHTTPRequestHandler):
    """An OTLP/HTTP collector's two paths: each request's raw body, by path."""

    bodies: ClassVar[dict[str, list[bytes]]] = {}

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.bodies.setdefault(self.path, []).append(body)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture
def collector() -> Iterator[str]:
    Receiver.bodies = {}
    with serving(Receiver) as url:
        yield url


def spans() -> list[Any]:
    found = []
    for body in Receiver.bodies.get("/v1/traces", []):
        request = ExportTraceServiceRequest.FromString(body)
        found += [span for rs in request.resource_spans for ss in rs.scope_spans for span in ss.spans]
    return found


def sums() -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Each counter's last value, by its name and attributes."""
    totals: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for body in Receiver.bodies.get("/v1/metrics", []):
        request = ExportMetricsServiceRequest.FromString(body)
        for metric in (m for rm in request.resource_metrics for sm in rm.scope_metrics for m in sm.metrics):
            points = metric.sum.data_points if metric.HasField("sum") else metric.histogram.data_points
            for point in points:
                labels = frozenset((a.key, a.value.string_value) for a in point.attributes)
                value = point.as_int if metric.HasField("sum") else point.count
                totals[(metric.name, labels)] = value
    return totals


def attributes(span: Any) -> dict[str, str]:
    return {a.key: a.value.string_value for a in span.attributes}


async def test_calls_refusals_and_asks_reach_the_collector_with_no_argument_or_result(
    tmp_path: Path, collector: str
) -> None:
    secret = "sk-" + os.urandom(12).hex()
    marker = "arg-" + os.urandom(12).hex()
    server = probe_server("--name", "p", tools=POLICY)
    config = write_config(tmp_path, {"p": server}, telemetry={"otlp": collector}, approvals={"timeout": 30})
    gateway = build(config, tmp_path / "state")
    gateway.audit.add_secret(secret, "p")  # as a keyring value the gateway holds
    async with connected(gateway, elicitation_callback=Human("allow_once")) as client:
        assert not (await client.call_tool("p__echo", {"message": marker + secret})).is_error
        assert (await client.call_tool("p__hang", {"why": marker})).is_error  # the policy's default: deny
        assert not (await client.call_tool("p__slow", {"steps": 1, "delay": 0})).is_error  # asked, allowed
    # the audit closes with the gateway: what telemetry held is sent by then, no waiting
    by_name = {span.name: span for span in spans()}
    echo, hang, slow, wait = (
        by_name[n] for n in ("tools/call echo", "tools/call hang", "tools/call slow", "approval slow")
    )
    assert attributes(echo) == {
        "mcp.method.name": "tools/call",
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "echo",
        "cellblock.server": "p",
    }
    assert echo.end_time_unix_nano > echo.start_time_unix_nano
    assert attributes(hang)["cellblock.rule"] == "default" and hang.status.code == hang.status.STATUS_CODE_ERROR
    assert attributes(wait)["cellblock.answer"] == "granted" and wait.end_time_unix_nano <= slow.end_time_unix_nano
    counted = sums()
    assert counted[("cellblock.calls", frozenset({("cellblock.server", "p"), ("cellblock.decision", "allow")}))] == 2
    assert counted[("cellblock.calls", frozenset({("cellblock.server", "p"), ("cellblock.decision", "deny")}))] == 1
    assert counted[("cellblock.refusals", frozenset({("cellblock.server", "p"), ("cellblock.rule", "default")}))] == 1
    assert counted[("cellblock.asks", frozenset({("cellblock.server", "p")}))] == 1
    # nothing of an argument, a result or a secret in anything sent; the audit does hold the argument
    sent = b"".join(b for bodies in Receiver.bodies.values() for b in bodies)
    assert marker.encode() not in sent and secret.encode() not in sent
    assert marker in (tmp_path / "state" / "audit.jsonl").read_text()


def test_without_the_key_nothing_is_made_and_without_the_exporter_the_start_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert telemetry.telemetry_for(None) is None
    real = telemetry.importlib.import_module

    def missing(name: str) -> Any:
        if name.startswith("opentelemetry.exporter"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return real(name)

    monkeypatch.setattr(telemetry.importlib, "import_module", missing)
    with pytest.raises(ConfigError, match=r"pip install 'cellblock\[telemetry\]'"):
        telemetry.telemetry_for(TelemetryConfig(otlp="http://127.0.0.1:4318"))


@pytest.mark.parametrize(
    ("otlp", "said"),
    [
        ("grpc://collector:4317", "the http(s) address of a collector"),
        ("http://user:hunter2@collector:4318", "no user or password"),
        ("collector:4318", "the http(s) address of a collector"),
    ],
)
def test_a_collector_address_that_is_not_one_is_refused_naming_the_key(otlp: str, said: str) -> None:
    with pytest.raises(ConfigError) as refused:
        parse_config(f"version: 1\ntelemetry:\n  otlp: '{otlp}'\nservers: {{}}\n")
    assert "telemetry.otlp" in str(refused.value) and said in str(refused.value)
    assert "hunter2" not in str(refused.value)
    assert parse_config("version: 1\ntelemetry:\n  otlp: http://127.0.0.1:4318/\n").telemetry == TelemetryConfig(
        otlp="http://127.0.0.1:4318"
    )
