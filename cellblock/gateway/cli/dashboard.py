"""`cellblock dashboard`: serve the dashboard on 127.0.0.1 and open it in the user's browser."""

from __future__ import annotations

import contextlib
import secrets
import socket
import sys
import threading
import webbrowser

from cellblock.gateway.cli.options import EXIT_OK

__all__ = ["SECRET_BYTES", "dashboard_command"]

# 32 random bytes, as the control token: nobody guesses it in the time the page is up
SECRET_BYTES = 32


def dashboard_command(open_browser: bool, config_path: str | None = None) -> int:
    """Serve until interrupted; the page's address (its secret in the fragment) is opened in the
    browser, or printed alone on stdout with `open_browser` False. The audit log shown is the one
    `cellblock audit` reads with the same `config_path`."""
    import uvicorn  # only the dashboard serves a page

    from cellblock.gateway.audit.chain import KEY_NAME
    from cellblock.gateway.cli.audit import audit_path
    from cellblock.gateway.dashboard.app import create_app
    from cellblock.gateway.dashboard.scans import ScanReports
    from cellblock.gateway.dashboard.timeline import AuditLog
    from cellblock.gateway.dashboard.view import Gateways
    from cellblock.gateway.serve.running import publish_dashboard, withdraw_dashboard
    from cellblock.gateway.state import state_dir

    timeline = AuditLog(audit_path(config_path), state_dir() / KEY_NAME)

    # bound before the app is made: the port is part of the Host and Origin it accepts
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    secret = secrets.token_urlsafe(SECRET_BYTES)
    url = f"http://127.0.0.1:{port}/#secret={secret}"
    app = create_app(port, secret, Gateways(), timeline, ScanReports(state_dir()))
    # no access log: the secret never reaches the server (a fragment), and nothing else needs one
    config = uvicorn.Config(
        app, http="h11", ws="none", lifespan="off", log_level="warning", access_log=False, server_header=False
    )
    print(f"cellblock: the dashboard serves on 127.0.0.1:{port} until interrupted (Ctrl-C)", file=sys.stderr)
    if open_browser:
        # not awaited: some browser commands return only when the browser exits
        threading.Thread(target=webbrowser.open, args=(url,), daemon=True).start()
    else:
        print(url, flush=True)  # the one place the secret is written: the user asked for it
    published = publish_dashboard(port)  # the gateways' approval links point here while it serves
    try:
        with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C is how it is meant to stop
            uvicorn.Server(config).run(sockets=[sock])
    finally:
        if published is not None:
            withdraw_dashboard(published)
    return EXIT_OK
