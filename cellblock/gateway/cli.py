"""`cellblock` command line. Data goes to stdout; diagnostics to stderr prefixed `cellblock:`.

Exit codes: 0 ok, 1 a finding or a refused action, 2 bad usage or config.
"""

from __future__ import annotations

import argparse
import logging
import sys
import warnings
from collections.abc import Sequence

import anyio

from cellblock import __version__
from cellblock.policy.errors import CellblockError

__all__ = ["main"]

EXIT_OK, EXIT_FINDING, EXIT_USAGE = 0, 1, 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cellblock", description="One MCP server in front of all your MCP servers.")
    parser.add_argument("--version", action="version", version=f"cellblock {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve = sub.add_parser("serve", help="run the gateway on stdio (the entry a client starts)")
    serve.add_argument("--config", help="config file (default: $CELLBLOCK_CONFIG or the user config dir)")
    serve.add_argument("-v", "--verbose", action="store_true", help="log debug detail to stderr")
    check = sub.add_parser("check", help="validate a config; exit 2 on an error")
    check.add_argument("--config", help="config file (default: $CELLBLOCK_CONFIG or the user config dir)")
    show = sub.add_parser("show", help="show each server's effective jail: mounts, network, environment")
    show.add_argument("server", nargs="?", help="only this server")
    show.add_argument("--config", help="config file (default: $CELLBLOCK_CONFIG or the user config dir)")
    show.add_argument("--json", action="store_true", help="print JSON")
    diff = sub.add_parser("diff", help="show what a server's held catalog changes; exit 1 if anything is held")
    diff.add_argument("server")
    diff.add_argument("--config", help="config file (default: $CELLBLOCK_CONFIG or the user config dir)")
    approve = sub.add_parser("approve", help="accept a server's held catalog (a running gateway picks it up)")
    approve.add_argument("server")
    approve.add_argument("--config", help="config file (default: $CELLBLOCK_CONFIG or the user config dir)")
    sub.add_parser("doctor", help="check that this machine can build jails; exit 1 on a gap")
    probe = sub.add_parser("probe", help="attack each server's jail from inside; exit 1 if anything got through")
    probe.add_argument("server", nargs="?", help="only this server")
    probe.add_argument("--config", help="config file (default: $CELLBLOCK_CONFIG or the user config dir)")
    probe.add_argument("--json", action="store_true", help="print JSON")
    sub.add_parser("demo", help="run the gateway on built-in demo servers and show what it does")
    audit = sub.add_parser("audit", help="summarise the audit log: calls by decision, lock and egress events")
    audit.add_argument("--since", help="only events newer than this: 30m, 12h, 7d, or an ISO date")
    audit.add_argument("--server", help="only this server")
    audit.add_argument("--json", action="store_true", help="print JSON")
    audit.add_argument("--config", help="config file (default: $CELLBLOCK_CONFIG or the user config dir)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "serve":
            return _serve(args.config, args.verbose)
        if args.command == "check":
            return _check(args.config)
        if args.command == "show":
            return _show(args.config, args.server, args.json)
        if args.command in ("diff", "approve"):
            return _lock_command(args.command, args.config, args.server)
        if args.command == "probe":
            return _probe(args.config, args.server, args.json)
        if args.command == "doctor":
            from cellblock.gateway.doctor import doctor

            return doctor()
        if args.command == "audit":
            from cellblock.gateway.audit_report import audit_path, run

            return run(audit_path(args.config), args.since, args.server, args.json)
        if args.command == "demo":
            from cellblock.gateway.demo import run_demo

            return anyio.run(run_demo)
    except CellblockError as exc:
        for line in str(exc).splitlines():
            print(f"cellblock: {line}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return EXIT_FINDING
    return EXIT_USAGE


def _check(config_path: str | None) -> int:
    from cellblock.gateway.config import load_config
    from cellblock.gateway.policies import lint_config
    from cellblock.gateway.state import state_dir

    config, source = load_config(config_path)
    for name, server in sorted(config.servers.items()):
        kind = f"stdio: {server.command}" if hasattr(server, "command") else f"http: {server.url}"
        print(f"{name}\t{config.start_of(name)}\t{kind}")
    findings = lint_config(config, state_dir())
    for finding in findings:
        print(f"cellblock: lint: {finding}", file=sys.stderr)
    if findings:
        print(f"cellblock: {source}: valid, with {len(findings)} lint finding(s)", file=sys.stderr)
        return EXIT_FINDING
    print(f"cellblock: OK: {source}: {len(config.servers)} server(s)", file=sys.stderr)
    return EXIT_OK


def _show(config_path: str | None, server: str | None, as_json: bool) -> int:
    from cellblock.gateway.config import load_config
    from cellblock.gateway.show import show

    config, _ = load_config(config_path)
    if server is not None and server not in config.servers:
        print(f"cellblock: no server named '{server}' in the config", file=sys.stderr)
        return EXIT_USAGE
    return show(config, server, as_json)


def _lock_command(command: str, config_path: str | None, server: str) -> int:
    from pathlib import Path

    from cellblock.gateway.audit import Audit
    from cellblock.gateway.config import load_config
    from cellblock.gateway.lock_cli import approve_server, diff_server
    from cellblock.gateway.state import state_dir

    config, _ = load_config(config_path)
    if server not in config.servers:
        print(f"cellblock: no server named '{server}' in the config", file=sys.stderr)
        return EXIT_USAGE
    state = state_dir()
    if command == "diff":
        return diff_server(config, state, server)
    audit = Audit(Path(config.audit.path) if config.audit.path else state / "audit.jsonl")
    return approve_server(config, state, audit, server)


def _probe(config_path: str | None, server: str | None, as_json: bool) -> int:
    from cellblock.gateway.config import load_config
    from cellblock.gateway.probe import probe
    from cellblock.gateway.state import runtime_dir, state_dir

    config, source = load_config(config_path)
    if server is not None and server not in config.servers:
        print(f"cellblock: no server named '{server}' in the config", file=sys.stderr)
        return EXIT_USAGE
    return probe(config, source, state_dir(), runtime_dir(), server, as_json)


def _serve(config_path: str | None, verbose: bool) -> int:
    from mcp.shared.exceptions import MCPDeprecationWarning

    from cellblock.gateway.config import load_config
    from cellblock.gateway.server import Gateway
    from cellblock.gateway.state import runtime_dir, state_dir

    # stdout is the protocol channel: every log line goes to stderr, which clients keep as a log
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="cellblock: %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    # the gateway forwards downstream logs on purpose, whatever the 2026 spec thinks of logging
    warnings.filterwarnings("ignore", category=MCPDeprecationWarning)
    for noisy in ("mcp", "httpx2", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.DEBUG if verbose else logging.WARNING)
    config, source = load_config(config_path)
    log = logging.getLogger("cellblock")
    log.info("serving %d server(s) from %s", len(config.servers), source)
    from cellblock.gateway.policies import lint_config

    for finding in lint_config(config, state_dir()):
        log.warning("lint: %s", finding)
    for name, server in sorted(config.servers.items()):
        if getattr(server, "jail", None) is False:
            log.warning("server '%s' runs UNJAILED (jail: false in the config)", name)
    anyio.run(Gateway(config, state_dir(), runtime_dir()).serve_stdio)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
