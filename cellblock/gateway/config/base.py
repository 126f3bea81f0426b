"""What every part of the config shares: its error, its strict model, and path expansion."""

from __future__ import annotations

import os
import re

from pydantic import BaseModel, ConfigDict

from cellblock.policy.errors import CellblockError

__all__ = ["ConfigError", "StrictModel", "expand_keep_tilde", "expand_path"]

_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


class ConfigError(CellblockError):
    """A config file is missing, unreadable or invalid; the message names file, line and key."""


def expand_keep_tilde(value: str) -> str:
    """`${ENV}` expanded, `~` left for the policy to resolve against the user's home."""
    return value if value.startswith("~") and "${" not in value else expand_path(value)


def expand_path(value: str) -> str:
    """Expand `${ENV}` references and a leading `~` in a path-like string.

    Raises:
        ValueError: a referenced environment variable is not set.
    """

    def env(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in os.environ:
            raise ValueError(f"environment variable ${{{name}}} is not set")
        return os.environ[name]

    return os.path.expanduser(_ENV_REF.sub(env, value))


class StrictModel(BaseModel):
    """A config section: unknown keys refused, nothing changed once loaded."""

    model_config = ConfigDict(extra="forbid", frozen=True)
