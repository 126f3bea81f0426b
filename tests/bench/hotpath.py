"""Section 7: what a call pays for in the gateway's own code, and what stays off the call.

Timed in this process with `timeit`, on the gateway's real objects: the probe's 40 tools (listed
once from a real probe) as the catalog of 16 and of 50 servers, a `Pipeline` with the benchmark's
policy and a real audit log, a `Locks` with each server's lock on disk.

- On every fast call: the admission (each of `Pipeline.stages` by `Pipeline.decide_now`: route,
  the policy's decision, the decision's audit record), the end's audit record
  (`Pipeline.finished`), and shaping the answer (`exposed_result` and `wire_result`, per
  protocol version).
- Off the call, when a server starts, says `list_changed` or is approved: the lock review of one
  server (`Locks.review`: every item hashed and compared with the lock file), the catalog rebuild
  (`build_catalog`), and the list serialized once per rebuild and protocol version (`Catalog.wire`).
"""

from __future__ import annotations

import logging
import tempfile
import timeit
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import mcp.types as types
import yaml
from mcp_types.version import LATEST_PROTOCOL_VERSION

from cellblock import __version__
from cellblock.gateway.audit.log import Audit
from cellblock.gateway.config.compile import policy_for
from cellblock.gateway.config.loading import parse_config
from cellblock.gateway.config.telemetry import TelemetryConfig
from cellblock.gateway.downstream.listing import Listing
from cellblock.gateway.namespacing import UriTable
from cellblock.gateway.serve.catalog import build_catalog
from cellblock.gateway.serve.locking import Locks
from cellblock.gateway.serve.pipeline import Call, Pipeline
from cellblock.gateway.serve.shaping import exposed_result, wire_result
from cellblock.gateway.serve.telemetry import Telemetry
from cellblock.policy.types import Verdict
from tests.bench.report import Table, fmt, median, say
from tests.bench.spawn import TOOLS, Scratch, connect, direct
from tests.servers.threaded import serving

__all__ = ["hot_path"]

EXTRA_TOOLS = 26  # as in section 6
HANDSHAKE = "2025-11-25"
STAMP = {"name": "cellblock", "version": __version__}


async def _probe_sample(scratch: Scratch) -> tuple[tuple[types.Tool, ...], dict[str, Any]]:
    """The probe's tools (with 26 extra) and one echo result, as a real probe lists and answers them."""
    async with connect(direct("probe", EXTRA_TOOLS), "auto", scratch.log("hotpath-probe")) as client:
        tools = (await client.list_tools()).tools
        result = await client.call_tool("echo", {"message": "hi"})
    if result.is_error:
        raise RuntimeError(f"the probe's echo failed: {result.content}")
    return tuple(tools), result.model_dump(by_alias=True, mode="json", exclude_none=True)


def _config(servers: list[str]) -> Any:
    entries = {name: {"command": "/bin/true", "jail": False, "lock": {"first": "trust"}} for name in servers}
    return parse_config(yaml.safe_dump({"version": 1, "defaults": {"tools": TOOLS}, "servers": entries}))


def _micros(action: Callable[[], object], number: int) -> float:
    return median(timeit.repeat(action, repeat=5, number=number)) / number * 1e6


def _catalog_ms(listings: dict[str, Listing], number: int) -> tuple[float, float]:
    """Milliseconds to rebuild the catalog of `listings`, and to serialize its tools list once."""

    def rebuild() -> Any:
        return build_catalog(listings, separator="__", max_length=64)

    def serialize() -> str:
        return rebuild().wire("tools", LATEST_PROTOCOL_VERSION, STAMP)

    build = _micros(rebuild, number) / 1000
    return build, _micros(serialize, number) / 1000 - build


def hot_path_tables(tools: tuple[types.Tool, ...], echo: dict[str, Any], quick: bool) -> list[Table]:
    number = 2_000 if quick else 20_000
    slow = 3 if quick else 10
    title = "7. What a call pays for, and what stays off it"
    table = Table(
        f"{title} (timeit: median of 5 repeats of {number:,} calls, {slow} rebuilds)", ["work", "when", "µs", "ms"]
    )
    servers = [f"s{i:02d}" for i in range(50)]
    with tempfile.TemporaryDirectory(prefix="cellblock-bench-hotpath-") as tmp:
        state = Path(tmp)
        config = _config(["probe", *servers])
        audit = Audit(state / "audit.jsonl")
        listing = Listing(tools=tools)
        listings = {name: listing for name in servers}
        catalog = build_catalog({"probe": listing}, separator="__", max_length=64)
        policies = {"probe": policy_for(config, "probe")}

        async def never(call: Call) -> Verdict:
            raise AssertionError("the benchmark's echo call is allowed outright")

        pipeline = Pipeline(lambda: catalog, lambda name: None, policies, audit, never)
        call = Call("probe__echo", {"message": "hi"})
        admitted = lambda: all(pipeline.decide_now(call, stage) for stage in pipeline.stages)  # noqa: E731
        if not admitted():
            raise RuntimeError("the benchmark's policy does not allow echo outright")
        admit = _micros(admitted, number)
        end = _micros(lambda: pipeline.finished(call, False, 1.5), number)
        with serving(_Collector) as collector:  # what the exporter sends, accepted and dropped
            observed = Audit(state / "observed.jsonl")
            observed.observe(Telemetry(TelemetryConfig(otlp=collector)))
            watched = Pipeline(lambda: catalog, lambda name: None, policies, observed, never)
            traced = _micros(lambda: watched.finished(call, False, 1.5), number)
            observed.close()  # sends what the telemetry holds while the collector is there
        rows = [
            ("admission: route, policy, the decision's audit record", "every call", admit),
            ("the end's audit record (telemetry off: no more than this)", "every call", end),
            ("the end's audit record, with telemetry on (its span and histogram)", "every call", traced),
        ]
        for version, era in ((HANDSHAKE, "handshake"), (LATEST_PROTOCOL_VERSION, LATEST_PROTOCOL_VERSION)):
            shape = lambda v=version: wire_result("tools/call", v, exposed_result(UriTable(), "probe", echo), STAMP)  # noqa: E731
            rows.append((f"shaping the answer ({era})", "every call", _micros(shape, number)))
        locks = Locks(config=config, state=state, audit=audit)
        locks.review("s00", listing)  # first: trust writes the lock; the timed reviews check against it
        rows.append(
            (
                f"lock review of one server ({len(tools)} tools hashed, its lock read)",
                "start, list_changed, approval",
                _micros(lambda: locks.review("s00", listing), slow * 10),
            )
        )
        # the probe's tools collide with each other by design (files.read, files_read); the
        # gateway says so once per name, which would be 50 lines here
        logging.getLogger("cellblock.gateway.serve.catalog").setLevel(logging.ERROR)
        for count in (16, 50):
            subset = {name: listings[name] for name in servers[:count]}
            build_ms, wire_ms = _catalog_ms(subset, slow)
            size = f"{count} servers x {len(tools)} tools"
            rows.append((f"catalog rebuild, {size}", "start, list_changed, approval", build_ms * 1000))
            rows.append((f"tools/list serialized, {size}", "first list after a rebuild", wire_ms * 1000))
        audit.close()
    for work, when, micros in rows:
        table.add([work, when, fmt(micros), fmt(micros / 1000)], work=work, when=when, us=micros)
    table.notes.append(
        "'every call' rows are the gateway's own work on the fast path besides reading and writing the two pipes; "
        "the others run only when a catalog changes, never per call"
    )
    return [table]


class _Collector(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *_: Any) -> None:
        pass


async def hot_path(scratch: Scratch, quick: bool) -> list[Table]:
    """Section 7: the per-call work and the off-call work, timed in this process."""
    say("hotpath: listing the probe's tools")
    tools, echo = await _probe_sample(scratch)
    return hot_path_tables(tools, echo, quick)
