"""`cellblock wrap` and `unwrap`: the command line of gateway/clients/wrap.py (`--list`: report.py)."""

from __future__ import annotations

import sys
from pathlib import Path

from cellblock.gateway.cli.options import EXIT_USAGE, optional_config
from cellblock.gateway.clients import wrap as clients
from cellblock.gateway.clients.report import list_clients
from cellblock.gateway.clients.unwrap import unwrap as unwrap_file
from cellblock.gateway.state import default_config_path

__all__ = ["unwrap", "wrap"]


def wrap(path: str | None, config_path: str | None, *, listing: bool, dry_run: bool, install: bool) -> int:
    """`cellblock wrap CLIENT_CONFIG`, or `wrap --list` (`listing`)."""
    if listing:
        return list_clients(Path.home(), Path.cwd())
    if path is None:
        print("cellblock: wrap needs CLIENT_CONFIG (or --list)", file=sys.stderr)
        return EXIT_USAGE
    config = Path(config_path).expanduser() if config_path else default_config_path()
    return clients.wrap(Path(path).expanduser(), config.absolute(), dry_run=dry_run, install=install)


def unwrap(path: str, config_path: str | None) -> int:
    """`cellblock unwrap CLIENT_CONFIG`: the original back, secret values included."""
    config = optional_config(config_path)  # none to go by: only a safe keyring
    allow_insecure = config is not None and config.credentials.allow_insecure
    return unwrap_file(Path(path).expanduser(), allow_insecure=allow_insecure)
