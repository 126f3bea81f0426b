"""`cellblock` command line. Data goes to stdout; diagnostics to stderr prefixed `cellblock:`.

Exit codes: 0 ok, 1 a finding or a refused action, 2 bad usage or config.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from cellblock import __version__
from cellblock.gateway.credentials import CredentialError
from cellblock.gateway.terminal import printable
from cellblock.policy.errors import CellblockError
from cellblock.policy.text import visible

if TYPE_CHECKING:
    from cellblock.gateway.config.model import Config

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
    diff.add_argument("server", nargs="?")
    diff.add_argument("--all", action="store_true", help="every held catalog")
    diff.add_argument("--config", help="config file (default: $CELLBLOCK_CONFIG or the user config dir)")
    approve = sub.add_parser(
        "approve",
        help="allow a pending call (ID), or accept a server's held catalog (SERVER; a running gateway picks it up)",
    )
    approve.add_argument(
        "target", metavar="ID_OR_SERVER", nargs="?", help="a pending call's id (see 'pending'), or a server"
    )
    approve.add_argument("--all", action="store_true", help="every held catalog (read 'cellblock diff --all' first)")
    scope = approve.add_mutually_exclusive_group()
    scope.add_argument(
        "--session",
        action="store_true",
        help="allow the whole tool, with any arguments, until the gateway stops (not only this call)",
    )
    scope.add_argument(
        "--always",
        action="store_true",
        help="allow the whole tool, with any arguments, for good (until 'cellblock revoke SERVER:TOOL')",
    )
    approve.add_argument("--config", help="config file (default: $CELLBLOCK_CONFIG or the user config dir)")
    review = sub.add_parser(
        "review",
        help="meet the servers no gateway has met yet, then each held catalog: its diff, approve or keep it held",
    )
    review.add_argument("--config", help="config file (default: $CELLBLOCK_CONFIG or the user config dir)")
    deny = sub.add_parser("deny", help="refuse a pending call")
    deny.add_argument("id", metavar="ID", help="the pending call's id (see 'pending')")
    pending = sub.add_parser("pending", help="list the calls waiting for approval in every running gateway")
    pending.add_argument("--full", metavar="ID", help="show every argument of this pending call in full")
    pending.add_argument("--json", action="store_true", help="print JSON")
    ps = sub.add_parser("ps", help="list the running gateways, their servers and pending approvals")
    ps.add_argument("--json", action="store_true", help="print JSON")
    revoke = sub.add_parser("revoke", help="forget 'always' approvals: SERVER, SERVER:TOOL, or a prompt or resource")
    revoke.add_argument("target", metavar="SERVER[:NAME]")
    revoke.add_argument(
        "--kind",
        choices=("tool", "prompt", "resource"),
        default="tool",
        help="what NAME is: a tool (default), a prompt's name or a resource's URI",
    )
    revoke.add_argument("--config", help="config file (default: $CELLBLOCK_CONFIG or the user config dir)")
    doctor = sub.add_parser("doctor", help="check that this machine can build jails and keep secrets; exit 1 on a gap")
    doctor.add_argument("--config", help="config file (default: $CELLBLOCK_CONFIG or the user config dir)")
    probe = sub.add_parser("probe", help="attack each server's jail from inside; exit 1 if anything got through")
    probe.add_argument("server", nargs="?", help="only this server")
    probe.add_argument("--config", help="config file (default: $CELLBLOCK_CONFIG or the user config dir)")
    probe.add_argument("--json", action="store_true", help="print JSON")
    install = sub.add_parser(
        "install", help="install servers' packages (install: in the config) once, in a jail, to run read-only"
    )
    install.add_argument("servers", nargs="*", metavar="SERVER")
    install.add_argument("--all", action="store_true", help="every server with install:")
    install.add_argument("--config", help="config file (default: $CELLBLOCK_CONFIG or the user config dir)")
    update = sub.add_parser("update", help="move a server's installed package to another version (default: newest)")
    update.add_argument("server", metavar="SERVER")
    update.add_argument("--to", metavar="VERSION", help="this exact version")
    update.add_argument("--config", help="config file (default: $CELLBLOCK_CONFIG or the user config dir)")
    sub.add_parser("demo", help="run the gateway on built-in demo servers and show what it does")
    wrap = sub.add_parser("wrap", help="move a client's MCP servers behind one Cellblock entry (see docs/wrap.md)")
    wrap.add_argument("path", nargs="?", metavar="CLIENT_CONFIG", help="the client's config file")
    wrap.add_argument("--dry-run", action="store_true", help="print what would change, change nothing")
    wrap.add_argument("--list", action="store_true", help="find the known client configs here; say which are wrapped")
    wrap.add_argument(
        "--no-install", action="store_true", help="do not install the servers' packages now (`cellblock install` later)"
    )
    wrap.add_argument("--config", help="Cellblock's config to add the servers to (default: the usual one)")
    unwrap = sub.add_parser("unwrap", help="put a wrapped client's own servers back (from CLIENT_CONFIG.bak)")
    unwrap.add_argument("path", metavar="CLIENT_CONFIG")
    unwrap.add_argument("--secrets", action="store_true", help="put the secret values back too, from the keyring")
    unwrap.add_argument("--config", help="Cellblock's config (only for credentials.allow_insecure)")
    auth = sub.add_parser("auth", help="credentials in the OS keyring: set, login, logout, list")
    auth_sub = auth.add_subparsers(dest="auth_command", required=True, metavar="ACTION")
    auth_set = auth_sub.add_parser("set", help="store a bearer token or secret (read from a hidden prompt or stdin)")
    auth_set.add_argument("name", metavar="NAME", help="a bearer server's name, or an entry named in secrets:")
    auth_login = auth_sub.add_parser("login", help="OAuth login to a remote server (opens the browser)")
    auth_login.add_argument("name", metavar="SERVER")
    auth_login.add_argument("--no-browser", action="store_true", help="only print the URL to open")
    auth_logout = auth_sub.add_parser("logout", help="remove a server's or entry's credentials from the keyring")
    auth_logout.add_argument("name", metavar="NAME")
    auth_sub.add_parser("list", help="which configured credentials are in the keyring (never their values)")
    for action in (auth_set, auth_login, auth_logout, auth_sub.choices["list"]):
        action.add_argument("--config", help="config file (default: $CELLBLOCK_CONFIG or the user config dir)")
    audit = sub.add_parser("audit", help="summarise the audit log: calls by decision, lock and egress events")
    audit.add_argument("--since", help="only events newer than this: 30m, 12h, 7d, or an ISO date")
    audit.add_argument("--server", help="only this server")
    audit.add_argument("--json", action="store_true", help="print JSON")
    audit.add_argument(
        "--verify",
        action="store_true",
        help="check every line's MAC chain instead (through rotation): name the first edited, moved or missing "
        "line; exit 1 if the chain breaks",
    )
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
        if args.command in ("diff", "approve") and args.all == bool(
            getattr(args, "server", None) or getattr(args, "target", None)
        ):
            what = "a server" if args.command == "diff" else "a pending call's ID or a server"
            print(f"cellblock {args.command}: name {what}, or pass --all (not both)", file=sys.stderr)
            return EXIT_USAGE
        if args.command == "diff":
            return _lock_command("diff-all" if args.all else "diff", args.config, args.server)
        if args.command == "approve":
            if args.all:
                return _lock_command("approve-all", args.config, None)
            return _approve(args.config, args.target, "session" if args.session else "always" if args.always else None)
        if args.command == "review":
            return _lock_command("review", args.config, None)
        if args.command == "deny":
            return _answer_pending({"op": "deny", "id": args.id}, f"denied '{printable(args.id)}'")
        if args.command == "pending":
            return _pending(args.json) if args.full is None else _pending_full(args.full, args.json)
        if args.command == "ps":
            return _ps(args.json)
        if args.command == "revoke":
            return _revoke(args.config, args.target, args.kind)
        if args.command == "probe":
            return _probe(args.config, args.server, args.json)
        if args.command == "doctor":
            return _doctor(args.config)
        if args.command == "audit":
            from cellblock.gateway.cli.audit import audit_path, run, verify_log

            if args.verify:
                from cellblock.gateway.audit.chain import KEY_NAME
                from cellblock.gateway.state import state_dir

                return verify_log(audit_path(args.config), state_dir() / KEY_NAME)
            return run(audit_path(args.config), args.since, args.server, args.json)
        if args.command == "auth":
            return _auth(args)
        if args.command == "wrap":
            return _wrap(args)
        if args.command == "unwrap":
            return _unwrap(args)
        if args.command == "install":
            if args.all == bool(args.servers):
                print("cellblock install: name servers, or pass --all (not both)", file=sys.stderr)
                return EXIT_USAGE
            from cellblock.gateway.downstream.packages import install_command

            return install_command(args.servers, args.all, args.config)
        if args.command == "update":
            from cellblock.gateway.downstream.packages import update_command

            return update_command(args.server, args.to, args.config)
        if args.command == "demo":
            from cellblock.gateway.cli.demo import run_demo

            return anyio.run(run_demo)
    except CredentialError as exc:
        # a refused action (no safe keyring, a failed login), not bad usage
        for line in str(exc).splitlines():
            print(f"cellblock: {line}", file=sys.stderr)
        return EXIT_FINDING
    except CellblockError as exc:
        for line in str(exc).splitlines():
            print(f"cellblock: {line}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return EXIT_FINDING
    return EXIT_USAGE


def _check(config_path: str | None) -> int:
    from cellblock.gateway.config.compile import lint_config
    from cellblock.gateway.config.model import LocalServer, load_config
    from cellblock.gateway.state import state_dir

    config, source = load_config(config_path)
    for name, server in sorted(config.servers.items()):
        if isinstance(server, LocalServer):
            package = server.install.package.spec() if server.install else None
            kind = f"stdio: {server.command or ''}" + (f" (installed {package})" if package else "")
        else:
            kind = f"http: {server.url}"
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
    from cellblock.gateway.cli.show import show

    config, source = _load(config_path, server)
    from cellblock.gateway.state import state_dir

    return show(config, server, as_json, state_dir(), source)


def _load(config_path: str | None, server: str | None) -> tuple[Config, Path]:
    """The config, checked to have `server` when one is named.

    Raises:
        ConfigError: the config is invalid, or has no such server (exit 2, like any bad usage).
    """
    from cellblock.gateway.config.model import ConfigError, load_config

    config, source = load_config(config_path)
    if server is not None and server not in config.servers:
        raise ConfigError(f"no server named '{server}' in {source}; see 'cellblock check' for the list")
    return config, source


def _lock_command(command: str, config_path: str | None, server: str | None) -> int:
    from cellblock.gateway.cli import lock as lock_cli
    from cellblock.gateway.state import state_dir

    config, source = _load(config_path, server)
    state = state_dir()
    if command == "diff-all":
        return lock_cli.diff_all(config, state)
    if server is not None and command == "diff":
        return lock_cli.diff_server(config, state, server)
    audit = config.audit_log(state)
    if command == "approve-all":
        return lock_cli.approve_all(config, state, audit)
    if command == "review":
        return lock_cli.review(config, source, state, audit, sys.stdin)
    return lock_cli.approve_server(config, state, audit, server or "")


# -- pending approvals, through the control sockets of the running gateways ----------------------------

_SCOPE_TEXT = {"once": "once", "session": "for this session", "always": "always"}
_TOOL_WIDTH = 80  # a tool name is the server's: bounded in the table, whole in `pending --full`


def _running() -> list[Path]:
    from cellblock.gateway.serve.control import ControlError, gateways
    from cellblock.gateway.state import runtime_dir

    try:
        return gateways(runtime_dir())
    except OSError as exc:
        raise ControlError(f"runtime dir: {exc}") from exc


def _ask_all(message: dict[str, Any]) -> list[tuple[Path, dict[str, Any]]]:
    """Each running gateway's reply to `message`; one that fails to answer is named on stderr."""
    from cellblock.gateway.serve.control import ControlError, request

    replies = []
    for path in _running():
        try:
            replies.append((path, request(path, message)))
        except ControlError as exc:
            print(f"cellblock: {exc}", file=sys.stderr)
    return replies


def _approve(config_path: str | None, target: str, scope: str | None) -> int:
    # approving a pending call needs no config, only a gateway
    config = _optional_config(config_path, say=False)
    servers = set(config.servers) if config is not None else set()
    if target in servers:
        if scope is not None:
            print(
                f"cellblock: --{scope} applies to a pending call's ID; '{target}' is a server, "
                f"whose held catalog is approved as a whole: run 'cellblock approve {target}'",
                file=sys.stderr,
            )
            return EXIT_USAGE
        return _lock_command("approve", config_path, target)
    scope = scope or "once"
    return _answer_pending(
        {"op": "approve", "id": target, "scope": scope}, f"approved '{printable(target)}' {_SCOPE_TEXT[scope]}"
    )


def _answer_pending(message: dict[str, Any], done: str) -> int:
    """Send an approve/deny to each gateway until one holds the id."""
    from cellblock.gateway.serve.control import NOT_FOUND, ControlError, request

    refusals = []
    paths = _running()
    if not paths:
        print("cellblock: no running gateway", file=sys.stderr)
    for path in paths:
        try:
            reply = request(path, message)
        except ControlError as exc:
            print(f"cellblock: {exc}", file=sys.stderr)
            continue
        if reply["ok"]:
            print(f"cellblock: OK: {done}", file=sys.stderr)
            return EXIT_OK
        if reply.get("code") != NOT_FOUND:
            refusals.append(f"{_pid_of(path)}: {printable(str(reply.get('error', 'refused')))}")
    for refusal in refusals:
        print(f"cellblock: gateway {refusal}", file=sys.stderr)
    if not refusals:
        print(f"cellblock: no pending approval '{printable(message['id'])}' (see 'cellblock pending')", file=sys.stderr)
    return EXIT_FINDING


def _pending(as_json: bool) -> int:
    replies = _ask_all({"op": "pending"})
    items = [item for _, reply in replies if reply["ok"] for item in reply.get("pending", []) if isinstance(item, dict)]
    for path, reply in replies:
        if not reply["ok"]:
            print(f"cellblock: gateway {_pid_of(path)}: {printable(str(reply.get('error')))}", file=sys.stderr)
    if as_json:
        print(json.dumps(items, indent=1))
    elif items:
        now = time.time()
        print("id\tserver\ttool\tage\tleft\targuments")
        for item in items:
            waits, expires = item.get("waits_until"), _number(item.get("expires"), now) - now
            # while the call waits, its time is what counts; after, what is left to let its retry through
            left = _duration(_number(waits, now) - now) if waits else f"retry {_duration(expires)}"
            fields = [printable(str(item.get(key, "?"))) for key in ("id", "server")]
            age = _duration(now - _number(item.get("created"), now))
            # the gateway escaped what the model and the server sent; escaping again costs nothing
            arguments = ", ".join(visible(str(line)) for line in item.get("arguments", []))
            tool = printable(str(item.get("tool", "?")))
            kind = str(item.get("kind", "tool"))
            if kind in ("prompt", "resource"):  # a get or a read: "prompt greet", never "prompt:greet"
                tool = f"{kind} {tool.removeprefix(kind + ':')}"
            tool = tool if len(tool) <= _TOOL_WIDTH else f"{tool[:_TOOL_WIDTH]}…"
            print("\t".join([*fields, tool, age, left if expires > 0 else "expired", arguments]))
        for item in items:
            if item.get("cut"):
                ident = printable(str(item.get("id")))
                print(
                    f"cellblock: {ident}: {item['cut']} argument(s) cut above; "
                    f"read every one in full with 'cellblock pending --full {ident}'",
                    file=sys.stderr,
                )
        print(
            "cellblock: allow with 'cellblock approve ID' (--session, --always); refuse with 'cellblock deny ID'",
            file=sys.stderr,
        )
    if not items:
        if not replies:
            print("cellblock: no running gateway", file=sys.stderr)
        print("cellblock: no pending approvals", file=sys.stderr)
    return EXIT_OK


def _pending_full(ident: str, as_json: bool) -> int:
    """One pending call with every argument in full, escaped; exit 1 if no gateway holds it."""
    replies = _ask_all({"op": "pending", "full": ident})
    items = [item for _, reply in replies if reply["ok"] for item in reply.get("pending", []) if isinstance(item, dict)]
    if not items:
        print(f"cellblock: no pending approval '{printable(ident)}' (see 'cellblock pending')", file=sys.stderr)
        return EXIT_FINDING
    item = items[0]
    if as_json:
        print(json.dumps(item, indent=1))
        return EXIT_OK
    print(visible(str(item.get("identity", ""))))
    lines = [visible(str(line)) for line in item.get("arguments", [])]
    print(f"arguments ({len(lines)}), in full, as escaped JSON; only values Cellblock knows are secrets are hidden:")
    print("\n".join(f"  {line}" for line in lines) or "  (no arguments)")
    print(
        f"cellblock: allow this call with 'cellblock approve {printable(ident)}'; --session or --always allow "
        f"the whole tool with any arguments; refuse with 'cellblock deny {printable(ident)}'",
        file=sys.stderr,
    )
    return EXIT_OK


def _ps(as_json: bool) -> int:
    replies = _ask_all({"op": "ps"})
    if as_json:
        listed = [{key: value for key, value in reply.items() if key != "ok"} for _, reply in replies if reply["ok"]]
        print(json.dumps(listed, indent=1))
    for path, reply in replies:
        if not reply["ok"]:
            print(f"cellblock: gateway {_pid_of(path)}: {printable(str(reply.get('error')))}", file=sys.stderr)
        elif not as_json:
            pid, config = reply.get("pid", _pid_of(path)), printable(str(reply.get("config", "?")))
            print(f"gateway {pid}\tconfig {config}\tpending {reply.get('pending', 0)}")
            for server in reply.get("servers", []):
                jail = server.get("jail")
                # jail: false is the one way to run unjailed, and ps must say so plainly
                # a jail's network, which "jail none" would misread as no jail at all
                jail_text = (
                    "UNJAILED" if jail is False else "remote" if jail == "remote" else f"network {printable(str(jail))}"
                )
                name, state = printable(str(server.get("name", "?"))), printable(str(server.get("state", "?")))
                calls = f"{server.get('calls', 0)} calls ({server.get('fast_calls', 0)} on the fast path)"
                print(f"  {name}\t{state}\t{jail_text}\t{server.get('tools', 0)} tools\t{calls}")
                if server.get("last_exit"):
                    print(f"    last stopped: {printable(str(server['last_exit']))}")
    if not replies:
        print("cellblock: no running gateway", file=sys.stderr)
    return EXIT_OK


def _pid_of(path: Path) -> str:
    return path.name.removeprefix("control-").removesuffix(".sock")


def _number(value: Any, default: float) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else default


def _duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def _wrap(args: argparse.Namespace) -> int:
    from cellblock.gateway.clients import wrap
    from cellblock.gateway.config.model import default_config_path

    if args.list:
        return wrap.list_clients(Path.home(), Path.cwd())
    if args.path is None:
        print("cellblock: wrap needs CLIENT_CONFIG (or --list)", file=sys.stderr)
        return EXIT_USAGE
    config = Path(args.config).expanduser() if args.config else default_config_path()
    return wrap.wrap(Path(args.path).expanduser(), config.absolute(), dry_run=args.dry_run, install=not args.no_install)


def _unwrap(args: argparse.Namespace) -> int:
    from cellblock.gateway.clients import wrap

    config = _optional_config(args.config)  # none to go by: only a safe keyring
    allow_insecure = config is not None and config.credentials.allow_insecure
    return wrap.unwrap(Path(args.path).expanduser(), with_secrets=args.secrets, allow_insecure=allow_insecure)


def _doctor(config_path: str | None) -> int:
    from cellblock.gateway.cli.doctor import doctor

    return doctor(_optional_config(config_path))


def _optional_config(config_path: str | None, say: bool = True) -> Config | None:
    """The config for commands that can do without one: None (said on stderr when `say`) when
    the default one is missing or invalid.

    Raises:
        ConfigError: a config named on the command line does not load.
    """
    from cellblock.gateway.config.model import ConfigError, load_config

    try:
        return load_config(config_path)[0]
    except ConfigError as exc:
        if config_path is not None:
            raise
        if say:
            print(f"cellblock: no usable config ({str(exc).splitlines()[0]}); going on without one", file=sys.stderr)
        return None


def _auth(args: argparse.Namespace) -> int:
    from cellblock.gateway.cli import auth as auth_cli

    action = args.auth_command
    config, _ = _load(args.config, args.name if action == "login" else None)

    def notify(server: str) -> None:
        # running gateways start the server again (or reconnect it) so it reads the keyring anew
        for path, reply in _ask_all({"op": "reconnect", "server": server}):
            if reply.get("ok") and reply.get("restarted"):
                print(f"cellblock: gateway {_pid_of(path)} is reconnecting '{server}'", file=sys.stderr)

    if action == "set":
        return auth_cli.auth_set(config, args.name, notify)
    if action == "login":
        return auth_cli.auth_login(config, args.name, notify, open_browser=not args.no_browser)
    if action == "logout":
        return auth_cli.auth_logout(config, args.name, notify)
    return auth_cli.auth_list(config)


def _revoke(config_path: str | None, target: str, kind: str = "tool") -> int:

    from cellblock.gateway.config.model import load_config
    from cellblock.gateway.serve.approvals import Approvals, describe
    from cellblock.gateway.state import state_dir

    config, _ = load_config(config_path)
    server, _, tool = target.partition(":")
    state = state_dir()
    audit = config.audit_log(state)
    gone = Approvals(state, audit, config.approvals.timeout).revoke(server, tool or None, kind)
    if not gone:
        what = f"{kind} {target}" if tool and kind != "tool" else target
        print(f"cellblock: no 'always' approval for {printable(what)}", file=sys.stderr)
        item, sep, name = tool.partition(":")
        if kind == "tool" and sep and item in ("prompt", "resource"):  # the spelling before kinds were kept apart
            hint = f"{server}:{name} --kind {item}"
            print(f"cellblock: for the {item}, run 'cellblock revoke {printable(hint)}'", file=sys.stderr)
        return EXIT_FINDING
    # a running gateway re-reads approvals.json before its next question; no restart needed
    print(f"cellblock: OK: revoked {', '.join(printable(describe(k, t, server)) for k, t in gone)}", file=sys.stderr)
    return EXIT_OK


def _probe(config_path: str | None, server: str | None, as_json: bool) -> int:
    from cellblock.gateway.cli.probe import probe
    from cellblock.gateway.state import runtime_dir, state_dir

    config, source = _load(config_path, server)
    return probe(config, source, state_dir(), runtime_dir(), server, as_json)


def _serve(config_path: str | None, verbose: bool) -> int:
    from cellblock.gateway.state import config_file, runtime_dir, state_dir
    from cellblock.gateway.wire.early import Early

    # the client's opening requests are answered as at the last start while the rest loads
    early = Early.begin(config_file(config_path), state_dir())
    from mcp.shared.exceptions import MCPDeprecationWarning

    from cellblock.gateway.config.model import load_config
    from cellblock.gateway.serve.gateway import Gateway

    # stdout is the protocol channel: every log line goes to stderr, which clients keep as a log
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="cellblock: %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    # the gateway forwards downstream logs on purpose, whatever the 2026 spec thinks of logging
    warnings.filterwarnings("ignore", category=MCPDeprecationWarning)
    for noisy in ("mcp", "httpx2"):
        logging.getLogger(noisy).setLevel(logging.DEBUG if verbose else logging.WARNING)
    # quiet even with -v: these handle credentials, and their debug detail is not ours to vouch for
    for careful in ("httpcore", "keyring"):
        logging.getLogger(careful).setLevel(logging.WARNING)
    # the SDK logs each OAuth flow failure with a traceback; the gateway reports it in one line
    logging.getLogger("mcp.client.auth").setLevel(logging.CRITICAL)
    config, source = load_config(config_path)
    log = logging.getLogger("cellblock")
    log.info("serving %d server(s) from %s", len(config.servers), source)
    from cellblock.gateway.config.compile import lint_config

    for finding in lint_config(config, state_dir()):
        log.warning("lint: %s", finding)
    for name, server in sorted(config.servers.items()):
        if getattr(server, "jail", None) is False:
            log.warning("server '%s' runs UNJAILED (jail: false in the config)", name)
    anyio.run(Gateway(config, state_dir(), runtime_dir(), source, early).serve_stdio)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
