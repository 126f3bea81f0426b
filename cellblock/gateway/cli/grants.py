"""What a server is let reach, written into the config and told to the running gateways of it:
`cellblock allow-host SERVER HOST[:PORT]` (a host in its allow_hosts) and `cellblock share SERVER
PATH [--read-only]` (a path in its jail's read_write or read_only). A refused connection and a
refused path name these commands."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path
from typing import Any

from cellblock.gateway.cli.gateways import pid_of, running
from cellblock.gateway.cli.options import EXIT_FINDING, EXIT_OK
from cellblock.gateway.config.edit import ConfigEditError, allow_host
from cellblock.gateway.config.loading import load_config
from cellblock.gateway.scan.shares import ShareGate
from cellblock.gateway.serve.control import ControlError, request
from cellblock.gateway.state import StateWriteError
from cellblock.gateway.terminal import printable
from cellblock.policy.pathargs import on_disk

__all__ = ["allow_host_command", "share_command"]


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
    if "already allows" not in said:
        _tell({"op": "allow_host", "server": server, "entry": entry}, source, "allows it from now on")
    return EXIT_OK


def share_command(config_path: str | None, server: str, given: str, *, read_only: bool = False) -> int:
    """Write `given` (`~` expanded, made absolute) into `server`'s jail, read-write unless
    `read_only`, after the gate every grant passes (`scan/shares.py`: the writer and the rules of
    an "always" share), then tell each running gateway of that config, which restarts the server
    with it. What does not exist is not made: it says how. Returns the exit code."""
    _, source = load_config(config_path)
    path = os.path.abspath(os.path.expanduser(given))
    mode = "read-only" if read_only else "read-write"
    if on_disk(path) is None:
        quoted = printable(shlex.quote(path))
        print(
            f"cellblock: FAIL: {quoted} does not exist, so there is nothing to share; make it first "
            f"('mkdir -p {quoted}' for a folder, 'touch {quoted}' for a file) and run this again",
            file=sys.stderr,
        )
        return EXIT_FINDING
    try:
        written = ShareGate(source).keep(server, path, not read_only)
    except StateWriteError as exc:
        print(f"cellblock: FAIL: {printable(str(exc))}", file=sys.stderr)
        return EXIT_FINDING
    if not written:
        print(f"cellblock: OK: '{server}' is given {printable(path)} {mode} already", file=sys.stderr)
        return EXIT_OK
    key = "read_only" if read_only else "read_write"
    print(f"cellblock: OK: shared {printable(path)} {mode} with '{server}' (jail.{key} in {source})", file=sys.stderr)
    message = {"op": "share", "server": server, "path": path, "write": not read_only}
    _tell(message, source, f"restarted '{server}' with it")
    return EXIT_OK


def _tell(message: dict[str, Any], source: Path, applied: str) -> None:
    """Send `message` about the config at `source` to each running gateway; say what each did."""
    try:
        paths = running()
    except ControlError as exc:
        print(
            f"cellblock: the running gateways could not be found ({exc}); they apply it at their next start",
            file=sys.stderr,
        )
        return
    for path in paths:
        try:
            reply = request(path, {**message, "config": str(source.resolve())})
        except ControlError as exc:
            told = printable(str(exc))
            print(
                f"cellblock: gateway {pid_of(path)} was not told ({told}): it applies it at its next start",
                file=sys.stderr,
            )
            continue
        if reply.get("ok") and reply.get("applied"):
            print(f"cellblock: gateway {pid_of(path)} {applied}", file=sys.stderr)
        elif not reply.get("ok"):
            # it judged the grant again and refused it: the config has it, its next start judges it again
            why = printable(str(reply.get("error", "refused")))
            print(f"cellblock: gateway {pid_of(path)} refused it for now: {why}", file=sys.stderr)
