"""The one entry a wrapped client keeps (`ENTRY_KEY`: the command that starts `cellblock serve`),
how it is told from the client's other servers, and reading a client's file as it is: what
`cellblock wrap` and `unwrap` share."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from cellblock.gateway.clients.blocks import ClientEntry
from cellblock.gateway.state import default_config_path
from cellblock.policy.errors import CellblockError

__all__ = ["ENTRY_KEY", "WrapError", "gateway_command", "is_cellblock_entry", "project_command", "read_client_file"]

# The key of the one entry a wrapped client keeps.
ENTRY_KEY = "cellblock"


class WrapError(CellblockError):
    """Wrapping or unwrapping cannot go ahead; nothing was changed. The message says why."""


def gateway_command(config: Path) -> tuple[str, list[str]]:
    """The command a client runs to start this Cellblock on `config`, by absolute path: the
    `cellblock` on PATH when it is this one (`uv tool install` and pipx link it into ~/.local/bin;
    that path stays when the tool is reinstalled), else the script beside this Python."""
    script = Path(sys.executable).parent / "cellblock"
    if script.is_file() and os.access(script, os.X_OK):
        found = shutil.which("cellblock")
        if found is not None and os.path.isabs(found) and os.path.realpath(found) == os.path.realpath(script):
            return found, ["serve", "--config", str(config)]
        return str(script), ["serve", "--config", str(config)]
    return sys.executable, ["-m", "cellblock.gateway.cli.main", "serve", "--config", str(config)]


def project_command(config: Path) -> tuple[str, list[str]]:
    """The command a project's file gives everyone who clones it: the `cellblock` on their PATH
    (no path of this machine's), on their own default config unless `config` is another file."""
    args = ["serve"] if config == default_config_path().absolute() else ["serve", "--config", str(config)]
    return "cellblock", args


def is_cellblock_entry(entry: ClientEntry) -> bool:
    """An entry that starts `cellblock serve` (by the script, or the module)."""
    if entry.command is None or "serve" not in entry.args:
        return False
    return Path(entry.command).name == "cellblock" or "cellblock.gateway.cli.main" in entry.args


def read_client_file(path: Path) -> str:
    """The text of a client's file (or its backup, or cellblock.yaml) as it is, line breaks included.

    Raises:
        WrapError: the file is missing or cannot be read.
    """
    try:
        # newline="": a CRLF file must come back as CRLF, byte for byte
        with open(path, encoding="utf-8", newline="") as handle:
            return handle.read()
    except FileNotFoundError:
        raise WrapError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise WrapError(f"{path}: cannot read: {exc}") from None
