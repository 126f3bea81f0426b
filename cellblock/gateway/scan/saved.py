"""The latest report of each server's scan, kept in the state directory for the dashboard:
`<state>/scans/NAME.json`, the report `--report` writes (`report.py`), replaced whole (0600) after
every scan that ran; a scan that could not run leaves the previous one.

What a report holds comes from the config (the server's command and arguments as written, its
jail) and from what the server did (paths, hosts, a tool's error text). A secret can reach it two
ways: written in the config's arguments (`--api-key KEY`, a token), or handed to the server (its
`env:` values, a `${VAR}` its arguments name) and echoed back by it into a path or an error. Each
such value is replaced by `[redacted]` (`secrets_pattern`), in this copy, in `--report`'s and in what the scan prints.
`secrets:` never reach a scan: it starts the server without them (`scan/run.py`), so a
`${secrets.NAME}` argument is shown as that reference.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from cellblock.gateway.config.argsecrets import secrets_in
from cellblock.gateway.config.model import LocalServer
from cellblock.gateway.config.secretlike import looks_secret
from cellblock.gateway.scrub import pattern_of
from cellblock.gateway.state import atomic_write_text

__all__ = ["MIN_REDACTED", "SCANS", "save_report", "saved_path", "secret_values", "secrets_pattern"]

SCANS = "scans"
# a value shorter than this is found by chance everywhere ("1", "yes"): redacting it would cut the
# report to pieces, and it is no secret anyone guesses at once
MIN_REDACTED = 4
_VARIABLE = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?")


def saved_path(state: Path, name: str) -> Path:
    """Where the latest scan report of `name` is kept (a server's name is `[a-z][a-z0-9-]*`)."""
    return state / SCANS / f"{name}.json"


def _arg_secrets(args: list[str]) -> set[str]:
    """The values in `args` that are secrets, as `wrap` finds them (a token by its shape, a value
    after an option that names a secret, a URL's password, a `Bearer` token), and the value of a
    host variable named there (`${VAR}`)."""
    found = secrets_in(args)
    for arg in args:
        for variable in _VARIABLE.findall(arg):
            value = os.environ.get(variable, "")
            if looks_secret(variable, value):
                found.add(value)
    return found


def secret_values(server: LocalServer, written: list[str]) -> tuple[str, ...]:
    """What must not be in a report of `server`: its `env:` values that look secret, and the
    secrets in its arguments, as loaded (`${VAR}` filled) and as `written` in the config."""
    found = {value for name, value in server.env.items() if looks_secret(name, value)}
    found |= _arg_secrets(list(server.args)) | _arg_secrets(written)
    return tuple(sorted(v for v in found if len(v) >= MIN_REDACTED and not v.startswith("${secrets.")))


def secrets_pattern(report: dict[str, Any], server: LocalServer) -> re.Pattern[str] | None:
    """What finds every secret of `server` (`secret_values`) in `report` or in what a scan prints."""
    written = report.get("server", {}).get("args", [])
    return pattern_of(secret_values(server, [a for a in written if isinstance(a, str)]))


def save_report(state: Path, name: str, report: dict[str, Any]) -> Path:
    """Replace the kept report of `name` with `report`, whole, 0600.

    Raises:
        StateWriteError: it could not be written (the previous one is left as it was).
    """
    path = saved_path(state, name)
    atomic_write_text(path, json.dumps(report, indent=2) + "\n", 0o600)
    return path
