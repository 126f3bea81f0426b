"""What the commands share: the exit codes, the one `--config` option, loading the config it names,
and the SDK's OAuth logs kept out of their output.

Light on purpose: `cellblock serve` imports this before the SDK or pydantic (the config model is
imported when a config is loaded).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cellblock.gateway.config.model import Config

__all__ = [
    "CONFIG_HELP",
    "EXIT_FINDING",
    "EXIT_OK",
    "EXIT_USAGE",
    "add_config",
    "load",
    "optional_config",
    "quiet_oauth_logs",
]

EXIT_OK, EXIT_FINDING, EXIT_USAGE = 0, 1, 2
CONFIG_HELP = "config file (default: $CELLBLOCK_CONFIG or the user config dir)"


def add_config(parser: argparse.ArgumentParser, text: str = CONFIG_HELP) -> None:
    """Give a command the `--config` option; `text` when it reads the config for less than the usual."""
    parser.add_argument("--config", help=text)


def load(config_path: str | None, server: str | None = None) -> tuple[Config, Path]:
    """The config, checked to have `server` when one is named.

    Raises:
        ConfigError: the config is invalid, or has no such server (exit 2, like any bad usage).
    """
    from cellblock.gateway.config.loading import load_config
    from cellblock.gateway.config.model import ConfigError

    config, source = load_config(config_path)
    if server is not None and server not in config.servers:
        raise ConfigError(f"no server named '{server}' in {source}; see 'cellblock check' for the list")
    return config, source


def optional_config(config_path: str | None, say: bool = True) -> Config | None:
    """The config for commands that can do without one: None (said on stderr when `say`) when
    the default one is missing or invalid.

    Raises:
        ConfigError: a config named on the command line does not load.
    """
    from cellblock.gateway.config.loading import load_config
    from cellblock.gateway.config.model import ConfigError

    try:
        return load_config(config_path)[0]
    except ConfigError as exc:
        if config_path is not None:
            raise
        if say:
            print(f"cellblock: no usable config ({str(exc).splitlines()[0]}); going on without one", file=sys.stderr)
        return None


def quiet_oauth_logs() -> None:
    """The SDK logs each OAuth flow failure with a traceback; a command reports it in one line."""
    logging.getLogger("mcp.client.auth").setLevel(logging.CRITICAL)
