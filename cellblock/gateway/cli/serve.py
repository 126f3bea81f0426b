"""`cellblock serve`: the gateway a client starts, on stdio; or, with `--http`, a Streamable HTTP server.

On stdio the SDK and the config model load after `Early.begin`, which answers the client's opening
requests as at the last start in the meantime: hence the imports inside `serve`.
"""

from __future__ import annotations

import logging
import sys
import warnings

from cellblock.gateway.cli.options import EXIT_OK, quiet_oauth_logs
from cellblock.gateway.state import config_file, runtime_dir, state_dir
from cellblock.gateway.wire.early import Early

__all__ = ["serve"]


def serve(config_path: str | None, verbose: bool, http: str | None = None) -> int:
    """`cellblock serve`: the gateway on stdio until the client closes it, or on `http` ([HOST:]PORT)
    until SIGINT or SIGTERM."""
    # the client's opening requests are answered as at the last start while the rest loads
    early = Early.begin(config_file(config_path), state_dir()) if http is None else None
    import anyio
    from mcp.shared.exceptions import MCPDeprecationWarning

    from cellblock.gateway.config.loading import load_config
    from cellblock.gateway.config.model import ConfigError
    from cellblock.gateway.credentials import CredentialError
    from cellblock.gateway.serve.gateway import Gateway
    from cellblock.gateway.serve.stdio import serve_stdio

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
    quiet_oauth_logs()
    config, source = load_config(config_path)
    log = logging.getLogger("cellblock")
    log.info("serving %d server(s) from %s", len(config.servers), source)
    from cellblock.gateway.config.compile import lint_config

    for finding in lint_config(config, state_dir()):
        log.warning("lint: %s", finding)
    for name, server in sorted(config.servers.items()):
        if getattr(server, "jail", None) is False:
            log.warning("server '%s' runs UNJAILED (jail: false in the config)%s", name, _marked())
    from cellblock.gateway.scan.shares import ShareGate

    # a path a call names that a jail does not share is asked about, judged by the gate of grants
    gateway = Gateway(config, state_dir(), runtime_dir(), source, early, gate=ShareGate(source))
    if http is None:
        anyio.run(serve_stdio, gateway)
        return EXIT_OK
    from cellblock.gateway.serve.http import http_token, parse_bind, serve_http

    try:
        bind = parse_bind(http)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    try:
        sock = bind.socket()
    except OSError as exc:
        raise ConfigError(f"--http {http}: cannot listen there: {exc.strerror or exc}") from None
    try:
        token = http_token(config, bind, sock.getsockname()[1])  # which servers reach it depends on the port
    except CredentialError:
        sock.close()
        raise
    anyio.run(serve_http, gateway, bind, sock, token)
    return EXIT_OK


def _marked() -> str:
    """What marks an unjailed server's processes for the control socket here (Linux), for the warning."""
    if not sys.platform.startswith("linux"):
        return ""
    from cellblock.sandbox.marks import how_marked

    how = how_marked()
    if how is None:
        return (
            "; this machine gives Cellblock no cgroup or systemd scope to mark its processes in, so the control "
            "socket knows them only by their process tree, which a double fork leaves (see docs/approvals.md)"
        )
    return f"; every gateway's control socket refuses its processes, which run in {how}"
