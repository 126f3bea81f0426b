"""`cellblock allow-host SERVER HOST[:PORT]`: a host added to a server's allow_hosts, in the config
and in the running gateways that serve it from that config."""

from __future__ import annotations

import sys

from cellblock.gateway.cli.gateways import pid_of, running
from cellblock.gateway.cli.options import EXIT_FINDING, EXIT_OK
from cellblock.gateway.config.edit import ConfigEditError, allow_host
from cellblock.gateway.config.loading import load_config
from cellblock.gateway.serve.control import ControlError, request
from cellblock.gateway.state import StateWriteError
from cellblock.gateway.terminal import printable

__all__ = ["allow_host_command"]


def allow_host_command(config_path: str | None, server: str, entry: str, *, loopback: bool = False) -> int:
    """Write `entry` into `server`'s allow_hosts (`config/edit.py`), then tell each running gateway
    of that config, whose proxy allows it from its next connection on. Returns the exit code."""
    _, source = load_config(config_path)
    try:
        said = allow_host(source, server, entry, loopback=loopback)
    except (ConfigEditError, StateWriteError) as exc:
        print(f"cellblock: FAIL: {printable(str(exc))}", file=sys.stderr)
        return EXIT_FINDING
    print(f"cellblock: OK: {printable(said)}", file=sys.stderr)
    if "already allows" in said:
        return EXIT_OK
    try:
        paths = running()
    except ControlError as exc:
        print(
            f"cellblock: the running gateways could not be found ({exc}); they apply it at their next start",
            file=sys.stderr,
        )
        return EXIT_OK
    for path in paths:
        message = {"op": "allow_host", "server": server, "entry": entry, "config": str(source.resolve())}
        try:
            reply = request(path, message)
        except ControlError as exc:
            reply = {"ok": False, "error": str(exc)}
        if reply.get("ok") and reply.get("applied"):
            print(f"cellblock: gateway {pid_of(path)} allows it from now on", file=sys.stderr)
        elif not reply.get("ok"):
            why = printable(str(reply.get("error", "refused")))
            print(
                f"cellblock: gateway {pid_of(path)} was not told ({why}): it applies it at its next start",
                file=sys.stderr,
            )
    return EXIT_OK
