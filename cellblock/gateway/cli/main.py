"""`cellblock` command line: the commands' arguments, and which module runs each.

Data goes to stdout; diagnostics to stderr prefixed `cellblock:`. Exit codes (`cli.options`):
0 ok, 1 a finding or a refused action, 2 bad usage or config. Each command's module is imported
when it runs, so `cellblock serve` starts before the rest of the commands (and the SDK) load.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from cellblock import __version__
from cellblock.gateway.cli.options import EXIT_FINDING, EXIT_USAGE, add_config
from cellblock.gateway.credentials import (
    HTTP_TOKEN_ENTRY,
    CredentialError,
    client_key_entry,
    client_secret_entry,
    id_token_entry,
)
from cellblock.policy.errors import CellblockError

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cellblock", description="One MCP server in front of all your MCP servers.")
    parser.add_argument("--version", action="version", version=f"cellblock {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve = sub.add_parser("serve", help="run the gateway on stdio (the entry a client starts), or on HTTP")
    add_config(serve)
    serve.add_argument("-v", "--verbose", action="store_true", help="log debug detail to stderr")
    serve.add_argument(
        "--http",
        metavar="[HOST:]PORT",
        help="serve Streamable HTTP at /mcp instead (HOST: 127.0.0.1 unless given; any other than loopback "
        "needs the token of `cellblock auth set --http`; see docs/http.md)",
    )
    check = sub.add_parser("check", help="validate a config; exit 2 on an error")
    add_config(check)
    show = sub.add_parser("show", help="show each server's effective jail: mounts, network, environment")
    show.add_argument("server", nargs="?", help="only this server")
    add_config(show)
    show.add_argument("--json", action="store_true", help="print JSON")
    diff = sub.add_parser("diff", help="show what a server's held catalog changes; exit 1 if anything is held")
    diff.add_argument("server", nargs="?")
    diff.add_argument("--all", action="store_true", help="every held catalog")
    add_config(diff)
    approve = sub.add_parser(
        "approve",
        help="allow a pending call (ID), or accept a server's held catalog (SERVER; a running gateway picks it up)",
    )
    approve.add_argument(
        "target", metavar="ID_OR_SERVER", nargs="?", help="a pending call's id (see 'pending'), or a server"
    )
    approve.add_argument("--all", action="store_true", help="every held catalog (read 'cellblock diff --all' first)")
    approve.add_argument(
        "--hash",
        metavar="SHA256",
        help="with SERVER: approve its held catalog only if it is still the one 'cellblock diff SERVER' showed",
    )
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
    add_config(approve)
    review = sub.add_parser(
        "review",
        help="meet the servers no gateway has met yet, then each held catalog: its diff, approve or keep it held",
    )
    add_config(review)
    deny = sub.add_parser("deny", help="refuse a pending call")
    deny.add_argument("id", metavar="ID", help="the pending call's id (see 'pending')")
    pending = sub.add_parser("pending", help="list the calls waiting for approval in every running gateway")
    pending.add_argument("--full", metavar="ID", help="show every argument of this pending call in full")
    pending.add_argument("--json", action="store_true", help="print JSON")
    ps = sub.add_parser("ps", help="list the running gateways, their servers and pending approvals")
    ps.add_argument("--json", action="store_true", help="print JSON")
    dashboard = sub.add_parser(
        "dashboard", help="a page on 127.0.0.1 showing the running gateways and answering their approvals"
    )
    dashboard.add_argument(
        "--no-open", action="store_true", help="print the page's address (its secret included) instead of opening it"
    )
    add_config(dashboard, "the config whose audit log the page shows (as 'cellblock audit'); every gateway is shown")
    revoke = sub.add_parser(
        "revoke", help="forget 'always' and session approvals: SERVER, SERVER:TOOL, or a prompt or resource"
    )
    revoke.add_argument("target", metavar="SERVER[:NAME]")
    revoke.add_argument(
        "--kind",
        choices=("tool", "prompt", "resource"),
        default="tool",
        help="what NAME is: a tool (default), a prompt's name or a resource's URI",
    )
    add_config(revoke)
    allow = sub.add_parser(
        "allow-host", help="let a server reach HOST[:PORT]: added to its allow_hosts, and to the running gateways"
    )
    allow.add_argument("server", metavar="SERVER")
    allow.add_argument(
        "host", metavar="HOST[:PORT]", help="an allow_hosts entry: host:port, host (80 and 443), *.suffix, an IP"
    )
    allow.add_argument(
        "--loopback",
        action="store_true",
        help="allow an address of this machine (127.0.0.1:PORT, [::1]:PORT): a service on it that trusts you",
    )
    add_config(allow)
    share = sub.add_parser(
        "share", help="share PATH with a server (read-write unless --read-only): in its config and running gateways"
    )
    share.add_argument("server", metavar="SERVER")
    share.add_argument("path", metavar="PATH", help="a folder or file; ~ is your home")
    share.add_argument("--read-only", action="store_true", help="share it read-only")
    add_config(share)
    doctor = sub.add_parser("doctor", help="check that this machine can build jails and keep secrets; exit 1 on a gap")
    add_config(doctor)
    probe = sub.add_parser("probe", help="attack each server's jail from inside; exit 1 if anything got through")
    probe.add_argument("server", nargs="?", help="only this server")
    add_config(probe)
    probe.add_argument("--json", action="store_true", help="print JSON")
    scan = sub.add_parser(
        "scan",
        help="run a server jailed under a tracer, call every tool with benign and hostile arguments, and "
        "report what it did against what it declares; exit 1 on a finding (see docs/scan.md)",
    )
    scan.add_argument("server", metavar="SERVER")
    add_config(scan)
    scan.add_argument("--json", action="store_true", help="print JSON")
    scan.add_argument(
        "--fail-on",
        choices=("info", "low", "medium", "high", "never"),
        default="medium",
        help="exit 1 on a finding of this severity or above (default: medium)",
    )
    scan.add_argument(
        "--destructive", action="store_true", help="call destructive tools (delete_*, destructiveHint) too"
    )
    scan.add_argument("--apply", action="store_true", help="write the smallest jail the scan saw work into the config")
    scan.add_argument("--report", metavar="FILE.json", help="also write a confinement report others can reproduce")
    scan.add_argument("--badge", metavar="FILE.svg", help="also write a badge of the report's summary")
    scan.add_argument(
        "--from-learned",
        action="store_true",
        help="start nothing: propose the grants the jail refused, from the traces of learn: true",
    )
    install = sub.add_parser(
        "install", help="install servers' packages (install: in the config) once, in a jail, to run read-only"
    )
    install.add_argument("servers", nargs="*", metavar="SERVER")
    install.add_argument("--all", action="store_true", help="every server with install:")
    add_config(install)
    update = sub.add_parser("update", help="move a server's installed package to another version (default: newest)")
    update.add_argument("server", metavar="SERVER")
    update.add_argument("--to", metavar="VERSION", help="this exact version")
    add_config(update)
    sub.add_parser("demo", help="run the gateway on built-in demo servers and show what it does")
    wrap = sub.add_parser("wrap", help="move a client's MCP servers behind one Cellblock entry (see docs/wrap.md)")
    wrap.add_argument("path", nargs="?", metavar="CLIENT_CONFIG", help="the client's config file")
    wrap.add_argument("--dry-run", action="store_true", help="print what would change, change nothing")
    wrap.add_argument("--list", action="store_true", help="find the known client configs here; say which are wrapped")
    wrap.add_argument(
        "--no-install", action="store_true", help="do not install the servers' packages now (`cellblock install` later)"
    )
    add_config(wrap, "Cellblock's config to add the servers to (default: the usual one)")
    unwrap = sub.add_parser("unwrap", help="put a wrapped client's own servers back, secret values included")
    unwrap.add_argument("path", metavar="CLIENT_CONFIG")
    # what --secrets asked for is what unwrap always does now; kept so that scripts still run
    unwrap.add_argument("--secrets", action="store_true", help=argparse.SUPPRESS)
    add_config(unwrap, "Cellblock's config (only for credentials.allow_insecure)")
    auth = sub.add_parser("auth", help="credentials in the OS keyring: set, login, logout, list")
    auth_sub = auth.add_subparsers(dest="auth_command", required=True, metavar="ACTION")
    auth_set = auth_sub.add_parser("set", help="store a bearer token or secret (read from a hidden prompt or stdin)")
    auth_set.add_argument(
        "name", metavar="NAME", nargs="?", help="a bearer server's name, or an entry named in secrets:"
    )
    auth_set.add_argument(
        "--http", action="store_true", help="instead: the token HTTP clients of `cellblock serve --http` must send"
    )
    auth_set.add_argument(
        "--client-secret",
        action="store_true",
        help="the secret of server NAME's pre-registered OAuth client (auth: {client_id: ...})",
    )
    auth_set.add_argument(
        "--id-token",
        action="store_true",
        help="the identity provider's ID token of server NAME (auth: {grant: identity_assertion})",
    )
    auth_set.add_argument(
        "--private-key",
        nargs="?",
        const="-",
        metavar="FILE",
        help="the private key (PEM) of server NAME's OAuth client (auth: {client_auth: private_key_jwt}), "
        "from FILE or stdin",
    )
    auth_login = auth_sub.add_parser("login", help="OAuth login to a remote server (opens the browser)")
    auth_login.add_argument("name", metavar="SERVER")
    auth_login.add_argument("--no-browser", action="store_true", help="only print the URL to open")
    auth_logout = auth_sub.add_parser("logout", help="remove a server's or entry's credentials from the keyring")
    auth_logout.add_argument("name", metavar="NAME", nargs="?")
    auth_logout.add_argument("--http", action="store_true", help="instead: the token of `cellblock serve --http`")
    auth_sub.add_parser("list", help="which configured credentials are in the keyring (never their values)")
    for action in (auth_set, auth_login, auth_logout, auth_sub.choices["list"]):
        add_config(action)
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
    add_config(audit)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return _run(args)
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


def _run(args: argparse.Namespace) -> int:
    command = args.command
    if command in ("diff", "approve", "install"):  # what argparse cannot say: names or --all, one of them
        named = args.servers if command == "install" else getattr(args, "server", None) or getattr(args, "target", None)
        if args.all == bool(named):
            what = {"diff": "a server", "approve": "a pending call's ID or a server", "install": "servers"}[command]
            print(f"cellblock {command}: name {what}, or pass --all (not both)", file=sys.stderr)
            return EXIT_USAGE
    if command == "approve" and args.all and args.hash is not None:
        print("cellblock approve: --hash binds one server's catalog; name the server, not --all", file=sys.stderr)
        return EXIT_USAGE
    if command == "serve":
        from cellblock.gateway.cli.serve import serve

        return serve(args.config, args.verbose, args.http)
    if command in ("check", "show"):
        from cellblock.gateway.cli.show import check, show_command

        return check(args.config) if command == "check" else show_command(args.config, args.server, args.json)
    if command in ("diff", "review") or (command == "approve" and args.all):
        from cellblock.gateway.cli import lock

        if command == "diff":
            return lock.diff_command(args.config, None if args.all else args.server)
        return lock.review_command(args.config) if command == "review" else lock.approve_command(args.config, None)
    if command in ("approve", "deny", "pending", "revoke"):
        from cellblock.gateway.cli import approvals

        if command == "approve":
            scope = "session" if args.session else "always" if args.always else None
            return approvals.approve(args.config, args.target, scope, args.hash)
        if command == "deny":
            return approvals.deny(args.id)
        if command == "revoke":
            return approvals.revoke(args.config, args.target, args.kind)
        return approvals.pending(args.json) if args.full is None else approvals.pending_full(args.full, args.json)
    if command == "allow-host":
        from cellblock.gateway.cli.grants import allow_host_command

        return allow_host_command(args.config, args.server, args.host, loopback=args.loopback)
    if command == "share":
        from cellblock.gateway.cli.grants import share_command

        return share_command(args.config, args.server, args.path, read_only=args.read_only)
    if command == "ps":
        from cellblock.gateway.cli.gateways import ps

        return ps(args.json)
    if command == "dashboard":
        from cellblock.gateway.cli.dashboard import dashboard_command

        return dashboard_command(open_browser=not args.no_open, config_path=args.config)
    if command == "probe":
        from cellblock.gateway.cli.probe import probe_command

        return probe_command(args.config, args.server, args.json)
    if command == "scan":
        from cellblock.gateway.cli.scan import scan_command

        if args.from_learned:
            from cellblock.gateway.cli.scan import learned_command

            return learned_command(args.config, args.server, args.json, args.apply)
        return scan_command(
            args.config,
            args.server,
            args.json,
            args.fail_on,
            args.destructive,
            args.apply,
            report=args.report,
            badge=args.badge,
        )
    if command == "doctor":
        from cellblock.gateway.cli.doctor import doctor_command

        return doctor_command(args.config)
    if command == "audit":
        from cellblock.gateway.cli.audit import audit_command

        return audit_command(args.config, args.since, args.server, args.json, args.verify)
    if command == "auth":
        from cellblock.gateway.cli.auth import auth_command

        # `auth list` takes no NAME, and only `auth login` opens a browser
        browser = not getattr(args, "no_browser", False)
        name, http = getattr(args, "name", None) or "", getattr(args, "http", False)
        if args.auth_command in ("set", "logout") and http == bool(name):
            print(f"cellblock auth {args.auth_command}: name an entry, or pass --http (not both)", file=sys.stderr)
            return EXIT_USAGE
        key_file = getattr(args, "private_key", None)
        kinds = {"client_secret": client_secret_entry, "id_token": id_token_entry, "private_key": client_key_entry}
        chosen = [entry for flag, entry in kinds.items() if getattr(args, flag, None) not in (None, False)]
        if len(chosen) > 1:
            print("cellblock auth set: one of --client-secret, --id-token, --private-key", file=sys.stderr)
            return EXIT_USAGE
        name = chosen[0](name) if chosen else name
        entry = HTTP_TOKEN_ENTRY if http else name
        return auth_command(args.auth_command, entry, args.config, open_browser=browser, key_file=key_file)
    if command in ("wrap", "unwrap"):
        from cellblock.gateway.cli import wrap

        if command == "unwrap":
            return wrap.unwrap(args.path, args.config)
        return wrap.wrap(args.path, args.config, listing=args.list, dry_run=args.dry_run, install=not args.no_install)
    if command in ("install", "update"):
        from cellblock.gateway.cli.install import install_command, update_command

        if command == "install":
            return install_command(args.servers, args.all, args.config)
        return update_command(args.server, args.to, args.config)
    if command == "demo":
        import anyio

        from cellblock.gateway.cli.demo import run_demo

        return anyio.run(run_demo)
    return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
