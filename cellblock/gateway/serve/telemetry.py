"""What the gateway does, sent to an OpenTelemetry collector (`telemetry: {otlp: URL}`).

It is fed by the audit (`Audit.observe`): what is sent is what was recorded, in the same order,
and nothing the audit leaves out (a flood held to its budget) is sent either. Each event becomes:

- a call, a resource read or a prompt get that ran (`call_end`): a span that began its duration
  before, named as the MCP semantic conventions name it (`tools/call NAME`), with `mcp.method.name`,
  `gen_ai.operation.name`, `gen_ai.tool.name` (a tool's), `cellblock.server` and, when it failed,
  `error.type`; and the duration in the histogram `mcp.server.operation.duration`;
- a refused one (`call` with `deny`): a span of no length whose status is an error, with the rule
  that refused it (`cellblock.rule`), and the counter `cellblock.refusals`;
- every decision on a call (`call`): the counter `cellblock.calls`, by server and decision;
- a question to the user (`approval_asked`) and its answer (`approval_granted`, `_denied`,
  `_timeout`): the counter `cellblock.asks`, and a span of the wait, named `approval NAME`;
- a server that exited and is restarted (`server_exit`): the counter `cellblock.restarts`.

Names, decisions, rules and durations only: never a call's arguments, its result, a refusal's
reason or anything a server wrote, and so never a secret. Nothing is imported, started or sent
without the key: the SDK and its exporter are the optional extra `cellblock[telemetry]`.
"""

from __future__ import annotations

import importlib
from collections import defaultdict, deque
from collections.abc import Mapping
from typing import Any

from cellblock.gateway.config.base import ConfigError
from cellblock.gateway.config.telemetry import TelemetryConfig

__all__ = ["Telemetry", "telemetry_for"]

# what a call's kind is called in MCP: its method
_METHODS = {"tool": "tools/call", "resource": "resources/read", "prompt": "prompts/get"}
_ANSWERS = ("approval_granted", "approval_denied", "approval_timeout")
_MODULES = (
    "opentelemetry.sdk.resources",
    "opentelemetry.sdk.trace",
    "opentelemetry.sdk.trace.export",
    "opentelemetry.sdk.metrics",
    "opentelemetry.sdk.metrics.export",
    "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    "opentelemetry.exporter.otlp.proto.http.metric_exporter",
    "opentelemetry.trace",
)


def telemetry_for(config: TelemetryConfig | None) -> Telemetry | None:
    """The telemetry `config` asks for (None: none).

    Raises:
        ConfigError: the OpenTelemetry SDK or its OTLP exporter is not installed.
    """
    return None if config is None else Telemetry(config)


class Telemetry:
    """Spans and counters of what the audit records, sent to the collector at `config.otlp`.

    Raises:
        ConfigError: the OpenTelemetry SDK or its OTLP exporter is not installed.
    """

    def __init__(self, config: TelemetryConfig) -> None:
        try:
            (resources, trace, trace_export, metrics, metrics_export, span_exporter, metric_exporter, api) = (
                importlib.import_module(name) for name in _MODULES
            )
        except ImportError as exc:
            raise ConfigError(
                f"telemetry: sending to {config.otlp} needs the OpenTelemetry SDK and its OTLP exporter, which are "
                f"not installed ({exc.name}); install them with: pip install 'cellblock[telemetry]', or remove "
                "the telemetry key"
            ) from None
        self._error = api.Status(api.StatusCode.ERROR)
        resource = resources.Resource.create({"service.name": config.service_name})
        self._traces = trace.TracerProvider(resource=resource)
        self._traces.add_span_processor(
            trace_export.BatchSpanProcessor(span_exporter.OTLPSpanExporter(endpoint=f"{config.otlp}/v1/traces"))
        )
        reader = metrics_export.PeriodicExportingMetricReader(
            metric_exporter.OTLPMetricExporter(endpoint=f"{config.otlp}/v1/metrics")
        )
        self._metrics = metrics.MeterProvider(resource=resource, metric_readers=[reader])
        self._tracer = self._traces.get_tracer("cellblock")
        meter = self._metrics.get_meter("cellblock")
        self._calls = meter.create_counter("cellblock.calls", description="calls decided, by server and decision")
        self._refusals = meter.create_counter("cellblock.refusals", description="calls refused, by server and rule")
        self._asks = meter.create_counter("cellblock.asks", description="questions to the user about a call")
        self._restarts = meter.create_counter("cellblock.restarts", description="servers that exited and restart")
        self._durations = meter.create_histogram(
            "mcp.server.operation.duration", unit="s", description="how long a call, read or prompt get took"
        )
        # the questions waiting for an answer, by (server, name): when each was asked, first first
        self._asked: defaultdict[tuple[str, str], deque[int]] = defaultdict(deque)

    def record(self, record: Mapping[str, Any]) -> None:
        event, server = record.get("event"), str(record.get("server", ""))
        at = int(float(record.get("ts", 0)) * 1e9)
        name = str(record.get("tool", ""))
        method = _METHODS.get(str(record.get("kind", "tool")), "tools/call")
        where = {"cellblock.server": server}
        if event == "call":
            decision = str(record.get("decision", ""))
            self._calls.add(1, {**where, "cellblock.decision": decision})
            if decision == "deny":
                rule = str(record.get("rule", ""))
                self._refusals.add(1, {**where, "cellblock.rule": rule})
                span = self._span(method, name, server, at, {"cellblock.rule": rule, "error.type": "refused"})
                span.set_status(self._error)
                span.end(end_time=at)
        elif event == "call_end":
            seconds = max(float(record.get("duration_ms", 0)) / 1000, 0.0)
            failed = {"error.type": "tool_error"} if record.get("is_error") else {}
            span = self._span(method, name, server, at - int(seconds * 1e9), failed)
            if failed:
                span.set_status(self._error)
            span.end(end_time=at)
            attributes = {**where, "mcp.method.name": method, **failed}
            self._durations.record(seconds, attributes | ({"gen_ai.tool.name": name} if method == "tools/call" else {}))
        elif event == "approval_asked":
            self._asks.add(1, where)
            self._asked[(server, name)].append(at)
        elif event in _ANSWERS and self._asked[(server, name)]:
            began = self._asked[(server, name)].popleft()
            answer = {"cellblock.answer": str(event).removeprefix("approval_")}
            span = self._tracer.start_span(f"approval {name}", start_time=began, attributes={**where, **answer})
            span.end(end_time=at)
        elif event == "server_exit":
            self._restarts.add(1, where)

    def close(self) -> None:
        """Send what is held, and stop."""
        self._traces.shutdown()
        self._metrics.shutdown()

    def _span(self, method: str, name: str, server: str, start: int, extra: Mapping[str, str]) -> Any:
        attributes = {"mcp.method.name": method, "cellblock.server": server, **extra}
        if method == "tools/call":
            attributes |= {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name}
        return self._tracer.start_span(f"{method} {name}", start_time=start, attributes=attributes)
